"""AT402 gpu-idle: the GPU idle for a large share of a step while it waits for the CPU."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.checks.base import Context, Skip, fmt_us

TOP_GAPS = 3


def _gaps(gpu: pl.DataFrame) -> pl.DataFrame:
    """Idle intervals (step, device, start, end) between merged GPU activity of each step on each device."""
    keys = ["step", "device"]
    return (gpu.select([*keys, "ts", "end"]).sort([*keys, "ts"])
            .with_columns(pl.col("end").cum_max().shift(1).over(keys).alias("start"))
            .filter(pl.col("ts") > pl.col("start"))
            .select(*keys, "start", pl.col("ts").alias("end")))


def _cpu_ops_during(ctx: Context, start: float, end: float) -> list[str]:
    ops = ctx.trace.ops.filter((pl.col("cat") == "cpu_op") & (pl.col("ts") < end) & (pl.col("end") > start)
                               & ~pl.col("name").str.starts_with("ProfilerStep#"))
    counts = ops.group_by("name").agg(pl.len().alias("n"), pl.col("dur").sum()).sort(
        ["dur", "name"], descending=[True, False]).head(4)
    return counts["name"].to_list()


def check(ctx: Context) -> list[dict[str, Any]]:
    gpu = ctx.gpu
    if not ctx.trace.has_step_markers:
        raise Skip("no ProfilerStep markers: gaps between the phases of a whole trace are not a step's idle time")
    if not gpu.height:
        return []
    keys = ["step", "device"]
    gaps = _gaps(gpu)
    per_step = (gpu.group_by(keys).agg((pl.col("end").max() - pl.col("ts").min()).alias("span"))
                .join(gaps.group_by(keys).agg((pl.col("end") - pl.col("start")).sum().alias("idle"),
                                              pl.len().alias("gaps")), on=keys, how="left")
                .with_columns(pl.col("idle").fill_null(0.0), pl.col("gaps").fill_null(0)))
    bad = per_step.filter((pl.col("span") > 0) & (pl.col("idle") >= ctx.params["min_idle_share"] * pl.col("span"))
                          & (pl.col("idle") >= ctx.params["min_idle_us"]))
    if not bad.height or bad.height * 2 < per_step.height:
        return []
    idle_per_step = float(bad["idle"].mean())
    span_per_step = float(bad["span"].mean())
    top = (gaps.join(bad.select(keys), on=keys).with_columns((pl.col("end") - pl.col("start")).alias("us"))
           .sort(["us", "start"], descending=[True, False]).head(TOP_GAPS))
    largest = [{"idle_us": us, "cpu_ops": _cpu_ops_during(ctx, s, e)}
               for s, e, us in top.select("start", "end", "us").iter_rows()]
    share = idle_per_step / span_per_step
    named = ", ".join(largest[0]["cpu_ops"][:3]) if largest and largest[0]["cpu_ops"] else "no CPU op"
    return [ctx.finding(
        key="gpu-idle",
        message=(f"the GPU is idle {100 * share:.0f}% of each step ({fmt_us(idle_per_step)} of "
                 f"{fmt_us(span_per_step)}) in {bad.height} of {per_step.height} steps; the largest gap "
                 f"({fmt_us(largest[0]['idle_us'])}) waits on {named}"),
        where={"op_chain": None, "kernel": None, "steps": sorted({int(s) for s in bad["step"].to_list()})},
        evidence={"idle_us_per_step": idle_per_step, "gpu_span_us_per_step": span_per_step, "idle_share": share,
                  "gaps_per_step": float(bad["gaps"].mean()), "largest_gaps": largest},
        gpu_us_per_step=idle_per_step,
        fix=ctx.rule.docs["fix"],
    )]
