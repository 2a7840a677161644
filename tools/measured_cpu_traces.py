"""Write the CPU traces with measured un-profiled steps that tests/test_measured.py reads (tests/data/measured/).

Two programs, captured through attntrace.profile with record_shapes and with_stack:
- `python_heavy`: many tiny ops, each through a Python function: the profiler costs several times the step;
- `one_matmul`: one large matmul a step, sized so that its step as recorded is about python_heavy's: the profiler
  costs it almost nothing, so its step without the profiler is several times python_heavy's.
`python_heavy` is captured twice (two captures of one program). Going from python_heavy to one_matmul reads as
"within noise" as recorded and must fail `diff --fail-over 5` on the step without the profiler.

    python tools/measured_cpu_traces.py [OUT_DIR]     (default tests/data/measured)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, schedule

import attntrace

torch.set_num_threads(1)  # one core, so that the two programs' timings do not fight over the machine's two
SMALL = torch.randn(8, 8)


def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 1.0001 + 0.0001


def python_heavy() -> None:
    x = SMALL
    for _ in range(400):
        x = scale(x)


def matmul_of(n: int) -> Callable[[], None]:
    a = torch.randn(n, n)

    def step() -> None:
        a @ a

    return step


def capture(step: Callable[[], None], path: Path, wait: int = 20, active: int = 4) -> dict:
    for _ in range(3):
        step()
    with attntrace.profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True,
                           schedule=schedule(wait=wait, warmup=1, active=active),
                           on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(wait + 1 + active):
            step()
            prof.step()
    return prof.measured[-1]


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    heavy = capture(python_heavy, out / "python_heavy.pt.trace.json.gz")
    target = median(heavy["profiled_step_us"])
    # The matmul whose step takes as long as python_heavy's does under the profiler.
    n = 64
    while True:
        step = matmul_of(n)
        step()
        began = time.perf_counter()
        for _ in range(3):
            step()
        if (time.perf_counter() - began) / 3 * 1e6 >= target or n > 8192:
            break
        n = int(n * 1.1) + 1
    matmul = capture(step, out / "one_matmul.pt.trace.json.gz")
    again = capture(python_heavy, out / "python_heavy_again.pt.trace.json.gz")
    for name, record in (("python_heavy", heavy), ("one_matmul", matmul), ("python_heavy_again", again)):
        print(f"{name}: un-profiled {median(record['unprofiled_step_us']):.0f} us, "
              f"profiled {median(record['profiled_step_us']):.0f} us")
    print(f"matmul size {n}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/measured"))
