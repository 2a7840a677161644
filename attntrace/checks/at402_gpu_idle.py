"""AT402 gpu-idle: the GPU idle for a large share of a step while it waits for the CPU."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.checks.base import Context, Skip, fmt_us

TOP_GAPS = 3


def _gaps(frame: pl.DataFrame) -> list[tuple[float, float]]:
    """Idle intervals between merged GPU activity on one device, largest first."""
    gaps, cur_end = [], None
    for ts, end in frame.sort("ts").select("ts", "end").iter_rows():
        if cur_end is not None and ts > cur_end:
            gaps.append((cur_end, ts))
        cur_end = end if cur_end is None else max(cur_end, end)
    return sorted(gaps, key=lambda g: (g[0] - g[1], g[0]))


def _cpu_ops_during(ctx: Context, start: float, end: float) -> list[str]:
    ops = ctx.trace.ops.filter((pl.col("cat") == "cpu_op") & (pl.col("ts") < end) & (pl.col("end") > start))
    counts = ops.group_by("name").agg(pl.len().alias("n"), pl.col("dur").sum()).sort(
        ["dur", "name"], descending=[True, False]).head(4)
    return counts["name"].to_list()


def check(ctx: Context) -> list[dict[str, Any]]:
    gpu = ctx.gpu
    if not ctx.trace.has_step_markers:
        raise Skip("no ProfilerStep markers: gaps between the phases of a whole trace are not a step's idle time")
    if not gpu.height:
        return []
    idle_rows = []
    for (step, device), frame in gpu.group_by(["step", "device"]):
        span = float(frame["end"].max() - frame["ts"].min())
        gaps = _gaps(frame)
        idle = sum(e - s for s, e in gaps)
        idle_rows.append((step, device, span, idle, gaps))
    idle_rows.sort(key=lambda r: (r[0], r[1] if r[1] is not None else -1))
    bad = [r for r in idle_rows if r[2] and r[3] / r[2] >= ctx.params["min_idle_share"]
           and r[3] >= ctx.params["min_idle_us"]]
    if not bad or len(bad) * 2 < len(idle_rows):
        return []
    idle_per_step = sum(r[3] for r in bad) / len(bad)
    span_per_step = sum(r[2] for r in bad) / len(bad)
    gaps = sorted((g for r in bad for g in r[4]), key=lambda g: (g[0] - g[1], g[0]))[:TOP_GAPS]
    largest = [{"idle_us": e - s, "cpu_ops": _cpu_ops_during(ctx, s, e)} for s, e in gaps]
    share = idle_per_step / span_per_step
    named = ", ".join(largest[0]["cpu_ops"][:3]) if largest and largest[0]["cpu_ops"] else "no CPU op"
    return [ctx.finding(
        key="gpu-idle",
        message=(f"the GPU is idle {100 * share:.0f}% of each step ({fmt_us(idle_per_step)} of "
                 f"{fmt_us(span_per_step)}) in {len(bad)} of {len(idle_rows)} steps; the largest gap "
                 f"({fmt_us(largest[0]['idle_us'])}) waits on {named}"),
        where={"op_chain": None, "kernel": None, "steps": sorted({int(r[0]) for r in bad})},
        evidence={"idle_us_per_step": idle_per_step, "gpu_span_us_per_step": span_per_step, "idle_share": share,
                  "gaps_per_step": sum(len(r[4]) for r in bad) / len(bad), "largest_gaps": largest},
        gpu_us_per_step=idle_per_step,
        fix=ctx.rule.docs["fix"],
    )]
