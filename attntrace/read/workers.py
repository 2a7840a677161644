"""Worker processes that start warm: forked from a server that has already imported polars, msgspec and the
decoding, and runs nothing else, so a worker is ready in milliseconds instead of importing for half a second,
and no worker inherits polars' thread pool half-used (as a plain fork of this process would).

Used by `--jobs` (a trace per worker) and by the parallel decode of one large trace (a piece per worker)."""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.context import BaseContext
from pathlib import Path
from types import TracebackType

from attntrace import late_signals
from attntrace.cores import POLARS_THREADS_ENV, START_CORES, cores_now, polars_threads, threads_chosen_here
from attntrace.liveness import hold_folder, remove_abandoned_siblings

# What the server imports before it forks any worker: the decoding and polars (the rest of a --jobs worker's
# imports are light; preloading them too delayed the first decoding worker by 0.3 s).
PRELOAD = ["attntrace.model.tables"]
CONCURRENT_JOBS = 1  # traces analysed at once on this machine (set in each worker of a --jobs pool)
# Processes, this one included, that decode one big trace's pieces: unset or 0 for one per usable core (shared
# among the --jobs), 1 for this process alone.
WORKERS_ENV = "ATTNTRACE_READ_WORKERS"
PARALLEL_MIN_PIECES = 3  # below this, worker processes cost more than they save
_lock = threading.Lock()
_context: BaseContext | None = None
# The pid of the process that starts the fork server, given to the server in its environment: the server dies
# with that process (below), and the workers it forks die with the server (die_with_parent).
SPAWNER_ENV = "ATTNTRACE_SERVER_SPAWNER"
SPAWNER_TEMPDIR_ENV = "ATTNTRACE_SERVER_TEMPDIR"  # and multiprocessing's folder of that process
# How long a server told of its parent's end waits to see itself orphaned: the parent's pipe closes as its exit
# begins, and it is orphaned once the exit has freed the parent's memory (175 ms for a parent of 2,000 traces here;
# past 0.5 s, under load, the folder was left in about one kill in ten).
ORPHANED_WITHIN_S = 30.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def usable_cores() -> int:
    return len(START_CORES)


def take_share_of_cores(slot: int, processes: int) -> None:
    """Keep this worker, the `slot`-th of `processes` processes beside each other, on its own share of
    START_CORES, before polars starts its threads (they inherit it). With fewer cores than processes, or where
    the affinity cannot be set, the worker runs where the system puts it."""
    share = len(START_CORES) // max(1, processes)
    if share < 1:
        return
    first = (slot % processes) * share
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setaffinity(0, START_CORES[first:first + share])


class SharingPool(ProcessPoolExecutor):
    """A pool of `workers` processes that, after the `first_slot` processes already working (this one, when it
    decodes beside them), make `processes` in all: each worker takes its slot's share of the cores as it starts.
    Each worker analyses `jobs` traces at once with the others. The slot is given with the worker's
    initializer's arguments as the worker is started (a shared counter's semaphore could be gone before a late
    worker opened it)."""

    def __init__(self, workers: int, processes: int, first_slot: int = 0, jobs: int = 1) -> None:
        self._next_slot = first_slot
        # Slots are given in _spawn_process (CPython's, 3.9 and later); without it the workers are not kept.
        sharing = processes if hasattr(ProcessPoolExecutor, "_spawn_process") else 0
        super().__init__(max_workers=workers, mp_context=context(), initializer=start_worker,
                         initargs=(first_slot, sharing, jobs))

    def _spawn_process(self) -> None:
        _, processes, jobs = self._initargs
        self._initargs = (self._next_slot, processes, jobs)
        self._next_slot += 1
        with start_method_kept():
            super()._spawn_process()  # type: ignore[misc]


