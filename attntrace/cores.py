"""Which cores and how many polars threads each process of a command-line run uses.

A polars query hands its work to polars' thread pool and waits for it. When the pool's thread runs on another
core, that is two cross-core wake-ups a query, and attntrace runs hundreds of small queries a trace. Measured on
a 2-core machine: a filter of two rows took 0.25 ms with the pool free to run anywhere, and 0.07 ms with its one
thread on the caller's core. So where a process has few cores to itself (ONE_THREAD_CORES), polars runs on one
thread on one core, and the processes of a run (this one, the decoding workers, the --jobs workers) each take
their own share of the cores they started with. With more cores, polars keeps its own pool (not measured).

This module imports nothing of attntrace or polars: the command line calls keep_to_one_core before polars is
loaded (its pool is sized and started then)."""

from __future__ import annotations

import os
import sys

POLARS_THREADS_ENV = "POLARS_MAX_THREADS"
ONE_THREAD_CORES = 2


def cores_now() -> tuple[int, ...]:
    """The cores this thread may run on now."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


# The cores this process could use when it started, before keep_to_one_core: the processes it starts share them.
START_CORES = cores_now()
_chosen_here = False  # whether POLARS_MAX_THREADS was set here, not by the user (whose choice is left alone)


def threads_chosen_here() -> bool:
    return _chosen_here


def polars_threads(cores: int) -> int:
    """The polars threads of a process that has `cores` cores to itself."""
    return 1 if cores <= ONE_THREAD_CORES else cores


def most_polars_threads() -> int:
    """The most polars threads a run accepts: polars starts them all at once, and 4,096 on a 2-core machine did
    not finish a small trace in 30 s (256 took 2.3 s)."""
    return max(256, 4 * (os.cpu_count() or 1))


def _whole_number(value: str) -> bool:
    return value.lstrip("+-").isdecimal() and value.isascii()


def forget_text_threads_setting() -> None:
    """For a command-line run, before polars is loaded: POLARS_MAX_THREADS set to text that is no whole number
    ("auto", "abc") is unset. polars passes over it for its default, with a warning on stderr ("sys:1:
    UserWarning: illegal value", a second line beside the run's one-line errors); unset, the run chooses as it
    does when nothing is set, without the warning."""
    value = os.environ.get(POLARS_THREADS_ENV)
    if value is not None and not _whole_number(value.strip()) and "polars" not in sys.modules:
        del os.environ[POLARS_THREADS_ENV]


def threads_setting_problem() -> str | None:
    """What is wrong with the user's POLARS_MAX_THREADS, for a one-line error before polars is loaded: 0 made
    polars panic at its first query (a Rust backtrace), and a huge count never finished. Text that is not a
    whole number is not for polars at all: see forget_text_threads_setting."""
    value = os.environ.get(POLARS_THREADS_ENV, "").strip()
    if not _whole_number(value):
        return None
    count = int(value)
    if 1 <= count <= most_polars_threads():
        return None
    return (f"{POLARS_THREADS_ENV}={value} is not a number of threads polars can run here (1 to "
            f"{most_polars_threads()}); unset it to let attntrace choose")


def keep_to_one_core() -> None:
    """For a command-line run, before polars is loaded: where this machine has few cores, run polars on one
    thread, and this process on the first core. Does nothing where the user set POLARS_MAX_THREADS, where polars
    is loaded already, or on a system without affinities. Not for a library caller: its process is its own."""
    global _chosen_here
    if POLARS_THREADS_ENV in os.environ or "polars" in sys.modules or not hasattr(os, "sched_setaffinity"):
        return
    if polars_threads(len(START_CORES)) != 1:
        return
    try:
        os.sched_setaffinity(0, START_CORES[:1])
    except OSError:
        return
    os.environ[POLARS_THREADS_ENV] = "1"
    _chosen_here = True
