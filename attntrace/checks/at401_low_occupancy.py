"""AT401 low-occupancy: kernels with low occupancy that hold a large share of GPU time."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace import occupancy, taxonomy
from attntrace.checks.base import Context, Skip, fmt_us, steps_of

CONFIG = ["block_threads", "registers", "shared_memory", "grid_blocks"]
MAX_CHAINS = 50  # launching ops looked at per kernel: enough to tell one call site from several
FP32_GEMM_FIX = ("Run the GEMM on tensor cores rather than tuning its occupancy: bf16/fp16 inputs "
                 "(`torch.autocast`), or TF32 for fp32 (`torch.backends.cuda.matmul.allow_tf32 = True`); AT201 "
                 "says what made it FP32.")
TINY_GRID_FIX = ("Give the launch more blocks than the GPU has SMs: batch more work per launch (larger batch, "
                 "several heads or layers in one kernel, `torch.compile` fusing the small ops), or split the work "
                 "(split-K for GEMMs, more query blocks for attention).")


def by_design(cls: taxonomy.KernelClass | None) -> bool:
    """Kernels that run at low occupancy on purpose: fused attention and tensor-core GEMMs keep their tiles
    on chip, and communication kernels hold few SMs so that compute can overlap them. FP32 SIMT GEMMs are
    not among them (AT201 flags those)."""
    if cls is None:
        return False
    return bool(cls.attention) or cls.group == taxonomy.COMMUNICATION or (
        cls.group == "gemm" and cls.tensor_core in (True, "tf32"))


def check(ctx: Context) -> list[dict[str, Any]]:
    kernels = ctx.gpu.filter(pl.col("kind") == "kernel")
    if not kernels.height:
        raise Skip("no kernels inside steps")
    if kernels["block_threads"].is_null().all() and kernels["occupancy"].is_null().all():
        raise Skip("no launch configuration (block size, registers, shared memory) in the trace's kernels")
    tax = taxonomy.load()
    judged = [c.id for c in tax.classes if by_design(c)]
    kernels = kernels.filter(~pl.col("cls").is_in(judged))
    vendors = {d: ctx.trace.meta.vendor(d) for d in kernels["device"].unique().to_list()}
    if kernels.height and all(v == "amd" for v in vendors.values()):
        raise Skip("occupancy not computed for this vendor (AMD): its limits differ from NVIDIA's and the trace "
                   "gives no occupancy")
    # One launch configuration of one kernel is one finding: maxima across configurations would describe none.
    per_kernel = (kernels.group_by("name", "cls", "device", *CONFIG).agg(
        pl.col("dur").sum().alias("us"), pl.len().alias("count"), pl.col("step").unique().alias("steps"),
        pl.col("occupancy").max().alias("reported"), pl.col("blocks_per_sm").min(),
        pl.col("op").drop_nulls().unique().sort().alias("ops"))
        .sort(["us", "name", "cls", "device", *CONFIG], descending=[True] + [False] * (3 + len(CONFIG))))
    findings = []
    for k in per_kernel.iter_rows(named=True):
        us_per_step = k["us"] / ctx.step_count
        share = ctx.share_of_gpu(us_per_step)
        if share < ctx.params["min_share"] or us_per_step < ctx.params["min_gpu_us"]:
            continue
        reported = k["reported"]
        computed = None
        if k["block_threads"] and vendors.get(k["device"]) != "amd":
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
        tiny_grid = k["blocks_per_sm"] is not None and k["blocks_per_sm"] < 1
        limiter = computed.limited_by if computed else None
        fix = ctx.rule.docs["fix"]
        if k["cls"] == "gemm_fp32_simt":
            reason = ("an FP32 GEMM on CUDA cores (AT201): moving it to tensor cores is the fix, not its "
                      "occupancy")
            fix = FP32_GEMM_FIX
        elif tiny_grid:
            reason = (f"its grid ({k['grid_blocks']} blocks) is smaller than the number of SMs, so most SMs "
                      "sit idle: give the launch more parallelism")
            fix = TINY_GRID_FIX
        else:
            reason = f"resident warps are limited by {limiter or 'the launch configuration'}"
        chains = sorted({" > ".join(ctx.trace.op_chain(op)) for op in k["ops"][:MAX_CHAINS]} - {""})
        findings.append(ctx.finding(
            device=k["device"],
            key=f"{k['name']}|{k['block_threads']}|{k['registers']}|{k['shared_memory']}|{k['grid_blocks']}",
            message=(f"{occ:.1f}% occupancy ({source.split(' (')[0]}) for a kernel that takes {100 * share:.0f}% "
                     f"{ctx.of_step_gpu} ({fmt_us(us_per_step)} {ctx.each_step}): {reason}"),
            where={"op_chain": chains[0] if len(chains) == 1 else None, "kernel": k["name"],
                   "steps": steps_of(pl.DataFrame({"step": k["steps"]}))},
            evidence={"occupancy_pct": occ, "occupancy_source": source,
                      "reported_occupancy_pct": reported,
                      "computed_occupancy_pct": computed.percent if computed else None,
                      "limited_by": limiter, "registers_per_thread": k["registers"],
                      "shared_memory_bytes": k["shared_memory"], "threads_per_block": k["block_threads"],
                      "blocks_per_sm": k["blocks_per_sm"], "kernel_class": k["cls"],
                      "grid_blocks": k["grid_blocks"], "launches": k["count"],
                      "gpu_us_per_step": us_per_step, "share_of_step_gpu": share,
                      "launching_op_chains": chains[:3]},
            gpu_us_per_step=us_per_step,
            fix=fix,
        ))
    return findings
