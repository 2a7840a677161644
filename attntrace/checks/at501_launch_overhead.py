"""AT501 launch-overhead: steps where launching kernels costs the CPU more than the GPU work they launch."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.checks.base import IDLE_REMOVED, Context, Skip, fmt_ms
from attntrace.model.measured import measured_pace
from attntrace.model.replay import Change, ProfilerCosts

# One graph launch replays a whole step's kernels for about this much CPU (cudaGraphLaunch, H200, no profiler).
GRAPH_LAUNCH_US = 10.0


def check(ctx: Context) -> list[dict[str, Any]]:
    steps = ctx.steps
    if not steps.height or not ctx.trace.has_gpu:
        raise Skip("no GPU activity")
    if not steps["launches"].sum():
        # The step table counts launches linked to their work: calls whose ids link nothing are there all the same.
        launches = ctx.trace.launches
        if (launches["is_launch"] & launches["correlation"].is_null()).any():
            raise Skip("no kernel launch call is linked to its GPU work (their correlation ids are unusable)")
        raise Skip("no kernel launch calls (cudaLaunchKernel, cuLaunchKernel, ...) in the trace")
    replayed = ctx.trace.replay
    if replayed.reason:
        raise Skip(f"the launch cost cannot be estimated without the profiler's own cost ({replayed.reason})")
    ratio = ctx.params["launch_bound_ratio"]
    steady = replayed.steady.select("step", "device")
    # Typical launch cost = launches x the step's median launch time, less the profiler's share of each call: one
    # launch that loads a CUDA module lazily can take seconds and would otherwise make a GPU-bound step look
    # launch-bound.
    # Per step of each process (merged ranks number their steps alike), joined to the device that process drives.
    # The cost the replay charged each runtime call of the device's process, scaled to its host: the launch cost
    # quoted here and the step it is judged against take the same profiler cost off each call.
    owner = pl.DataFrame({"device": list(ctx.trace.device_process), "pid": list(ctx.trace.device_process.values())},
                         schema={"device": pl.Int64, "pid": pl.String}).join(
        replayed.charged().select("device", pl.col("call_us").alias("call_cost")), on="device", how="left")
    typical = (ctx.trace.launches_linked.filter(pl.col("is_launch") & pl.col("step").is_not_null())
               .group_by("step", pl.col("pid").cast(pl.String))
               .agg(pl.col("dur").median().alias("median_launch_us"),
                    (pl.len() * pl.col("dur").median()).alias("recorded_launch_us")))
    steps = (steps.join(steady, on=["step", "device"], how="inner", nulls_equal=True)
             .join(owner, on="device", how="left").join(typical, on=["step", "pid"], how="left")
             .with_columns(pl.col("median_launch_us", "recorded_launch_us").fill_null(0.0))
             .with_columns(pl.col("call_cost").fill_null(ProfilerCosts.default().runtime_call_us))
             .with_columns((pl.col("launches") * (pl.col("median_launch_us") - pl.col("call_cost"))
                            .clip(lower_bound=1.0)).alias("typical_launch_us")))
    devices = sorted(steps["device"].drop_nulls().unique().to_list())
    findings = []
    # Each device on its own: in a merged trace of two ranks, one launch-bound rank's 5 steps were outvoted by
    # the other's ("5 of 10 steps": silent) or counted with them ("5 of 8 steady steps", 5 steps in the file).
    for device in devices:
        mine = steps.filter(pl.col("device") == device)
        bound = mine.filter((pl.col("typical_launch_us") > ratio * pl.col("gpu_busy_us"))
                            & (pl.col("launches") >= ctx.params["min_launches"]))
        if bound.height * 2 > mine.height:
            key = "launch-bound" if len(devices) == 1 else f"launch-bound|{device}"
            findings.append(_finding(ctx, device, key, mine, bound))
    return findings


def _basis(ctx: Context) -> str:
    """How the step without the profiler is known: measured in the capturing run, or the replay's estimate."""
    return "measured" if ctx.trace.step_basis == "measured" else "estimated"


def _finding(ctx: Context, device: int, key: str, steps: pl.DataFrame, bound: pl.DataFrame) -> dict[str, Any]:
    """The finding for one device's launch-bound steps (`bound`, of its steady `steps`)."""
    pid = ctx.trace.device_process.get(device)
    launches = ctx.trace.launches_linked.filter(pl.col("is_launch") & pl.col("step").is_in(bound["step"].to_list())
                                                & (pl.col("pid").cast(pl.String) == str(pid)))
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
    launch_us = float(bound["typical_launch_us"].median())
    recorded_launch_us = float(bound["recorded_launch_us"].median())
    gpu_us = float(bound["gpu_busy_us"].median())
    count = float(bound["launches"].median())
    # The step of these steps as AT402 and summary give it (Replay.per_device: medians, no shorter than the CPU's).
    pace = ctx.trace.replay.per_device(bound["step"].to_list()).filter(pl.col("device") == device).row(0, named=True)
    est_step, est_idle = measured_pace(ctx.trace.calibration, device, pace["est_step_us"], pace["est_idle_us"],
                                       pace["gpu_busy_us"])
    # What one graph launch instead of the step's launches saves the CPU; the step shrinks by that much at most,
    # and by no more than the idle it has (the GPU's own time stays).
    saving = max(0.0, min(launch_us - GRAPH_LAUNCH_US, est_idle))
    return ctx.finding(
        key=key,
        device=device,
        message=(f"{bound.height} of {steps.height} steady steps are launch-bound: {count:.0f} launches per step "
                 f"cost ~{fmt_ms(launch_us)} of CPU without the profiler (estimated; {fmt_ms(recorded_launch_us)} "
                 f"as recorded, "
                 f"{launch_us / max(count, 1):.1f} us per launch), more than the GPU's {fmt_ms(gpu_us)} of work, "
                 f"in a step of {fmt_ms(est_step)} without the profiler ({_basis(ctx)})"
                 + (f"; slow launch API: {', '.join(slow)}" if slow else "")),
        where={"op_chain": None, "kernel": None, "steps": sorted(bound["step"].to_list())},
        evidence={"launches_per_step": count, "launch_cpu_us_per_step": launch_us,
                  "recorded_launch_cpu_us_per_step": recorded_launch_us,
                  "launch_cpu_us_per_step_total": float(bound["launch_cpu_us"].median()),
                  "gpu_busy_us_per_step": gpu_us,
                  "est_step_us": est_step, "est_idle_us_per_step": est_idle, "step_basis": ctx.trace.step_basis,
                  "launch_bound_steps": bound.height, "steps": steps.height, "per_api": apis, "slow_apis": slow,
                  "top_launching_ops": {n: c / bound.height for n, c in top_ops.iter_rows()}},
        gpu_us_per_step=saving,
        saving=IDLE_REMOVED,
        # The step captured as graphs, replayed: the CPU's time between its launches goes, not only the calls.
        wall_us_per_step=ctx.wall_saving(Change(graph=True), [device]),
        whatif="launches captured as CUDA graphs",
        assumption=("one CUDA graph launch (~10 us) replaces the step's launches; launch cost estimated without the "
                    "profiler"),
        step_us=est_step,
        fix=ctx.rule.docs["fix"],
    )
