"""What a whole command costs, its descendants included: wall seconds, CPU seconds (user + system) and the peak
resident memory of its largest process.

`/usr/bin/time` and `getrusage(RUSAGE_CHILDREN)` miss the work of `attntrace`'s read and `--jobs` workers: they
are children of multiprocessing's fork server, which nobody waits for (it exits on its own after the parent), so
their CPU time is never added to the parent's. Here the command runs under a small Linux subreaper: orphans are
handed to it, it waits for every one of them, and its RUSAGE_CHILDREN then holds the whole tree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SUBREAPER = r"""
import ctypes, json, os, resource, subprocess, sys, time
PR_SET_CHILD_SUBREAPER = 36
ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
start = time.perf_counter()
rc = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
wall = time.perf_counter() - start
while True:  # the orphans: fork server, resource tracker, workers
    try:
        os.wait()
    except ChildProcessError:
        break
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print("@@" + json.dumps({"rc": rc, "wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
                         "peak": usage.ru_maxrss * 1024}), file=sys.stderr)
"""


@dataclass
class Cost:
    wall: float  # seconds, the command alone (not the wait for its orphans)
    cpu: float  # seconds, user + system, of the command and every process it started
    peak: int  # bytes, the largest resident set of any one of them
    ended: str  # "rc N", or that it ran out of time


def as_installed(env: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which Python keeps its compiled bytecode, as an installed package has it: with
    PYTHONDONTWRITEBYTECODE set (as on some CI and sandbox images) every run compiled attntrace's modules again,
    0.15-0.2 s of each process that a user's never pays."""
    return {k: v for k, v in (env if env is not None else os.environ).items() if k != "PYTHONDONTWRITEBYTECODE"}


def whole_tree_cost(argv: list[str], timeout: float = 600.0, cwd: Path | None = None,
                    env: dict[str, str] | None = None) -> Cost:
    if not sys.platform.startswith("linux"):
        raise SystemExit("needs Linux (a child subreaper)")
    process = subprocess.Popen([sys.executable, "-c", SUBREAPER, *argv], stderr=subprocess.PIPE, text=True,
                               cwd=cwd, env=as_installed(env), start_new_session=True)
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return Cost(timeout, float("nan"), 0, f"not finished in {timeout:.0f} s")
    lines = [line for line in err.splitlines() if line.startswith("@@")]
    if not lines:
        return Cost(float("nan"), float("nan"), 0, f"measuring failed: {err.strip()[-300:]}")
    facts = json.loads(lines[-1][2:])
    return Cost(facts["wall"], facts["cpu"], facts["peak"], f"rc {facts['rc']}")
