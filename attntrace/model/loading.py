"""Turn the paths a user gave into analysed traces or one-line errors, keeping their order.

No input can take the others down: an exception becomes that input's error, and a worker process that dies
(the OOM killer, a signal) becomes the error of the trace it was analysing while the rest are reported."""

from __future__ import annotations

import os
import signal
import stat
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

from attntrace import model, read
from attntrace.model.identity import trace_label
from attntrace.read import workers
from attntrace.read.errors import PROFILER_TRACE_SUFFIXES, TraceError

T = TypeVar("T")
SKIPPED = "skipped"  # the kind of an InputError that is a note, not a failure
OUT_OF_MEMORY = ("out of memory while analysing (the worker was killed); raise the memory, use --jobs 1 or split "
                 "the trace")


@dataclass(frozen=True)
class InputError:
    path: str
    kind: str
    message: str

    def line(self) -> str:
        return f"{self.path}: {self.message}"


def display_path(path: str) -> str:
    """A path as reports show it: bytes of the file name that are not UTF-8 (kept by Python as lone
    surrogates, which no encoder accepts) as \\xNN escapes; an empty one as "" (a line must name it)."""
    if not path:
        return '""'
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        pass
    try:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return path.encode("utf-8", "backslashreplace").decode("utf-8")


def load(path: str, options: read.ReadOptions | None = None) -> model.Trace:
    workers.warm_up_for([path], read.CHUNK_BYTES)
    options = options or read.ReadOptions()
    raw = read.read(path, options)
    raw.path = display_path(path)
    trace = model.build(raw)
    trace.label = trace_label(trace.path, tuple(map(display_path, options.roots)), trace.meta.rank)
    return trace


def guarded(path: str, work: Callable[[str], T]) -> T | InputError:
    """Run `work` on one input; any failure becomes a one-line error for that input alone."""
    shown = display_path(path)
    try:
        return work(path)
    except TraceError as exc:
        return InputError(shown, exc.kind, exc.message)
    except MemoryError:
        return InputError(shown, "too-large", "out of memory while reading; raise the memory or split the trace")
    except RecursionError:
        # Not passed over in a directory as other JSON is: it may well be a trace (args nested 10,000 deep).
        return InputError(shown, "unsupported", "JSON nested too deeply for this reader")
    except Exception as exc:  # a bug in attntrace must not hide the other inputs' results
        detail = " ".join(str(exc).split())
        return InputError(shown, "internal", f"internal error ({type(exc).__name__}: {detail}); please report it")


def _call(args: tuple[str, Callable[[str], Any]]) -> Any:
    path, work = args
    return guarded(path, work)


