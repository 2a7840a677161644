"""Measure what the PyTorch profiler costs the CPU per recorded event, on this machine.

Each measurement runs one small loop with and without the profiler, exports the profiled trace, counts its events
by kind and divides the extra wall time by them. Loops are chosen so that one kind of event dominates each:
CPU ops alone; the same with shapes; launches (one op + one runtime call each); nested Python functions under
`with_stack`; allocations under `profile_memory`. The result is what `attntrace lint` subtracts from each thread's
CPU timeline before judging idle GPU, launch cost and syncs (attntrace/profiler_cost.toml holds the defaults).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attntrace.capture.runner import usable_device
from attntrace.model.replay import COST_NAMES, ProfilerCosts

LOOP = 2000  # iterations per timed loop: long enough that the profiler's start and stop are a few percent
REPEATS = 3
OP_ATTEMPTS = 5


def _wall_us(body: Callable[[], None], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(LOOP):
        body()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - begin) * 1e6


def _profiled(body: Callable[[], None], device: torch.device, **settings: bool) -> tuple[float, Counter[str]]:
    """Wall microseconds of the loop under the profiler, and its recorded events by category (kernels and other
    device-side events are not CPU cost and are left out)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, **settings) as prof:
        wall = _wall_us(body, device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    counts: Counter[str] = Counter()
    for event in events:
        cat = event.get("cat", "")
        if event.get("ph") == "X" and cat in ("cpu_op", "cuda_runtime", "cuda_driver", "python_function",
                                               "user_annotation"):
            counts[cat] += 1
        elif cat == "cpu_instant_event" and event.get("name") == "[memory]":
            counts["memory"] += 1
    return wall, counts


def _overhead(body: Callable[[], None], device: torch.device, **settings: bool) -> tuple[float, Counter[str]]:
    """Extra wall microseconds the profiler adds to the loop (best of REPEATS each way), and its events."""
    body()  # warm caches and lazy initialisation outside the timed loops
    _profiled(body, device, **settings)  # the first profiled run also pays for the profiler's own start-up
    plain = min(_wall_us(body, device) for _ in range(REPEATS))
    wall, counts = min((_profiled(body, device, **settings) for _ in range(REPEATS)), key=lambda r: r[0])
    return max(wall - plain, 0.0), counts


def _per(extra_us: float, count: int) -> float:
    return max(extra_us, 0.0) / count if count else 0.0


def measure(device_name: str = "cuda") -> dict[str, Any]:
    """The per-event costs (microseconds of CPU) of each profiler setting on this machine. RuntimeError for a
    device torch cannot use here: costs measured on the CPU alone lack the runtime calls a CUDA trace is charged
    for, and written as a GPU machine's they would mislead lint."""
    device = usable_device(device_name)
    cpu = torch.device("cpu")
    small = torch.ones(16, device="cpu")

    def nested(depth: int) -> Callable[[], None]:
        def level(n: int) -> None:
            if n:
                level(n - 1)
            else:
                torch.add(small, 1)
        return lambda: level(depth)

    # The op cost scales every other one: a noisy machine can hide it in one measurement (seen here: the
    # profiled loop as fast as the plain one on a loaded 2-core VM), so measure again until it shows.
    op_us = 0.0
    for _ in range(OP_ATTEMPTS):
        extra, counts = _overhead(nested(0), cpu)
        op_us = _per(extra, counts["cpu_op"])
        if op_us > 0:
            break
    if op_us <= 0:
        raise RuntimeError("the profiler's cost per op did not show above this machine's noise in "
                           f"{OP_ATTEMPTS} tries: run --calibrate-profiler again on a quieter machine")
    extra, counts = _overhead(nested(0), cpu, record_shapes=True)
    shapes_us = _per(extra, counts["cpu_op"])
    # with_stack: the Python tracer records every Python call and each op captures its stack. Two loops that
    # differ only in Python depth separate the two costs.
    shallow, shallow_counts = _overhead(nested(0), cpu, with_stack=True)
    deep, deep_counts = _overhead(nested(8), cpu, with_stack=True)
    py_us = _per(deep - shallow, deep_counts["python_function"] - shallow_counts["python_function"])
    stack_op_us = _per(shallow - py_us * shallow_counts["python_function"], shallow_counts["cpu_op"])
    runtime_us = 0.0
    if device.type == "cuda":
        gpu_small = torch.ones(16, device=device)
        extra, counts = _overhead(lambda: torch.add(gpu_small, 1), device)
        runtime_us = _per(extra - op_us * counts["cpu_op"], counts["cuda_runtime"] + counts["cuda_driver"])
    # The loops' costs, in the same terms as the defaults: shapes and stacks as what they add to an op.
    costs = {"cpu_op_us": op_us, "cpu_op_shapes_us": max(0.0, shapes_us - op_us),
             "cpu_op_stack_us": max(0.0, stack_op_us - op_us), "python_function_us": py_us,
             "runtime_call_us": runtime_us}
    defaults = ProfilerCosts.default()
    # launch_call_us scales with the machine too: it is what the host factor compares a trace's launches with. On
    # the CPU alone no launch was timed: written from the op loop, it scaled every GPU trace linted with these costs
    # by the 3x limit (1.1 us "launches" against real ones of 6 us and more), so it is left out, and no trace is
    # scaled further.
    names = (*COST_NAMES, "launch_call_us") if device.type == "cuda" else COST_NAMES
    fitted = {name: getattr(defaults, name) for name in names}
    reference = {k: float(v) for k, v in defaults.measured_on.get("loops", {}).items()}
    return {
        "costs": scaled_defaults(costs, fitted, reference) if reference else {k: round(v, 3) for k, v in
                                                                            sorted(costs.items())},
        "loops": {k: round(v, 3) for k, v in sorted(costs.items())},
        "measured_on": {
            "host": platform.node() or "unknown", "cpu": platform.processor() or platform.machine(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count() or 0,
        },
    }


def scaled_defaults(loops: dict[str, float], defaults: dict[str, float],
                    reference: dict[str, float]) -> dict[str, float]:
    """Costs for this machine: small loops understate what the profiler costs a real program (on the H200 host the
    loops gave about half of what fits real workloads, sample_traces/calibration), so the loops measure only how
    this machine compares with that host, and the fitted defaults are scaled by it."""
    keys = ("cpu_op_us", "runtime_call_us") if loops.get("runtime_call_us") else ("cpu_op_us",)
    ratio = sum(loops[k] for k in keys) / max(sum(reference[k] for k in keys), 1e-9)
    return {name: round(value * ratio, 3) for name, value in sorted(defaults.items())}


def to_toml(result: dict[str, Any]) -> str:
    """The measured costs as the `[tool.attntrace.profiler_cost]` table lint reads (see README)."""
    lines = ["[tool.attntrace.profiler_cost]"]
    lines += [f"{name} = {value}" for name, value in result["costs"].items()]
    lines.append("[tool.attntrace.profiler_cost.measured_on]")
    lines += [f"{name} = {json.dumps(value)}" for name, value in result["measured_on"].items()]
    lines.append("[tool.attntrace.profiler_cost.measured_on.loops]")
    lines += [f"{name} = {value}" for name, value in result["loops"].items()]
    return "\n".join(lines) + "\n"

