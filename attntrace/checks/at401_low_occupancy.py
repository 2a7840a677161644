"""AT401 low-occupancy: kernels with low occupancy that hold a large share of GPU time."""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from attntrace.checks.base import ITEM_SIZE, Context, Skip, fmt_us, steps_of
from attntrace.model import occupancy, taxonomy
from attntrace.model.peaks import device_peaks

CONFIG = ["block_threads", "registers", "shared_memory", "grid_blocks"]
MAX_CHAINS = 50  # launching ops looked at per kernel: enough to tell one call site from several
# Kernels whose problem another rule names: their occupancy is a consequence, and that rule's fix removes it.
OWNED_CLASSES = {"gemm_fp32_simt": "AT201"}
OWNED_OPS = {"aten::_scaled_dot_product_attention_math": "AT202"}
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
PRECISION = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32"}
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
    # The columns read here, before the rows are filtered: each filter copies every column it carries, and the
    # others (stacks, timestamps) added 25 MB to a 185 MB trace's peak, which this rule reached.
    kernels = ctx.gpu.select("kind", "name", "cls", "device", *CONFIG, "dur", "step", "occupancy", "blocks_per_sm",
                             "op").filter(pl.col("kind") == "kernel")
    if not kernels.height:
        raise Skip("no kernels inside steps")
    if kernels["block_threads"].is_null().all() and kernels["occupancy"].is_null().all():
        raise Skip("no launch configuration (block size, registers, shared memory) in the trace's kernels")
    if kernels["occupancy"].is_null().all() and not any(
            ctx.trace.meta.device(d) for d in kernels["device"].unique().to_list()):
        raise Skip("no device properties (Kineto's deviceProperties, nsys's TARGET_INFO_GPU) to compute "
                   "occupancy from, and no occupancy in the trace")
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
        us_per_step = k["us"] / ctx.steps_of_ops(k["ops"])
        share = ctx.share_of_gpu(us_per_step, [k["device"]])
        if share < ctx.params["min_share"] or us_per_step < ctx.params["min_gpu_us"]:
            continue
        if _owner(ctx, k):
            continue
        busy = _near_peak(ctx, k)
        if busy and busy["share"] >= ctx.params["max_peak_share"]:
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
        if occ > 100 * ctx.params["max_occupancy"]:  # occupancy in percent, as Kineto and occupancy.py give it
            continue
        tiny_grid = k["blocks_per_sm"] is not None and k["blocks_per_sm"] < 1
        limiter = computed.limited_by if computed else None
        fix = ctx.rule.docs["fix"]
        if tiny_grid:
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
                      "launching_op_chains": chains[:3], "peak_use": busy},
            gpu_us_per_step=us_per_step / 2,
            assumption="if better occupancy made the kernel up to 2x faster (at most what it takes)",
            fix=fix,
        ))
    return findings


def _owner(ctx: Context, kernel: dict[str, Any]) -> str | None:
    """The rule that names this kernel's problem, if another one does (FP32 SIMT GEMMs: AT201; the SDPA math
    backend's kernels: AT202)."""
    if kernel["cls"] in OWNED_CLASSES:
        return OWNED_CLASSES[kernel["cls"]]
    for op in kernel["ops"][:MAX_CHAINS]:
        for name in ctx.trace.op_chain(op):
            if name in OWNED_OPS:
                return OWNED_OPS[name]
    return None


def _near_peak(ctx: Context, kernel: dict[str, Any]) -> dict[str, Any] | None:
    """How close the kernel runs to the device's memory bandwidth or to its peak for the precision, estimated
    from the launching op's recorded input shapes (bytes of its inputs; 2*M*N*K for a GEMM) and peaks.toml;
    None when the trace has no shapes or the device no entry there."""
    peaks = device_peaks(ctx.trace.device_name(kernel["device"]))
    if not peaks or not kernel["ops"] or not kernel["count"]:
        return None
    op = kernel["ops"][0]
    dims, types, _ = ctx.trace.op_input(op)
    if not dims or not types:
        return None
    tensors = [(d, t) for d, t in zip(dims, types, strict=False)
               if isinstance(d, list) and d and all(isinstance(x, int) for x in d) and t in ITEM_SIZE]
    if not tensors:
        return None
    seconds = kernel["us"] / kernel["count"] / 1e6
    moved = sum(math.prod(d) * ITEM_SIZE[t] for d, t in tensors)
    use = {"bandwidth_share": moved / seconds / (peaks["hbm_tbs"] * 1e12) if peaks.get("hbm_tbs") else 0.0,
           "compute_share": 0.0, "source": f"input shapes of {ctx.trace.op_names[op]} and peaks.toml "
                                             f"({peaks['name']})"}
    name = ctx.trace.op_names[op]
    if name in GEMM_OPS and len(tensors) >= 2:
        a, b = tensors[-2][0], tensors[-1][0]
        if name == "aten::linear":
            a, b = tensors[0][0], tensors[1][0][::-1]
        if len(a) >= 2 and len(b) >= 2 and a[-1] == b[-2]:
            flops = 2.0 * math.prod(a[:-1]) * a[-1] * b[-1]
            peak = peaks.get(PRECISION.get(tensors[0][1], ""))
            if peak:
                use["compute_share"] = flops / seconds / (peak * 1e12)
    use["share"] = max(use["bandwidth_share"], use["compute_share"])
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in use.items()}