def _pool(processes: int) -> ProcessPoolExecutor:
    # Forked from a warm server (attntrace.read.workers), not from this process: polars' thread pool does not
    # survive a fork, and a spawned worker would import everything again. The memory and cores are shared by
    # the workers there are, not by the --jobs asked for (-j 128 for two traces left each a 128th). The server
    # is started here (when not yet running) so that it dies with this process (workers.warm_up).
    workers.warm_up(threads=max(1, workers.usable_cores() // processes), strict=True)
    return workers.SharingPool(processes, processes, jobs=processes)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Shut a pool down now: on Ctrl-C or a dead worker nobody waits for the traces still in flight."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)


# Small files go to a worker in batches: a sweep's thousands of rank and step traces (1 KB each) cost a task, a
# message each way and a future each, one by one. A file over BATCH_FILE_BYTES is a batch of its own (it is the
# work, and a worker that dies on it must be told from the others).
BATCH_FILE_BYTES = 1 << 20
BATCH_BYTES = 8 << 20  # a batch's files together, at most
BATCH_FILES = 64  # and at most this many: a batch's results come back together, in order
BATCHES_PER_JOB = 4  # at least this many batches for each worker, so that one slow batch does not hold the run
IN_FLIGHT_PER_JOB = 2  # batches sent ahead per worker: the results waiting to be reported in order stay bounded


def _batches(todo: list[str], jobs: int, most: int = BATCH_FILES) -> list[list[str]]:
    """The paths in input order, cut into batches of consecutive small files (at most `most` each)."""
    per_batch = max(1, min(most, len(todo) // (jobs * BATCHES_PER_JOB)))
    batches: list[list[str]] = []
    current: list[str] = []
    held = 0
    for path in todo:
        try:
            size = os.stat(path).st_size
        except (OSError, ValueError):  # a URL, or a file the worker will say it cannot read
            size = BATCH_FILE_BYTES + 1
        if size > BATCH_FILE_BYTES or per_batch == 1:
            if current:
                batches.append(current)
                current, held = [], 0
            batches.append([path])
            continue
        if current and (len(current) >= per_batch or held + size > BATCH_BYTES):
            batches.append(current)
            current, held = [], 0
        current.append(path)
        held += size
    if current:
        batches.append(current)
    return batches


def _call_batch(args: tuple[list[str], Callable[[str], Any]]) -> list[Any]:
    paths, work = args
    return [guarded(path, work) for path in paths]


def _pooled(todo: list[str], work: Callable[[str], T], jobs: int, most: int = BATCH_FILES
            ) -> Iterator[T | InputError]:
    """Results in input order, `jobs` batches at a time (a few ahead, so the results held stay bounded). When a
    worker dies, every batch in flight fails with it; the first unfinished batch is then run again one file per
    task (a file alone in a worker when it kills one again), so that the file that kills its worker is the one
    reported, and the rest go on in a fresh pool."""
    batches = _batches(todo, jobs, most)
    start = 0
    while start < len(batches):
        try:
            with workers.interrupts_ignored():
                pool = _pool(min(jobs, len(batches) - start))
        except (OSError, NotImplementedError):
            # No worker processes here (no /dev/shm, a sandbox): analyse in this process instead.
            yield from (guarded(path, work) for batch in batches[start:] for path in batch)
            return
        broke_at = here_from = None
        finished = False
        in_flight: deque[tuple[int, Future[list[Any]]]] = deque()
        sent = start
        try:
            while True:
                while sent < len(batches) and len(in_flight) < jobs * IN_FLIGHT_PER_JOB:
                    with workers.worker_starts():  # the pool may start a worker here
                        in_flight.append((sent, pool.submit(_call_batch, (batches[sent], work))))
                    sent += 1
                if not in_flight:
                    break
                index, future = in_flight.popleft()
                try:
                    results = future.result()
                except BrokenProcessPool:
                    broke_at = index
                    break
                yield from results
            finished = True
        except BrokenProcessPool:  # broken while a batch was sent: the first one not received failed with it
            broke_at = in_flight[0][0] if in_flight else sent
        except (OSError, EOFError):
            # The fork server gave no worker: it could not fork (a process limit, `ulimit -u`), or it is gone (its
            # socket refused the connection). This was "error: stdout: Connection refused" or "Aborted!" and no
            # report; the batches not yet received are analysed in this process instead.
            here_from = in_flight[0][0] if in_flight else sent
        finally:
            if finished and broke_at is None:
                pool.shutdown(wait=True)
            else:  # a dead worker, Ctrl-C, or a caller that stopped reading
                _stop(pool)
        if here_from is not None:
            yield from (guarded(path, work) for batch in batches[here_from:] for path in batch)
            return
        if broke_at is None:
            return
        broken = batches[broke_at]
        if len(broken) == 1:
            yield _alone(broken[0], work)
        else:
            yield from _pooled(broken, work, jobs, most=1)
        start = broke_at + 1


def _alone(path: str, work: Callable[[str], T]) -> T | InputError:
    """One trace in a worker of its own (the machine to itself): its result, or its error when that worker dies
    too."""
    pool: ProcessPoolExecutor | None = None
    try:
        with workers.interrupts_ignored():
            pool = _pool(1)
        with workers.worker_starts():
            future = pool.submit(_call, (path, work))
            # Kept now: a broken pool may let go of its process list before the error is looked at.
            processes = list((getattr(pool, "_processes", None) or {}).values())
    except (OSError, EOFError, NotImplementedError):  # no worker processes any more: analyse it here
        if pool is not None:
            _stop(pool)
        return guarded(path, work)
    try:
        return future.result()
    except BrokenProcessPool:
        # The pool's own thread reaps its workers: wait for it rather than reap them here too (two readers of
        # a fork-server child's status race, and the loser reads 255).
        pool.shutdown(wait=True, cancel_futures=True)
        return _worker_died(path, processes)
    finally:
        _stop(pool)


def _worker_died(path: str, processes: list[Any]) -> InputError:
    """The error of a trace whose worker died: out of memory when SIGKILL ended it (what the OOM killer sends) or
    when no signal is known, otherwise the signal it ended with (a crash, a kill by hand)."""
    # Only a signal says what happened: a worker's status through the fork server can read 255 when the server
    # lost sight of it, and SIGKILL is what the OOM killer sends. The pool ends the workers left with SIGTERM.
    signals = sorted({-p.exitcode for p in processes if p.exitcode is not None and p.exitcode < 0})
    cause = next((s for s in signals if s not in (signal.SIGKILL, signal.SIGTERM)), None)
    if cause is None or signal.SIGKILL in signals or cause not in signal.valid_signals():
        return InputError(display_path(path), "too-large", OUT_OF_MEMORY)
    return InputError(display_path(path), "worker-died",
                      f"the worker analysing this trace ended by {signal.Signals(cause).name} (not out of memory); "
                      "the other traces were analysed; run it alone with --jobs 1 to see more")


# Runs `work` on every path of a list elsewhere (a cluster), returning one result per path in list order.
Runner = Callable[[list[str], Callable[[str], Any]], list[Any]]


def _openable_elsewhere(path: str) -> bool:
    """Whether a worker process can open this input by its name: a file or a URL, not stdin, a pipe or a
    /dev/fd descriptor (`<(zcat t.json.gz)`), which only this process holds."""
    from attntrace.read.sources import is_url

    if path == "-" or path.startswith(("/dev/fd/", "/proc/self/fd/", "/dev/stdin")):
        return False
    if is_url(path):
        return True
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # the worker reports it, as this process would
        return True


def map_inputs(paths: list[str], work: Callable[[str], T], jobs: int = 1,
               runner: Runner | None = None) -> Iterator[T | InputError]:
    """Apply `work` to every trace found under `paths`, in input order, `jobs` at a time (or by `runner`)."""
    found = list(read.discover(paths))
    todo = [item[0] for item in found if isinstance(item, tuple)]
    if runner is not None:
        done: Iterator[T | InputError] = iter(runner(todo, work))
    elif jobs > 1 and len(todo) > 1 and all(map(_openable_elsewhere, todo)):
        done = _pooled(todo, work, jobs)
    else:
        done = (guarded(p, work) for p in todo)
    # Per directory, pattern or prefix given: how many of its files were reported (traces, or their errors), and
    # which were passed over as other programs' JSON.
    reported: dict[str, int] = {}
    passed_over: dict[str, list[str]] = {}
    try:
        # Results come in input order as each is done, so a caller can show progress.
        for item in found:
            if isinstance(item, TraceError):
                yield InputError(display_path(item.path or ""), item.kind, item.message)
                continue
            _, directory = item
            result = next(done)
            if (directory is not None and isinstance(result, InputError) and result.kind == "not-a-trace"
                    and not result.path.endswith(PROFILER_TRACE_SUFFIXES)):
                # Other JSON beside the traces (run.json, configs) is passed over, not an error.
                passed_over.setdefault(directory, []).append(result.path)
                yield InputError(result.path, SKIPPED, result.message)
            else:
                if directory is not None:
                    reported[directory] = reported.get(directory, 0) + 1
                yield result
        for directory, files in passed_over.items():
            if not reported.get(directory):
                # Nothing but other programs' JSON: a CI gate passed with nothing analysed ("0 trace(s)", exit 0),
                # where an empty directory is an error.
                names = ", ".join(os.path.basename(f) for f in files[:3]) + (", ..." if len(files) > 3 else "")
                yield InputError(display_path(directory), "not-found",
                                 f"no traces in this directory: its {len(files)} JSON file(s) are not traces "
                                 f"({names})")
    finally:
        close = getattr(done, "close", None)
        if close is not None:
            close()

