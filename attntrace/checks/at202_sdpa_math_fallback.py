"""AT202 sdpa-math-fallback: SDPA ran its unfused math backend, and the likely reason."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.checks.base import Context, fmt_us
from attntrace.checks.measure_hint import point_to_measurement

MATH = "aten::_scaled_dot_product_attention_math"
SDPA = "aten::scaled_dot_product_attention"
HALF = {"c10::BFloat16", "c10::Half"}


# What each reason means and the one change that removes it; the message and the fix say the same thing.
FIXES = {
    "fp64": "Run attention in fp32/bf16/fp16: no fused SDPA backend takes float64.",
    "mask-and-causal": ("Pass either `is_causal=True` or an `attn_mask`, not both: fold the causal part into the "
                        "mask, or drop the mask when it is only causal."),
    "dtype": "Cast q, k and v to bf16/fp16 (or fp32) before SDPA.",
    "head-dim": "Pad the head dim to a multiple of 8 (and slice the output), so that a fused kernel takes it.",
    "gqa-fp32": ("Run attention in bf16/fp16 (`torch.autocast(\"cuda\", dtype=torch.bfloat16)`), where flash and "
                 "cuDNN take grouped-query heads; or, to stay in fp32, expand k and v to the query heads "
                 "(`k.repeat_interleave(q.size(-3) // k.size(-3), dim=-3)`) so that the memory-efficient backend "
                 "takes it."),
    "gqa-old-torch": ("Expand k and v to the query heads before SDPA (`repeat_interleave` on the head dim) or "
                      "upgrade PyTorch (2.5 and later take `enable_gqa=True` in flash and cuDNN)."),
    "head-dim-large": ("Keep the head dim at 256 or less for flash and cuDNN; above that only the "
                       "memory-efficient backend can run it, in fp16/bf16/fp32 on sm80 and later: check that it "
                       "is not disabled."),
    "not-shown": ("Let SDPA choose: no `sdpa_kernel(SDPBackend.MATH)` pin, fused backends enabled, and an "
                  "attn_mask passed contiguous (`mask.contiguous()`, not a slice or an expanded view). Check "
                  "with `torch.nn.attention.sdpa_kernel([SDPBackend.FLASH_ATTENTION, "
                  "SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION])`, which raises with the reason "
                  "when no fused kernel fits."),
}
FIXES["unknown"] = FIXES["not-shown"]


def _heads(dims: Any, position: int) -> int | None:
    shape = dims[position] if len(dims) > position and isinstance(dims[position], list) else []
    return shape[-3] if len(shape) >= 3 and isinstance(shape[-3], int) else None


def _concrete(concrete: Any, position: int) -> str:
    return str(concrete[position]).lower() if concrete and len(concrete) > position else ""


def _reason(ctx: Context, sdpa_op: int | None, math_op: int, device: dict[str, Any]) -> tuple[str, str]:
    """(reason id, sentence) from the SDPA call's recorded inputs (q, k, v, attn_mask, dropout_p, is_causal,
    scale, enable_gqa) and from what ran inside the math backend; "not-shown" names what the trace shows."""
    if sdpa_op is None:
        return "unknown", "the trace does not show the SDPA call's inputs"
    dims, types, concrete = ctx.trace.op_input(sdpa_op)
    if not dims or not types:
        return "unknown", "the inputs are not in the trace (capture with record_shapes=True to see why)"
    q_dims = dims[0] if isinstance(dims[0], list) else []
    dtype = str(types[0]).removeprefix("c10::")
    head_dim = q_dims[-1] if q_dims else None
    has_mask = len(dims) > 3 and isinstance(dims[3], list) and len(dims[3]) > 0
    causal = _concrete(concrete, 5) == "true"
    q_heads, kv_heads = _heads(dims, 0), _heads(dims, 1)
    repeats = any(ctx.trace.op_names[child] == "aten::repeat_interleave"
                  for child in ctx.trace.op_children.get(math_op, ()))
    grouped = (q_heads is not None and kv_heads is not None and q_heads != kv_heads) or \
        _concrete(concrete, 7) == "true" or repeats
    gqa = (f"grouped-query heads (q {q_heads} heads, k/v {kv_heads})" if q_heads and kv_heads and q_heads != kv_heads
           else "grouped-query heads (enable_gqa=True" + (", repeat_interleave inside the math backend)"
                                                          if repeats else ")"))
    if types[0] == "double":
        return "fp64", "float64 inputs: only the math backend takes them"
    if has_mask and causal:
        return "mask-and-causal", "an explicit attn_mask together with is_causal=True: the fused kernels take one"
    if types[0] not in HALF and types[0] != "float":
        return "dtype", f"{dtype} inputs, which the fused kernels do not take"
    if isinstance(head_dim, int) and head_dim % 8:
        return "head-dim", f"head dim {head_dim} is not a multiple of 8, which the fused kernels need"
    if grouped and types[0] == "float":
        return "gqa-fp32", (f"{gqa} in fp32: the memory-efficient backend refuses grouped-query heads, and "
                            "flash and cuDNN take them only in fp16/bf16, so no fused kernel fits")
    major = device.get("computeMajor")
    old_gpu = isinstance(major, int) and major < 8
    facts = [dtype, f"head dim {head_dim}", "with mask" if has_mask else "no mask"]
    if grouped:
        facts.append(gqa)
    dropout = _concrete(concrete, 4)
    if dropout not in ("", "0", "0.0", "0."):
        facts.append(f"dropout_p={dropout}")
    if isinstance(head_dim, int) and head_dim > 256:
        if types[0] == "float" or old_gpu:
            return "head-dim-large", (f"head dim {head_dim} is above flash's and cuDNN's limit of 256, and the "
                                      f"memory-efficient backend could not take it either ({', '.join(facts)})")
        return "head-dim-large", (f"head dim {head_dim} is above flash's and cuDNN's limit of 256; only the "
                                  f"memory-efficient backend could take it ({', '.join(facts)})")
    if types[0] == "float":
        eligible = "memory-efficient (flash and cuDNN need fp16/bf16)"
    elif old_gpu:
        eligible = "memory-efficient (flash and cuDNN need compute capability 8.0)"
    elif grouped:
        eligible = "cuDNN (with enable_gqa=True, PyTorch 2.5 and later; flash takes no mask)" if has_mask else \
            "flash and cuDNN (with enable_gqa=True, PyTorch 2.5 and later)"
    elif has_mask:
        eligible = "memory-efficient and cuDNN (flash takes no attn_mask)"
    else:
        eligible = "flash, memory-efficient and cuDNN"
    # The trace cannot show why a backend declined: name what it shows and list what else can cause it, the
    # mask's own layout first where there is a mask (the fused kernels that take one refuse some layouts and
    # strides; a pinned backend would send every call to math, not only the masked ones).
    causes = ["the math backend pinned (sdpa_kernel(SDPBackend.MATH)) or the fused backends disabled",
              "a mask layout or strides this PyTorch version's fused kernels do not support (a sliced or expanded "
              "mask: pass it `.contiguous()`)"]
    if has_mask:
        causes.reverse()
    return "not-shown", (f"the trace shows nothing a fused kernel would refuse ({', '.join(facts)}; {eligible} "
                         f"could take it). Possible causes: {'; '.join(causes)}; deterministic algorithms on; ROCm "
                         "limits. PyTorch's warning at the first call names the reason")


def _fix_variant(ctx: Context, math_op: int) -> str | None:
    """Which of a framework's fixes fits the call (rules/frameworks.toml, "AT202.mask" and "AT202.fp32"): one
    about its mask only where the call has one (Hugging Face's fix told a call with is_causal=True and no mask to
    stop passing a mask), one about the dtype where the inputs are fp32; else the plain PyTorch fix alone."""
    parent = ctx.trace.op_parent[math_op]
    sdpa_op = parent if parent is not None and ctx.trace.op_names[parent] == SDPA else math_op
    dims, types, _ = ctx.trace.op_input(sdpa_op)
    if dims and len(dims) > 3 and isinstance(dims[3], list) and dims[3]:
        return "mask"
    return "fp32" if types and types[0] == "float" else None


def check(ctx: Context) -> list[dict[str, Any]]:
    names = ctx.trace.op_names
    maths = ctx.trace.ops_stepped.filter(pl.col("step").is_not_null() & (pl.col("name") == MATH))
    groups: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
    for op, step in maths.select("idx", "step").iter_rows():
        parent = ctx.trace.op_parent[op]
        sdpa_op = parent if parent is not None and names[parent] == SDPA else None
        ran_on = ctx.gpu_under({op})["device"].drop_nulls()
        device = ctx.trace.meta.device(int(ran_on[0]) if ran_on.len() else None)
        reason, sentence = _reason(ctx, sdpa_op if sdpa_op is not None else op, op, device)
        chain = " > ".join(ctx.trace.op_chain(op))
        groups.setdefault((reason, sentence, chain), []).append((op, step))
    findings = []
    for (reason, sentence, chain), hits in sorted(groups.items()):
        rows = ctx.gpu_under({op for op, _ in hits})
        steps = ctx.steps_of_ops(op for op, _ in hits)
        us_per_step = float(rows["dur"].sum()) / steps
        per_step = len(hits) / steps
        speedup = ctx.params["expected_speedup"]
        findings.append(ctx.finding(
            op=hits[0][0],
            key=f"{reason}|{chain}",
            message=(f"SDPA ran the math backend: {ctx.per_step(len(hits), 'call', steps=steps)} "
                     f"({rows.height / len(hits):.0f} kernels per call, {fmt_us(us_per_step)} GPU {ctx.each_step}): "
                     f"{sentence}"),
            where={"op_chain": chain, "kernel": None, "steps": sorted({s for _, s in hits})},
            evidence={"reason": reason, "calls_per_step": per_step, "kernels_per_call": rows.height / len(hits),
                      "gpu_us_per_step": us_per_step, "assumed_fused_speedup": ctx.params["expected_speedup"]},
            gpu_us_per_step=us_per_step * (1 - 1 / speedup),
            assumption=f"if a fused backend runs these calls {speedup:g}x faster than math",
            fix=FIXES[reason],
            fix_variant=_fix_variant(ctx, hits[0][0]),
        ))
    return point_to_measurement(ctx, findings)
