"""`python -m attntrace` and the `attntrace` console script: Ctrl-C ends the process quietly with 130, the
shell's status for an interrupted command, whether it comes during the imports, the analysis or the exit;
SIGTERM (kill, a CI job's timeout) with 143, SIGHUP (the terminal or SSH session closed) with 129. Either way the
worker processes and the outputs' temporary files go with it."""

import os
import signal
import sys
import time

EXIT_INTERRUPTED = 130
WORKERS_GRACE_S = 2.0  # how long an interrupted run waits for its stopped workers to clean up
TRACE_COMMANDS = ("lint", "summary", "diff")
# Signals whose default action ends the process without clean-up: each ends it through _interrupted instead.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _interrupted(signum: int, frame: object) -> None:
    # Stop the workers first (they ignore SIGINT, and would otherwise print their own errors when their
    # parent is gone, or go on decoding for nobody), then the server that forks them, then leave at once: no
    # "Aborted!", no traceback, no exit-time noise from threads. The resource tracker stays: once this
    # process is gone it unlinks the pool's semaphores (/dev/shm/sem.mp-*), quietly (workers.QUIET_TRACKER).
    # The outputs' temporary files go too: os._exit skips the clean-up of output.replacing().
    # The modules are taken from sys.modules, never imported here: a Ctrl-C while `import multiprocessing` runs
    # finds it half initialised (an ImportError from the handler was a traceback and exit 1). Whatever fails
    # here, the process still leaves with 128 + signum.
    try:
        output = sys.modules.get("attntrace.formats.output")
        if output is not None:
            output.remove_unfinished()
        processes = sys.modules.get("multiprocessing")
        children = getattr(processes, "active_children", list)()
        for child in children:
            child.terminate()
        # A moment for their own handlers (a worker removes the temporary files it was writing): the server's end
        # below kills them at once (they die with it).
        deadline = time.monotonic() + WORKERS_GRACE_S
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()))
        for child in children:  # one still writing after the grace is stopped for good: what it leaves goes below
            if child.is_alive():
                child.kill()
                child.join(WORKERS_GRACE_S)
        if output is not None:  # what stopped workers (a Dask worker has no handler of ours) left beside outputs
            output.remove_left_by_workers()
        forkserver = sys.modules.get("multiprocessing.forkserver")
        server = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
        if server:
            os.kill(server, signal.SIGTERM)
        _remove_pool_directory()
        cluster = sys.modules.get("attntrace.distributed")  # --scheduler local: its workers' scratch folder
        if cluster is not None:
            cluster.remove_scratch()
    except BaseException:  # leaving is all that is left to do
        pass
    os._exit(128 + signum)


def _remove_pool_directory() -> None:
    """multiprocessing's own temporary directory (/tmp/pymp-*, the fork server's socket): removed at a normal exit
    by a finaliser that os._exit skips, so every interrupted run with workers left one behind."""
    process = sys.modules.get("multiprocessing.process")
    current = getattr(process, "current_process", None)
    folder = current()._config.get("tempdir") if current is not None else None
    if not folder:
        return
    for entry in os.scandir(folder):
        os.unlink(entry.path)
    os.rmdir(folder)


def entry() -> None:
    from attntrace.allocator import return_freed_pages_sooner
    from attntrace.cores import forget_text_threads_setting, threads_setting_problem

    if sys.stderr is None:  # started with fd 2 closed (2>&-): its lines go nowhere, as asked; the run goes on
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    forget_text_threads_setting()
    problem = threads_setting_problem()
    if problem:
        sys.stderr.write(f"error: {problem}\n")
        sys.exit(2)

    return_freed_pages_sooner()  # before polars is loaded, here or in the server that forks the workers
    answered = [signal.SIGINT] if signal.getsignal(signal.SIGINT) is signal.default_int_handler else []
    # Not one the caller ignores (nohup ignores SIGHUP, a shell's background job SIGINT).
    answered += [ending for ending in ENDING_SIGNALS if signal.getsignal(ending) == signal.SIG_DFL]
    for signum in answered:  # at once, before the import below
        signal.signal(signum, _interrupted)
    from attntrace import late_signals

    late_signals.answer(answered, _interrupted)  # also while a long polars query holds the main thread
    if len(sys.argv) > 2 and sys.argv[1] in TRACE_COMMANDS:
        from attntrace.cores import keep_to_one_core

        keep_to_one_core()  # before polars is loaded (the next import loads it)
        from attntrace.read import workers
        from attntrace.read.raw import CHUNK_BYTES  # light: no polars

        # The server that forks decoding workers imports polars while this process does (0.3 s each).
        workers.warm_up_for((arg for arg in sys.argv[2:] if not arg.startswith("-")), CHUNK_BYTES)
    from attntrace.cli import main

    try:
        main()
    except SystemExit as done:
        _leave(done)


def _leave(done: SystemExit) -> None:
    """Exit without the interpreter's teardown when nothing else runs: freeing every module's objects (polars'
    most of all) took 0.1 s of a 0.5 s lint. The atexit functions still run, and the output is flushed; with
    another thread or a child process still there, or output that cannot be flushed, exit the usual way."""
    import atexit
    import threading

    from attntrace import late_signals

    code = done.code
    children = "multiprocessing" in sys.modules and sys.modules["multiprocessing"].active_children()
    others = [thread for thread in threading.enumerate()
              if thread is not threading.current_thread() and not late_signals.is_watcher(thread)]
    if not (code is None or isinstance(code, int)) or others or children:
        raise done
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # started with it closed
                stream.flush()
    except (OSError, ValueError):
        raise done from None
    os._exit(code or 0)


if __name__ == "__main__":
    try:
        entry()
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
