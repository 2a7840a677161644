"""AT402 against the program timed without the profiler: for every calibration capture (sample_traces/calibration,
each with un-profiled timings right before and after it), the GPU busy time per step from the trace, the real
idle (un-profiled step minus GPU busy), what AT402 says, and whether that meets issue 22's bar: claimed idle
within 2x of the real idle where it is small (under half the step), within 20% where it dominates, and no AT402
warning where the GPU is busy 90% or more of the un-profiled step.

    python tools/judge_idle.py [DIRECTORY]   (default sample_traces/calibration; sample_traces/heldout too)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
CALIBRATION = ROOT / "sample_traces" / "calibration"


def main(argv: list[str]) -> int:
    from attntrace.model.loading import load
    from attntrace.report.engine import lint_trace

    directory = Path(argv[0]) if argv else CALIBRATION
    timings = json.loads((directory / "timings.json").read_text())
    rows, misses = [], 0
    for trace_path in sorted(directory.glob("*.pt.trace.json.gz")):
        workload, setting = trace_path.name.removesuffix(".pt.trace.json.gz").rsplit(".", 1)
        timed = timings.get(workload, {}).get("settings", {}).get(setting)
        if not timed:
            continue
        real_step = statistics.mean([timed["unprofiled_before_ms"], timed["unprofiled_after_ms"]]) * 1e3
        trace = load(str(trace_path))
        if not trace.has_gpu:
            continue
        report = lint_trace(trace)
        replay = trace.replay.per_device()
        busy = float(replay["gpu_busy_us"].max()) if replay.height else float(trace.step_table["gpu_busy_us"].median())
        real_idle = max(0.0, real_step - busy)
        found = [f for f in report.findings if f["rule"] == "AT402"]
        claimed = found[0]["impact"]["gpu_us_per_step"] if found else 0.0
        severity = found[0]["severity"] if found else "-"
        busy_share = busy / real_step if real_step else 0.0
        if busy_share >= 0.9:
            ok = severity != "warning"
        elif real_idle >= 0.5 * real_step:
            ok = abs(claimed - real_idle) <= 0.2 * real_idle
        else:
            ok = claimed <= 2 * real_idle and (claimed >= real_idle / 2 or severity != "warning")
        misses += not ok
        rows.append([workload, setting, f"{real_step / 1e3:.2f}", f"{busy / 1e3:.2f}", f"{100 * busy_share:.0f}%",
                     f"{real_idle / 1e3:.2f}", severity, f"{claimed / 1e3:.2f}", "ok" if ok else "MISS"])
    print(tabulate(rows, headers=["workload", "setting", "step ms (timed)", "GPU busy ms", "busy share",
                                  "real idle ms", "AT402", "claimed idle ms", "verdict"], tablefmt="github"))
    print(f"{len(rows) - misses} of {len(rows)} captures meet the bar")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