@contextlib.contextmanager
def start_method_kept() -> Iterator[None]:
    """multiprocessing's default start method left as it was found: starting a process reads it (the standard
    library's spawn.get_preparation_data), which fixes it, and a caller's own set_start_method() after an
    api.lint(jobs=2) raised "context has already been set"."""
    unset = multiprocessing.get_start_method(allow_none=True) is None
    try:
        yield
    finally:
        if unset:
            multiprocessing.set_start_method(None, force=True)  # the documented way back to "not chosen"


def start_worker(slot: int, processes: int, jobs: int) -> None:
    """A worker's initializer: Ctrl-C is left to the parent (ignore_interrupts), and the worker keeps to its slot's
    share of the cores."""
    global CONCURRENT_JOBS
    ignore_interrupts()
    CONCURRENT_JOBS = jobs
    if processes:
        take_share_of_cores(slot, processes)


def read_processes() -> int:
    """How many processes, this one included, may decode one big trace (before its pieces are known)."""
    try:
        asked = int(os.environ.get(WORKERS_ENV) or 0)
    except ValueError:
        asked = 0
    if asked <= 0:
        asked = usable_cores() // max(1, CONCURRENT_JOBS)
    return max(1, asked) if _main_is_guarded() and not _daemonic() else 1


def _daemonic() -> bool:
    """Whether this process is a daemonic worker (a Dask worker, a multiprocessing pool's worker): such a process
    may not start children, so it decodes alone."""
    return "multiprocessing" in sys.modules and bool(sys.modules["multiprocessing"].current_process().daemon)


def read_workers(pieces: int) -> int:
    """How many processes, this one included, decode a trace of `pieces` pieces."""
    return 1 if pieces < PARALLEL_MIN_PIECES else min(read_processes(), pieces)


def _main_is_guarded() -> bool:
    """Whether a worker may start: it imports the program's main module again (as every multiprocessing start
    method but fork does), which is harmless only when that module runs nothing on import: `python -m pkg`,
    a console script, an interactive session, or a script with an `if __name__ == "__main__":` guard."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        return bool(spec.name.endswith(".__main__") or spec.name == "__main__")
    path = getattr(main, "__file__", None)
    if path is None:
        return True
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return False
    return bool(re.search(r"""__name__\s*==\s*['"]__main__['"]""", text))


QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"


def context() -> BaseContext:
    """The forkserver context where this platform has one, else spawn (each worker then imports on its own)."""
    global _context
    with _lock:
        if _context is None:
            # The resource tracker (a process of its own, started with this interpreter's -W options) unlinks the
            # pools' semaphores left when a run ends while they are still held (Ctrl-C, a worker that died, an
            # exit while a pool winds down); its warning about them is not the user's business, and would break
            # the one line an error gets on stderr.
            start_quiet_tracker()
            if "forkserver" in multiprocessing.get_all_start_methods():
                _context = multiprocessing.get_context("forkserver")
                _context.set_forkserver_preload(PRELOAD)
            else:
                _context = multiprocessing.get_context("spawn")
        return _context


def start_quiet_tracker() -> None:
    """Start the resource tracker now, with the -W option that quiets it; the option is taken back once it runs,
    so that the caller's sys.warnoptions (which a library user's own processes start with) are as they were."""
    from multiprocessing import resource_tracker

    added = QUIET_TRACKER not in sys.warnoptions
    if added:
        sys.warnoptions.append(QUIET_TRACKER)
    try:
        with start_method_kept(), contextlib.suppress(OSError, ValueError):
            resource_tracker.ensure_running()  # a failure here is the pool's to report, as before
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.warnoptions.remove(QUIET_TRACKER)


