"""What `with_stack` costs a call made from a long straight-line function, as Inductor's generated wrapper is (one
statement per kernel launch and buffer), against the same calls from a short function: the evidence for the
replay's inductor_wrapper_* costs (attntrace/profiler_cost.toml). CPU only, no GPU needed.

    python tools/wrapper_stack_cost.py [STATEMENTS ...]   (default 10 100 400 1000 1500)

Prints, per function length, the wall time per call without the profiler, with record_shapes, and with
record_shapes and with_stack, and the cost with_stack adds per call.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def straight_line(statements: int) -> Callable[[list[int]], int]:
    """A function of `statements` lines, each a C call on a local of its own (as `buf12 = empty_strided(...)`)."""
    lines = ["def wrapper(x):"]
    lines += [f"    v{i} = len(x)" for i in range(statements)]
    lines.append("    return 0")
    namespace: dict[str, object] = {}
    exec("\n".join(lines), namespace)  # generated code, as Inductor's is
    return namespace["wrapper"]  # type: ignore[return-value]


def per_call(function: Callable[[list[int]], int], statements: int, repeats: int = 7) -> float:
    """Best of `repeats` runs, microseconds per statement's call."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function([1])
        best = min(best, time.perf_counter() - started)
    return best / statements * 1e6


def main(argv: list[str]) -> int:
    lengths = [int(a) for a in argv] or [10, 100, 400, 1000, 1500]
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}")
    print(f"{'statements':>10} {'plain us':>9} {'shapes us':>9} {'stack us':>9} {'stack adds':>10}")
    for n in lengths:
        function = straight_line(n)
        plain = per_call(function, n)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            shapes = per_call(function, n)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True):
            stack = per_call(function, n)
        print(f"{n:>10} {plain:>9.3f} {shapes:>9.3f} {stack:>9.3f} {stack - shapes:>10.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
