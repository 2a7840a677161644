"""AT501 launch-overhead: steps where launching kernels costs the CPU more than the GPU work they launch."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.checks.base import Context, Skip, fmt_us


def check(ctx: Context) -> list[dict[str, Any]]:
    steps = ctx.steps
    if not steps.height or not ctx.trace.has_gpu:
        raise Skip("no GPU activity")
    if not steps["launches"].sum():
        raise Skip("no kernel launch calls (cudaLaunchKernel, cuLaunchKernel, ...) in the trace")
    ratio = ctx.params["launch_bound_ratio"]
    # Typical launch cost = launches x the step's median launch time: one launch that loads a CUDA module
    # lazily can take seconds and would otherwise make a GPU-bound step look launch-bound.
    typical = (ctx.trace.launches_linked.filter(pl.col("is_launch") & pl.col("step").is_not_null())
               .group_by("step").agg((pl.len() * pl.col("dur").median()).alias("typical_launch_us")))
    steps = steps.join(typical, on="step", how="left").with_columns(pl.col("typical_launch_us").fill_null(0.0))
    bound = steps.filter((pl.col("typical_launch_us") > ratio * pl.col("gpu_busy_us"))
                         & (pl.col("launches") >= ctx.params["min_launches"]))
    if bound.height * 2 < steps.height:
        return []
    launches = ctx.trace.launches_linked.filter(pl.col("is_launch") & pl.col("step").is_in(bound["step"].to_list()))
    per_api = (launches.group_by("name").agg(
        pl.len().alias("calls"), pl.col("dur").median().alias("median_us"),
        pl.col("dur").quantile(0.95, "nearest").alias("p95_us")).sort("name"))
    apis = {name: {"calls_per_step": calls / bound.height, "median_us": med, "p95_us": p95}
            for name, calls, med, p95 in per_api.iter_rows()}
    slow = sorted(name for name, s in apis.items() if s["median_us"] > ctx.params["slow_launch_us"])
    names = ctx.trace.op_names
    top_ops = (launches.filter(pl.col("op").is_not_null())
               .with_columns(pl.col("op").map_elements(lambda i: names[i], return_dtype=pl.String).alias("op_name"))
               .group_by("op_name").agg(pl.len().alias("n")).sort(["n", "op_name"], descending=[True, False]).head(3))
    launch_us = float(bound["typical_launch_us"].mean())
    gpu_us = float(bound["gpu_busy_us"].mean())
    count = float(bound["launches"].mean())
    waiting = max(0.0, launch_us - gpu_us)
    return [ctx.finding(
        key="launch-bound",
        message=(f"{bound.height} of {steps.height} steps are launch-bound: {count:.0f} launches per step cost "
                 f"{fmt_us(launch_us)} of CPU, the GPU is busy {fmt_us(gpu_us)} "
                 f"({launch_us / max(count, 1):.1f} us CPU per launch)"
                 + (f"; slow launch API: {', '.join(slow)}" if slow else "")),
        where={"op_chain": None, "kernel": None, "steps": sorted(bound["step"].to_list())},
        evidence={"launches_per_step": count, "launch_cpu_us_per_step": launch_us,
                  "launch_cpu_us_per_step_total": float(bound["launch_cpu_us"].mean()), "gpu_busy_us_per_step": gpu_us,
                  "launch_bound_steps": bound.height, "steps": steps.height, "per_api": apis, "slow_apis": slow,
                  "top_launching_ops": {n: c / bound.height for n, c in top_ops.iter_rows()}},
        gpu_us_per_step=waiting,
        fix=ctx.rule.docs["fix"],
    )]