# Signals the whole process group gets (Ctrl-C, a closed terminal): the parent answers them for all, stopping its
# workers itself (attntrace.__main__), so that no worker dies half way through writing an output.
GROUP_SIGNALS = (signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def interrupts_ignored() -> Iterator[None]:
    """Start processes with SIGINT and SIGHUP ignored, a disposition they keep through exec and fork, so that a
    Ctrl-C while one starts cannot print its traceback; this process answers them for all. (A blocked mask is not
    enough: a spawned interpreter gets the signal.) A Ctrl-C in these few milliseconds is lost; any later one
    stops the run. Only the main thread may set handlers; elsewhere this does nothing."""
    try:
        previous = {number: signal.signal(number, signal.SIG_IGN) for number in GROUP_SIGNALS}
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def worker_starts() -> Iterator[None]:
    """Around a call that may start a worker (a pool's submit). A worker forked by the fork server (which its pool
    started with SIGINT and SIGHUP ignored: the workers inherit that) needs nothing held, and nothing is: its start
    waits for the server's imports, up to a second on a busy machine, and a Ctrl-C in that wait was lost (the run
    went on to its end). A spawned worker is a fresh interpreter, started with them ignored (interrupts_ignored)."""
    if context().get_start_method() == "forkserver":
        yield
        return
    with interrupts_ignored():
        yield


def ignore_interrupts() -> None:
    """A worker's initializer: Ctrl-C and a hang-up reach the whole process group; the parent answers them. The
    worker also dies with its parent (die_with_parent), and leaves on SIGTERM (the parent stopping its pool)
    without the temporary files of the outputs it was writing (_leave_on_sigterm)."""
    for number in GROUP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    late_signals.answer([signal.SIGTERM], _leave_on_sigterm)  # also while a long polars query runs
    die_with_parent()


def _leave_on_sigterm(signum: int, frame: object) -> None:
    # A worker writes --annotate's copies: killed by the default action, its .tmp file stayed beside the output.
    # The output module is looked up, not imported (it is of a later stage, and only loaded where it writes).
    output = sys.modules.get("attntrace.formats.output")
    remove = getattr(output, "remove_unfinished", None)
    if remove is not None:
        remove()
    os._exit(128 + signum)


def _kill_me_when_parent_dies(signum: int) -> bool:
    """Ask Linux to send this process `signum` when its parent ends (PR_SET_PDEATHSIG); False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def die_with_parent() -> None:
    """A worker process ends when its parent does, however the parent ends (SIGKILL, the OOM killer): a worker
    holds both ends of its own task pipe, so it never sees the parent go, and went on decoding gigabytes for
    nobody. Its parent is the fork server (or, with spawn, the process that asked for it). A parent gone before
    this ran is seen by its pid: the worker leaves at once. The signal is SIGTERM, which the worker answers by
    removing the temporary files of the outputs it was writing (_leave_on_sigterm): with SIGKILL, an --annotate
    copy half written stayed beside the outputs at every kill of the parent."""
    if _kill_me_when_parent_dies(signal.SIGTERM) and _server_pid is not None and os.getppid() != _server_pid:
        os._exit(1)


def _die_with_spawner() -> None:
    """Run on import: in the fork server (whose parent named itself in SPAWNER_ENV), end it with that parent;
    its workers then end with it. Anywhere else this does nothing. (Linux ends it with the *thread* that started
    it: the CLI's main thread; a library caller whose thread ends loses the server, which multiprocessing then
    starts again for the next pool.)"""
    global _server_pid
    spawner = os.environ.get(SPAWNER_ENV)
    if spawner is None:
        return
    if spawner != str(os.getppid()):
        # The parent went while this server still started (importing polars, up to a second on a busy machine): a
        # SIGKILL then left the server, a worker it forked and the resource tracker running, with the parent's
        # stdout held open (a caller waiting for it hung).
        _leave_orphaned()
    sys.excepthook = _server_error_in_one_line
    _keep_the_callers_script_out()
    _server_pid = os.getpid()  # what a worker forked from here sees as its parent
    signal.signal(signal.SIGTERM, _leave_with_the_parent)
    atexit.register(_remove_the_folder_of_a_dead_parent)
    if not _kill_me_when_parent_dies(signal.SIGTERM):
        _server_pid = None
    elif os.environ.get(SPAWNER_ENV) != str(os.getppid()):  # the parent went before the request was made
        _leave_orphaned()


def _keep_the_callers_script_out() -> None:
    """In the fork server: its workers do not run the caller's main module, as multiprocessing has each worker do
    to find what the module defines. They run attntrace's functions alone. A script that called attntrace.lint(...,
    jobs=2) at its top level, without `if __name__ == "__main__":`, ran that call again in every worker: each
    died of it, and every trace was reported as "out of memory (the worker was killed)"."""
    from multiprocessing import spawn

    for name in ("_fixup_main_from_path", "_fixup_main_from_name"):
        if hasattr(spawn, name):
            setattr(spawn, name, _not_imported)


def _not_imported(main: str) -> None:
    """The caller's main module (its path or its name), which a worker does not import."""


