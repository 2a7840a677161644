"""AT203 fp32-attention: a fused attention kernel running in fp32 on CUDA cores."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.checks.base import Context, fmt_us, steps_of
from attntrace.checks.measure_hint import point_to_measurement

FP32_FUSED = r"fmha_cutlass[FB]_f32_"


def check(ctx: Context) -> list[dict[str, Any]]:
    """One finding for every fp32 fused kernel of the trace: the forward and backward kernels (and every call
    site) share one cause, fp32 q/k/v given to SDPA, and one fix; as one finding per kernel the backward came out
    as a second warning with the same fix."""
    kernels = ctx.gpu.filter((pl.col("kind") == "kernel") & pl.col("name").str.contains(FP32_FUSED))
    if not kernels.height:
        return []
    steps = ctx.steps_in(kernels["launch_pid"].to_list())
    us_per_step = float(kernels["dur"].sum()) / steps
    share = ctx.share_of_gpu(us_per_step, kernels["device"].to_list())
    if share < ctx.params["min_share"]:
        return []
    by_name = {name: float(rows["dur"].sum()) / steps
               for (name,), rows in sorted(kernels.group_by(["name"]), key=lambda g: g[0][0])}
    forward = sum(us for name, us in by_name.items() if "cutlassF" in name)
    backward = sum(us for name, us in by_name.items() if "cutlassB" in name)
    # The forward kernel names the call (its op chain is the SDPA call; the backward's is the autograd node).
    first = kernels.sort(pl.col("name").str.contains("cutlassB"), "ts", "idx").row(0, named=True)
    parts = [f"forward {fmt_us(forward)}" if forward else "", f"backward {fmt_us(backward)}" if backward else ""]
    gain = us_per_step * (1 - 1 / ctx.params["expected_speedup"])
    findings = [ctx.finding(
        op=first["op"],
        key="fp32-fused-attention",
        message=(f"fused attention runs in fp32 on CUDA cores ({', '.join(p for p in parts if p)} {ctx.each_step}, "
                 f"{100 * share:.0f}% {ctx.of_step_gpu}); in bf16/fp16 it would save about {fmt_us(gain)}"),
        where={"op_chain": " > ".join(ctx.trace.op_chain(first["op"])) or None, "kernel": first["name"],
               "steps": steps_of(kernels)},
        evidence={"kernels_per_step": kernels.height / steps, "gpu_us_per_step": us_per_step,
                  "forward_us_per_step": forward, "backward_us_per_step": backward,
                  "kernels_us_per_step": by_name, "share_of_step_gpu": share,
                  "assumed_bf16_speedup": ctx.params["expected_speedup"]},
        gpu_us_per_step=gain,
        fix=ctx.rule.docs["fix"],
    )]
    return point_to_measurement(ctx, findings)
