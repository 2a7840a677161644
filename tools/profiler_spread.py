"""How sure the estimate without the profiler is, per setting: the spread of the profiler cost the replay takes away
against the cost the program really paid, over every committed calibration round (bench/gpu/profiler_rounds.py's
sample_traces/calibration/rounds_results*.json), written to attntrace/profiler_spread.toml.

For each capture whose replay took at least 5% off its recorded step: ratio = (recorded - timed without the profiler)
/ (recorded - estimated), the true cost over the estimated one. Its quartiles per group (compiled or eager, with or
without with_stack) bound the range lint gives an estimate: the step without the profiler lies in
recorded - ratio x (recorded - estimated), no shorter than the GPU's work. Quartiles, not the 10th and 90th
percentiles: over the 322 rounds, AT402 judged on the range's lower end keeps 246 of its 257 warnings where the GPU
really idles 30% or more (215 with the wider range), and drops its one warning where it does not.

    python tools/profiler_spread.py [--write]
"""

from __future__ import annotations

import glob
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIN_REMOVED = 0.05
LOW, HIGH = 0.25, 0.75


def group(workload: str, setting: str) -> str:
    compiled = "compiled" if "compiled" in workload or "graphs" in workload else "eager"
    return f"{compiled}_{'stack' if 'stack' in setting else 'no_stack'}"


def ratios() -> dict[str, list[float]]:
    found: dict[str, list[float]] = defaultdict(list)
    for path in sorted(glob.glob(str(ROOT / "sample_traces" / "calibration" / "rounds_results*.json"))):
        for row in json.loads(Path(path).read_text())["captures"]:
            if row.get("est_step_us") is None or not row.get("unprofiled_us"):
                continue
            removed = row["recorded_us"] - row["est_step_us"]
            if removed < MIN_REMOVED * row["recorded_us"]:
                continue
            found[group(row["workload"], row["setting"])].append((row["recorded_us"] - row["unprofiled_us"]) / removed)
    return found


def quantile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def main(write: bool) -> None:
    lines = ["# The estimate's spread per setting: the profiler cost the program really paid over the cost the replay",
             "# took away, 25th and 75th percentiles over the committed calibration rounds. Written by",
             "# tools/profiler_spread.py; read by attntrace/model/measured.py (Spread).", ""]
    for name, values in sorted(ratios().items()):
        low, high = quantile(values, LOW), quantile(values, HIGH)
        print(f"{name}: {len(values)} captures, cost ratio p25 {low:.2f}, p75 {high:.2f}")
        lines += [f"[{name}]", f"captures = {len(values)}", f"cost_ratio_low = {low:.2f}",
                  f"cost_ratio_high = {high:.2f}", ""]
    if write:
        (ROOT / "attntrace" / "profiler_spread.toml").write_text("\n".join(lines).rstrip() + "\n")


if __name__ == "__main__":
    main("--write" in sys.argv[1:])
