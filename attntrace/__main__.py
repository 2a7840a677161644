"""`python -m attntrace` and the `attntrace` console script: Ctrl-C ends the process quietly with 130, the
shell's status for an interrupted command, whether it comes during the imports, the analysis or the exit."""

import contextlib
import os
import signal
import sys

EXIT_INTERRUPTED = 130


def _interrupted(signum: int, frame: object) -> None:
    # Stop the workers first (they ignore SIGINT, and would otherwise print their own errors when their
    # parent is gone), then leave at once: no "Aborted!", no traceback, no exit-time noise from threads.
    if "multiprocessing" in sys.modules:
        import multiprocessing
        from multiprocessing import resource_tracker

        for child in multiprocessing.active_children():
            child.terminate()
        tracker = getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None)
        if tracker:  # it would warn of "leaked" semaphores that the system frees with this process anyway
            with contextlib.suppress(OSError):
                os.kill(tracker, signal.SIGKILL)
    os._exit(EXIT_INTERRUPTED)


def entry() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when SIGINT is ignored
        signal.signal(signal.SIGINT, _interrupted)
    from attntrace.cli import main

    main()


if __name__ == "__main__":
    try:
        entry()
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