def _leave_orphaned() -> None:
    """The fork server's end when its parent went while it started: the parent's folder (/tmp/pymp-*, made before
    the server started) is removed too, as at the end of a server whose parent was killed later (about one kill
    in five left it)."""
    folder = os.environ.get(SPAWNER_TEMPDIR_ENV)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
    os._exit(1)


def _leave_with_the_parent(signum: int, frame: object) -> None:
    """The fork server's SIGTERM: its parent is gone (PR_SET_PDEATHSIG), or stops it. A process forked from here
    that gets it before its own handler is set leaves as by the default action."""
    _remove_the_folder_of_a_dead_parent()
    os._exit(128 + signum)


def _remove_the_folder_of_a_dead_parent() -> None:
    """In the fork server, at its end: a parent gone for good (a SIGKILL) left multiprocessing's folder of it
    (/tmp/pymp-*, this server's socket), which its own exit removes; removed here. The server ends by the signal
    above or, as often, first by multiprocessing's own way (the parent's end of a pipe closed) through atexit."""
    folder = os.environ.get(SPAWNER_TEMPDIR_ENV)
    if os.getpid() != _server_pid or not folder:
        return
    # Until the parent's exit has ended. A parent that exits the usual way has removed the folder before its pipe
    # closed: nothing to wait for then.
    deadline = time.monotonic() + ORPHANED_WITHIN_S
    while os.environ.get(SPAWNER_ENV) == str(os.getppid()) and os.path.isdir(folder) and time.monotonic() < deadline:
        time.sleep(0.005)
    if os.environ.get(SPAWNER_ENV) != str(os.getppid()):
        shutil.rmtree(folder, ignore_errors=True)


def _server_error_in_one_line(kind: type[BaseException], error: BaseException, trace: TracebackType | None
                              ) -> None:
    """The fork server's end by an error, in one line (the parent goes on in its own process): a fork refused by a
    process limit (`ulimit -u`) was multiprocessing's traceback on the user's terminal."""
    sys.stderr.write(f"attntrace: the worker server stopped ({kind.__name__}: {error}); the traces are analysed "
                     "in the main process\n")


_server_pid: int | None = None
_die_with_spawner()


def warm_up_for(paths: Iterable[str], piece_bytes: int) -> None:
    """Start the server when one of these files looks bigger than one piece of `piece_bytes` (the read layer's
    CHUNK_BYTES, given by the caller: this module is below the reader), so that its imports overlap this
    process's own (the CLI calls it before it imports polars). A gzip file is guessed at ten times its size; a
    path that is not a file is passed over."""
    for path in paths:
        try:
            size = os.stat(path).st_size * (10 if path.endswith(".gz") else 1)
        except (OSError, ValueError):
            continue
        if size > piece_bytes and read_workers(PARALLEL_MIN_PIECES) > 1:
            warm_up()
            return


