"""Signals answered while the main thread is inside native code.

Python runs a signal handler in the main thread, between two bytecodes. A long polars query, a regex over
megabytes of NVTX text, runs in Rust with the GIL released and does not come back to Python for minutes: a
SIGTERM (a CI job's timeout) or a Ctrl-C then waited for it (13 minutes, once, on a 3.3 GB Nsight export). So the
signals a process answers are also written to a pipe (signal.set_wakeup_fd), which a thread of its own watches:
when the main thread has not acted on one within GRACE_S, the thread runs the same handler. The handlers end the
process (os._exit), and only one of the two runs at a time.

This module imports nothing of attntrace or polars: the command line and the workers set it up first."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable

Handler = Callable[[int, object], None]

GRACE_S = 1.0  # how long the main thread has to answer a signal itself (Python code answers it in microseconds)
WATCHER_NAME = "attntrace-signals"

# Held by whichever thread runs a handler: the process ends in it. Reentrant: a second signal while the main thread
# runs the handler runs it again inside (the first cannot go on until it returns), as without this module.
_ending = threading.RLock()
_handlers: dict[int, Handler] = {}


def answer(signums: Iterable[int], handler: Handler) -> None:
    """Answer these signals with `handler` (which ends the process), in the main thread or, when that is held in
    native code, in the watching thread. Only the main thread may call this; elsewhere it raises ValueError."""
    once = _one_at_a_time(handler)
    for signum in signums:
        signal.signal(signum, once)
        _handlers[signum] = once
    _start_watching()


def is_watcher(thread: threading.Thread) -> bool:
    """Whether this thread is the one watching for signals (a daemon that never holds up the exit)."""
    return thread.name == WATCHER_NAME


def _one_at_a_time(handler: Handler) -> Handler:
    def run(signum: int, frame: object) -> None:
        if not _ending.acquire(blocking=False):
            # The other thread is ending the process now: wait for it here rather than end it twice.
            while True:
                time.sleep(60)
        handler(signum, frame)

    return run


def _start_watching() -> None:
    if any(is_watcher(thread) for thread in threading.enumerate()):
        return
    read_end, write_end = os.pipe()  # neither end is inherited by the processes this one starts
    os.set_blocking(write_end, False)
    try:
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        os.close(read_end)
        os.close(write_end)
        raise
    threading.Thread(target=_watch, args=(read_end,), name=WATCHER_NAME, daemon=True).start()


def _watch(read_end: int) -> None:
    while True:
        try:
            received = os.read(read_end, 64)
        except OSError:
            return
        if not received:
            return
        for signum in received:
            handler = _handlers.get(signum)
            if handler is None or signal.getsignal(signum) is not handler:  # not one of ours, or no longer
                continue
            time.sleep(GRACE_S)  # the main thread's own answer ends the process within this when it runs Python
            handler(signum, None)
