"""AT202 sdpa-math-fallback: SDPA ran its unfused math backend, and the likely reason."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.checks.base import Context, fmt_us
from attntrace.checks.measure_hint import point_to_measurement

MATH = "aten::_scaled_dot_product_attention_math"
SDPA = "aten::scaled_dot_product_attention"
HALF = {"c10::BFloat16", "c10::Half"}


def _reason(ctx: Context, sdpa_op: int | None, device: dict[str, Any]) -> tuple[str, str]:
    """(reason id, sentence) from the SDPA call's inputs: q, k, v, attn_mask, dropout_p, is_causal, ..."""
    if sdpa_op is None:
        return "unknown", "the trace does not show the SDPA call's inputs"
    dims, types, concrete = ctx.trace.op_input(sdpa_op)
    if not dims or not types:
        return "unknown", "the inputs are not in the trace (capture with record_shapes=True to see why)"
    q_dims = dims[0] if isinstance(dims[0], list) else []
    dtype = str(types[0]).removeprefix("c10::")
    head_dim = q_dims[-1] if q_dims else None
    has_mask = len(dims) > 3 and isinstance(dims[3], list) and len(dims[3]) > 0
    causal = bool(concrete and len(concrete) > 5 and str(concrete[5]).lower() == "true")
    if types[0] == "double":
        return "fp64", "float64 inputs: only the math backend takes them"
    if has_mask and causal:
        return "mask-and-causal", "an explicit attn_mask together with is_causal=True: the fused kernels take one"
    if types[0] not in HALF and types[0] != "float":
        return "dtype", f"{dtype} inputs, which the fused kernels do not take"
    if isinstance(head_dim, int) and head_dim % 8:
        return "head-dim", (f"head dim {head_dim} is not a multiple of 8, which the fused kernels need: pad the "
                            "head dim to a multiple of 8")
    major = device.get("computeMajor")
    old_gpu = isinstance(major, int) and major < 8
    if types[0] == "float":
        eligible = "memory-efficient (flash and cuDNN need fp16/bf16)"
    elif isinstance(head_dim, int) and head_dim > 256:
        eligible = "memory-efficient (flash and cuDNN stop at head dim 256)"
    elif old_gpu:
        eligible = "memory-efficient (flash and cuDNN need compute capability 8.0)"
    else:
        eligible = "flash, memory-efficient and cuDNN"
    what = f"{dtype}, head dim {head_dim}, {'with' if has_mask else 'no'} mask"
    # The trace cannot show why a backend declined: name what it shows and list what else can cause it.
    return "not-shown", (f"the trace shows nothing a fused kernel would refuse ({what}; {eligible} could take "
                         "it). Possible causes: the math backend pinned (sdpa_kernel(SDPBackend.MATH)) or the "
                         "fused backends disabled; dropout, grouped-query heads or a mask layout this PyTorch "
                         "version's fused kernels do not support; deterministic algorithms on; ROCm limits; "
                         "an older GPU. PyTorch's warning at the first call names the reason")


def check(ctx: Context) -> list[dict[str, Any]]:
    names = ctx.trace.op_names
    maths = ctx.trace.ops_stepped.filter(pl.col("step").is_not_null() & (pl.col("name") == MATH))
    groups: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
    for op, step in maths.select("idx", "step").iter_rows():
        parent = ctx.trace.op_parent[op]
        sdpa_op = parent if parent is not None and names[parent] == SDPA else None
        ran_on = ctx.gpu_under({op})["device"].drop_nulls()
        device = ctx.trace.meta.device(int(ran_on[0]) if ran_on.len() else None)
        reason, sentence = _reason(ctx, sdpa_op if sdpa_op is not None else op, device)
        chain = " > ".join(ctx.trace.op_chain(op))
        groups.setdefault((reason, sentence, chain), []).append((op, step))
    findings = []
    for (reason, sentence, chain), hits in sorted(groups.items()):
        rows = ctx.gpu_under({op for op, _ in hits})
        us_per_step = float(rows["dur"].sum()) / ctx.step_count
        per_step = len(hits) / ctx.step_count
        findings.append(ctx.finding(
            op=hits[0][0],
            key=f"{reason}|{chain}",
            message=(f"SDPA ran the math backend: {ctx.per_step(len(hits), 'call')} "
                     f"({rows.height / len(hits):.0f} kernels per call, {fmt_us(us_per_step)} GPU {ctx.each_step}): "
                     f"{sentence}"),
            where={"op_chain": chain, "kernel": None, "steps": sorted({s for _, s in hits})},
            evidence={"reason": reason, "calls_per_step": per_step, "kernels_per_call": rows.height / len(hits),
                      "gpu_us_per_step": us_per_step, "assumed_fused_speedup": ctx.params["expected_speedup"]},
            gpu_us_per_step=us_per_step * (1 - 1 / ctx.params["expected_speedup"]),
            fix=ctx.rule.docs["fix"],
        ))
    return point_to_measurement(ctx, findings)
