"""AT203 fp32-attention: a fused attention kernel running in fp32 on CUDA cores."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.checks.base import Context, fmt_us, steps_of
from attntrace.checks.measure_hint import point_to_measurement

FP32_FUSED = r"fmha_cutlass[FB]_f32_"


def check(ctx: Context) -> list[dict[str, Any]]:
    kernels = ctx.gpu.filter((pl.col("kind") == "kernel") & pl.col("name").str.contains(FP32_FUSED))
    findings = []
    for (name,), rows in sorted(kernels.group_by(["name"]), key=lambda g: g[0][0]):
        us_per_step = float(rows["dur"].sum()) / ctx.step_count
        share = ctx.share_of_gpu(us_per_step)
        if share < ctx.params["min_share"]:
            continue
        chain = " > ".join(ctx.trace.op_chain(rows["op"][0])) or None
        direction = "backward" if "cutlassB" in name else "forward"
        gain = us_per_step * (1 - 1 / ctx.params["expected_speedup"])
        findings.append(ctx.finding(
            op=rows["op"][0],
            key=name,
            message=(f"fused attention {direction} runs in fp32 on CUDA cores ({fmt_us(us_per_step)} {ctx.each_step}, "
                     f"{100 * share:.0f}% {ctx.of_step_gpu}); in bf16/fp16 it would save about {fmt_us(gain)}"),
            where={"op_chain": chain, "kernel": name, "steps": steps_of(rows)},
            evidence={"kernels_per_step": rows.height / ctx.step_count, "gpu_us_per_step": us_per_step,
                      "share_of_step_gpu": share, "assumed_bf16_speedup": ctx.params["expected_speedup"]},
            gpu_us_per_step=gain,
            fix=ctx.rule.docs["fix"],
        ))
    return point_to_measurement(ctx, findings)
