"""How far the un-profiled truth itself moves, and how much of that a trace can see (issue 22).

    python bench/gpu/profiler_noise.py [DIR ...]   (default sample_traces/calibration and sample_traces/heldout)

For every workload timed in DIR/timings.json: its un-profiled step (the mean of the timings right before and after
each capture) in the three captures' sittings, and how far apart they are. Then, over the workloads captured
three times, how well host-speed statistics read off each trace follow the timed step from one sitting to the
next (Pearson correlation of their logs, each taken relative to its workload's mean): if the trace could tell how
fast the host was, a per-trace cost could follow it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl
from tabulate import tabulate

from attntrace.model.loading import load

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = [ROOT / "sample_traces" / "calibration", ROOT / "sample_traces" / "heldout"]


def sittings(directory: Path) -> list[dict[str, object]]:
    timings = json.loads((directory / "timings.json").read_text())
    rows: list[dict[str, object]] = []
    for path in sorted(directory.glob("*.pt.trace.json.gz")):
        workload, setting = path.name.removesuffix(".pt.trace.json.gz").rsplit(".", 1)
        timed = timings.get(workload, {}).get("settings", {}).get(setting)
        if not timed:
            continue
        trace = load(str(path))
        if not trace.has_gpu:
            continue
        launches = trace.launches.filter(pl.col("is_launch") & pl.col("name").str.starts_with("cu"))["dur"]
        ops = trace.ops.filter(pl.col("name").is_in(["aten::empty", "aten::view", "aten::as_strided"]))["dur"]
        rows.append({"set": directory.name, "workload": workload, "setting": setting,
                     "timed_ms": (timed["unprofiled_before_ms"] + timed["unprofiled_after_ms"]) / 2,
                     "launch_median_us": launches.median(), "launch_p10_us": launches.quantile(0.1),
                     "small_op_median_us": ops.median() if ops.len() else None})
    return rows


def main(argv: list[str]) -> int:
    frame = pl.DataFrame([row for directory in (map(Path, argv) if argv else DEFAULT) for row in sittings(directory)])
    spread = (frame.group_by("set", "workload").agg(pl.col("timed_ms").min().alias("fastest_ms"),
                                                     pl.col("timed_ms").max().alias("slowest_ms"))
              .with_columns((pl.col("slowest_ms") / pl.col("fastest_ms") - 1).alias("spread"))
              .sort("spread", descending=True))
    print(tabulate(spread.rows(), headers=["set", "workload", "fastest timed step ms", "slowest", "spread"],
                   tablefmt="github", floatfmt=".3f"))
    print(f"{(spread['spread'] > 0.15).sum()} of {spread.height} workloads move more than 15% between sittings")
    three = frame.filter(pl.len().over("set", "workload") == 3)
    for statistic in ("launch_median_us", "launch_p10_us", "small_op_median_us"):
        known = three.filter(pl.col(statistic).is_not_null() & (pl.col(statistic) > 0)).filter(
            pl.len().over("set", "workload") == 3)
        relative = known.select(
            (pl.col("timed_ms").log() - pl.col("timed_ms").log().mean().over("set", "workload")).alias("timed"),
            (pl.col(statistic).log() - pl.col(statistic).log().mean().over("set", "workload")).alias("trace"))
        print(f"{statistic}: correlation with the timed step across sittings "
              f"{relative.select(pl.corr('timed', 'trace')).item():.2f} over {known.height} captures")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
