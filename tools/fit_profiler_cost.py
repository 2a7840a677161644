"""Check (and fit) the profiler-cost model against the calibration set: each workload's replayed step without the
profiler next to the same program timed without it (sample_traces/calibration/timings.json).

    python tools/fit_profiler_cost.py [--fit] [CALIBRATION_DIR]

Prints one row per trace: recorded step, replayed step, un-profiled step, the replay's error. --fit searches the
per-event costs that put the most traces within 15% (fit_costs) and prints the result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tabulate import tabulate

from attntrace.model.loading import load
from attntrace.model.replay import ProfilerCosts, replay


def rows(directory: Path, costs: ProfilerCosts, traces: dict) -> list[dict]:
    timings = json.loads((directory / "timings.json").read_text())
    out = []
    for path, trace in traces.items():
        workload, setting = Path(path).name.split(".")[:2]
        if workload not in timings:
            continue
        result = replay(trace, costs)
        if result.reason:
            out.append({"trace": f"{workload}.{setting}", "note": result.reason})
            continue
        table = result.steady
        paired = timings[workload]["settings"][setting]
        # The host's CPU speed drifts: the truth for a capture is the timing right before and after it.
        truth = (paired["unprofiled_before_ms"] + paired["unprofiled_after_ms"]) / 2 * 1e3
        est = float(table["est_step_us"].median())
        out.append({"trace": f"{workload}.{setting}", "recorded_us": float(table["recorded_us"].median()),
                    "est_step_us": est, "unprofiled_us": truth, "gpu_busy_us": float(table["gpu_busy_us"].median()),
                    "error": est / truth - 1})
    return out


def held_out_rows(directory: Path, costs: ProfilerCosts) -> list[dict]:
    """The run --from-trace check's Hugging Face models (sample_traces/from_trace): captured and timed by
    bench/gpu/from_trace_gpu.sh, never used to choose the costs."""
    out = []
    for path in sorted(directory.glob("*.pt.trace.json.gz")):
        model, impl = path.name.split(".")[0].rsplit("_", 1)
        timing = directory / f"{model}_timing.json"
        if not timing.exists():
            continue
        truth = json.loads(timing.read_text())[f"{impl}_ms_per_step"] * 1e3
        table = replay(load(str(path)), costs).per_device().row(0, named=True)
        out.append({"trace": f"{model}.{impl}", "recorded_us": table["recorded_us"],
                    "est_step_us": table["est_step_us"], "unprofiled_us": truth, "gpu_busy_us": table["gpu_busy_us"],
                    "error": table["est_step_us"] / truth - 1})
    return out


GRID = {"cpu_op_us": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0], "cpu_op_shapes_us": [0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0],
        "cpu_op_stack_us": [0.0, 0.25, 0.5, 1.0, 2.0, 3.0], "python_function_us": [0.0, 0.25, 0.5, 1.0, 1.5, 2.0],
        "runtime_call_us": [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5], "graph_kernel_us": [0.5, 0.75, 1.0, 1.25, 1.5]}


def fit_costs(directory: Path, traces: dict, base: ProfilerCosts) -> ProfilerCosts:
    """Coordinate descent over GRID: one cost at a time, the value that puts the most traces within 15% of their
    un-profiled step (ties: the smaller mean error), until no single change helps. Counting traces within the
    bar, not the largest error, keeps one capture the host disturbed from pulling every cost its way."""
    def score(costs: ProfilerCosts) -> tuple[int, float]:
        errors = [abs(r["error"]) for r in rows(directory, costs, traces) if "error" in r]
        # The mean caps each error at 50%: past that a capture is off for reasons no per-event cost explains.
        return -sum(e <= 0.15 for e in errors), sum(min(e, 0.5) for e in errors) / len(errors)

    def costs_of(values: dict[str, float]) -> ProfilerCosts:
        return ProfilerCosts.from_table({**values, "launch_call_us": base.launch_call_us}, base)

    current = {name: getattr(base, name) for name in GRID}
    best = score(base)
    improved = True
    while improved:
        improved = False
        for name, values in GRID.items():
            for value in values:
                trial = {**current, name: value}
                result = score(costs_of(trial))
                if result < best:
                    best, current, improved = result, trial, True
                    print(f"within 15%: {-best[0]}, mean error {best[1]:.1%}: {current}", flush=True)
    return costs_of(current)


def main(argv: list[str]) -> int:
    fit = "--fit" in argv
    args = [a for a in argv if a != "--fit"]
    directory = Path(args[0] if args else "sample_traces/calibration")
    traces = {str(p): load(str(p)) for p in sorted(directory.glob("*.pt.trace.json.gz"))}
    base = ProfilerCosts.default()
    if fit:
        base = fit_costs(directory, traces, base)
    table = rows(directory, base, traces)
    print(tabulate(table, headers="keys", floatfmt=".3f"))
    errors = [abs(r["error"]) for r in table if "error" in r]
    print(f"max |error| {max(errors):.1%}, mean {sum(errors) / len(errors):.1%}, within 15%: "
          f"{sum(e <= 0.15 for e in errors)} of {len(errors)}")
    held_out = held_out_rows(directory.parent / "from_trace", base)
    if held_out:
        print("\nheld out (sample_traces/from_trace, timed by bench/gpu/from_trace_gpu.sh):")
        print(tabulate(held_out, headers="keys", floatfmt=".3f"))
        errors = [abs(r["error"]) for r in held_out]
        print(f"max |error| {max(errors):.1%}, within 15%: {sum(e <= 0.15 for e in errors)} of {len(errors)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