# multiprocessing's folder (/tmp/pymp-*) of a run killed with all its processes (SIGKILL of the group: `timeout -s
# KILL`, the OOM killer) stays: nothing of the run is left to remove it. The folder that attntrace made holds an
# owner file that its process (and the server and workers it forks) hold while they run (liveness.hold); the next
# run that starts a server removes the folders whose owner file no one holds.
_owner_fd: int | None = None  # kept open for the process's life: the hold ends with it
_own_folder: dict[int, str | None] = {}  # by process: its multiprocessing folder, where attntrace made it


def own_temp_dir() -> str | None:
    """This process's multiprocessing folder where attntrace made it (its first ask in this process), else None:
    a folder inherited through fork (a forked child's api.lint(jobs=2) removed its parent's live folder at its
    end) or made before by the caller's own multiprocessing is not attntrace's to mark or remove."""
    from multiprocessing import process, util

    pid = os.getpid()
    if pid not in _own_folder:
        made_before = getattr(process.current_process(), "_config", {}).get("tempdir")
        folder = util.get_temp_dir()
        _own_folder[pid] = None if made_before else folder
    return _own_folder[pid]


def mark_temp_dir() -> None:
    """For processes that others start (a Dask local cluster's): hold this process's multiprocessing folder where
    attntrace made it, and remove the ones beside it that killed runs left (no one holds their owner file)."""
    with contextlib.suppress(OSError):
        folder = own_temp_dir()
        if folder is not None:
            _sweep_and_mark(folder)


def _sweep_and_mark(folder: str) -> None:
    """Once: hold the owner file of `folder` (this process's own multiprocessing folder), and remove the folders
    beside it whose owner file no one holds."""
    global _owner_fd
    if _owner_fd is not None:
        return
    try:
        _owner_fd = hold_folder(folder)
    except OSError:
        return
    remove_abandoned_siblings(folder, "pymp-")


def warm_up(threads: int = 1, strict: bool = False) -> None:
    """Start the server now, so its imports overlap this process's own work (reading the file); harmless when
    it is running already or cannot start (the pool that needs it then says so). threads: the polars threads of
    each process it forks, unless the user set POLARS_MAX_THREADS (its workers run beside each other and this
    process, and share the cores: a pool of every core in each made their threads preempt each other, and a
    small trace's few hundred queries cost a quarter more CPU on 2 cores). polars sizes its pool when imported,
    in the server, so the first caller's figure stays. strict: raise OSError when the server cannot start (a
    TMPDIR too long for its socket's path), for a caller that then works in this process instead."""
    ctx = context()
    if ctx.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    server_env = {SPAWNER_ENV: str(os.getpid())}
    try:
        folder = own_temp_dir()  # made now, or by ensure_running below
    except OSError:
        if strict:
            raise
        return
    if folder is not None:  # the server removes it when this process is killed, and only then
        server_env[SPAWNER_TEMPDIR_ENV] = folder
        _sweep_and_mark(folder)
    if POLARS_THREADS_ENV not in os.environ or threads_chosen_here():
        server_env[POLARS_THREADS_ENV] = str(polars_threads(max(1, threads)))
    with interrupts_ignored(), _environment(server_env), _on_start_cores(), start_method_kept():
        if strict:
            forkserver.ensure_running()
            return
        with contextlib.suppress(OSError, ValueError):
            forkserver.ensure_running()


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """These variables in the environment of a fork server started now (and only then: they go after): this
    process's pid, so that the server ends with it (_die_with_spawner), and its workers' polars threads."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _on_start_cores() -> Iterator[None]:
    """This thread on all of START_CORES meanwhile: a process started now inherits the starting thread's cores,
    and the server's workers take their shares of them."""
    if not hasattr(os, "sched_setaffinity") or cores_now() == START_CORES:
        yield
        return
    kept = cores_now()
    try:
        os.sched_setaffinity(0, START_CORES)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, kept)


def return_freed_memory() -> None:
    """Give back to the system what the pool's threads freed: glibc keeps each thread's freed blocks in that
    thread's arena, where the workers' results were received."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
