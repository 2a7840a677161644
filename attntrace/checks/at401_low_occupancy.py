"""AT401 low-occupancy: kernels with low occupancy that hold a large share of GPU time."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace import occupancy, taxonomy
from attntrace.checks.base import Context, Skip, fmt_us, steps_of

BY_DESIGN = ("by design: a {what} keeps its tiles in registers and shared memory and trades occupancy for "
             "on-chip reuse, so few warps per SM is how it runs fast")


def check(ctx: Context) -> list[dict[str, Any]]:
    kernels = ctx.gpu.filter(pl.col("kind") == "kernel")
    if not kernels.height:
        raise Skip("no kernels inside steps")
    if kernels["block_threads"].is_null().all() and kernels["occupancy"].is_null().all():
        raise Skip("no launch configuration (block size, registers, shared memory) in the trace's kernels")
    tax = taxonomy.load()
    per_kernel = (kernels.group_by("name", "cls").agg(
        pl.col("dur").sum().alias("us"), pl.len().alias("count"), pl.col("step").unique().alias("steps"),
        pl.col("occupancy").max().alias("reported"), pl.col("registers").max(), pl.col("shared_memory").max(),
        pl.col("block_threads").max(), pl.col("blocks_per_sm").min(), pl.col("device").first(),
        pl.col("grid_blocks").min()).sort(["us", "name"], descending=[True, False]))
    findings = []
    for k in per_kernel.iter_rows(named=True):
        us_per_step = k["us"] / ctx.step_count
        share = ctx.share_of_gpu(us_per_step)
        if share < ctx.params["min_share"] or us_per_step < ctx.params["min_gpu_us"]:
            continue
        reported = k["reported"]
        computed = None
        if k["block_threads"]:
            computed = occupancy.theoretical(ctx.trace.meta.device(k["device"]), k["block_threads"],
                                             k["registers"] or 0, k["shared_memory"] or 0)
        if reported is not None and reported > 0:
            occ, source = float(reported), "reported by the trace (est. achieved occupancy)"
        elif computed is not None:
            note = "not given" if reported is None else f"{reported:g}, which means unknown"
            occ, source = computed.percent, f"computed (theoretical; the trace's value was {note})"
        else:
            continue
        if occ > ctx.params["max_occupancy"]:
            continue
        cls = tax.by_id(k["cls"])
        # GEMM tiles live in registers whatever the precision; an FP32 GEMM's real problem is AT201's.
        by_design = bool(cls and (cls.attention or cls.id.startswith("gemm_")))
        tiny_grid = k["blocks_per_sm"] is not None and k["blocks_per_sm"] < 1
        limiter = computed.limited_by if computed else None
        if by_design:
            reason = BY_DESIGN.format(what=cls.description if cls else "kernel")
        elif tiny_grid:
            reason = (f"its grid ({k['grid_blocks']} blocks) is smaller than the number of SMs, so most SMs "
                      "sit idle: give the launch more parallelism")
        else:
            reason = f"resident warps are limited by {limiter or 'the launch configuration'}"
        findings.append(ctx.finding(
            key=f"{k['name']}",
            message=(f"{occ:.1f}% occupancy ({source.split(' (')[0]}) for a kernel that takes {100 * share:.0f}% "
                     f"of step GPU time ({fmt_us(us_per_step)} per step): {reason}"),
            where={"op_chain": None, "kernel": k["name"], "steps": steps_of(pl.DataFrame({"step": k["steps"]}))},
            evidence={"occupancy_pct": occ, "occupancy_source": source,
                      "reported_occupancy_pct": reported,
                      "computed_occupancy_pct": computed.percent if computed else None,
                      "limited_by": limiter, "registers_per_thread": k["registers"],
                      "shared_memory_bytes": k["shared_memory"], "threads_per_block": k["block_threads"],
                      "blocks_per_sm": k["blocks_per_sm"], "kernel_class": k["cls"],
                      "gpu_us_per_step": us_per_step, "share_of_step_gpu": share, "by_design": by_design},
            gpu_us_per_step=0.0 if by_design else us_per_step,
            fix=("Nothing to fix: this is how fused attention and tensor-core GEMM kernels run fast."
                 if by_design else ctx.rule.docs["fix"]),
            severity="info" if by_design else None,
        ))
    return findings
