"""Check (and fit) the profiler-cost model against the calibration set: each workload's replayed step without the
profiler next to the same program timed without it (sample_traces/calibration/timings.json).

    python bench/fit_profiler_cost.py [--fit] [CALIBRATION_DIR]

Prints one row per trace: recorded step, replayed step, un-profiled step, the replay's error. --fit searches the
per-event costs that minimise the largest error over the set and prints them as profiler_cost.toml lines.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

from tabulate import tabulate

from attntrace.loading import load
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
        table = result.table
        paired = timings[workload]["settings"][setting]
        # The host's CPU speed drifts: the truth for a capture is the timing right before and after it.
        truth = (paired["unprofiled_before_ms"] + paired["unprofiled_after_ms"]) / 2 * 1e3
        est = float(table["est_step_us"].median())
        out.append({"trace": f"{workload}.{setting}", "recorded_us": float(table["recorded_us"].median()),
                    "est_step_us": est, "unprofiled_us": truth, "gpu_busy_us": float(table["gpu_busy_us"].median()),
                    "error": est / truth - 1})
    return out


def main(argv: list[str]) -> int:
    fit = "--fit" in argv
    args = [a for a in argv if a != "--fit"]
    directory = Path(args[0] if args else "sample_traces/calibration")
    traces = {str(p): load(str(p)) for p in sorted(directory.glob("*.pt.trace.json.gz"))}
    base = ProfilerCosts.default()
    if fit:
        best = None
        grid = {"cpu_op_us": [1.0, 1.5, 2.0, 2.5, 3.0], "cpu_op_shapes_us": [0.0, 0.5, 1.0, 2.0],
                "cpu_op_stack_us": [0.0, 1.0, 2.0, 3.0], "python_function_us": [0.0, 0.5, 1.0, 2.0],
                "runtime_call_us": [0.5, 1.5, 2.5, 3.5]}
        for values in itertools.product(*grid.values()):
            costs = ProfilerCosts.from_table(dict(zip(grid, values, strict=True)), base)
            errors = [abs(r["error"]) for r in rows(directory, costs, traces) if "error" in r]
            score = (max(errors), sum(errors))
            if best is None or score < best[0]:
                best = (score, dict(zip(grid, values, strict=True)))
                print(best, flush=True)
        base = ProfilerCosts.from_table(best[1], base)
    table = rows(directory, base, traces)
    print(tabulate(table, headers="keys", floatfmt=".3f"))
    errors = [abs(r["error"]) for r in table if "error" in r]
    print(f"max |error| {max(errors):.1%}, mean {sum(errors) / len(errors):.1%}, within 15%: "
          f"{sum(e <= 0.15 for e in errors)} of {len(errors)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
