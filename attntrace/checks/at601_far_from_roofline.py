"""AT601 far-from-roofline: GEMM, convolution and attention ops far below their roofline bound, at a shape where
the hardware is shown to do far better (the same class near its roof elsewhere in the trace, or dimensions off
the tensor cores' alignment), that hold a real share of the step."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from attntrace.checks import at102_materialized_scores as at102
from attntrace.checks.base import Context, Skip, fmt_us
from attntrace.checks.catalog import load_rules
from attntrace.model import roofline

# Elements a tensor-core tile wants each GEMM dimension to be a multiple of (16 bytes of the input type).
ALIGNMENT = {"bf16": 8, "fp16": 8, "tf32": 4, "fp8": 16}
OWNED_OPS = {"aten::_scaled_dot_product_attention_math": "AT202"}  # the math backend's matmuls are AT202's
SHAPE_DIMS = re.compile(r"\[([0-9,]+)\]")
TINY_M = 16  # rows of a GEMM at or below which it is a matrix-vector product in all but name
LONG_SEQUENCE = 1024
KV_LEN = re.compile(r"Skv=([0-9]+)")


def _direction(shape: str) -> str:
    return "backward" if shape.endswith(" bwd") else "forward"


def _dims(shape: str) -> list[list[int]]:
    return [[int(x) for x in m.split(",") if x] for m in SHAPE_DIMS.findall(shape)]


def _misaligned(kind: str, shape: str, precision: str) -> list[str]:
    """What in the shape is off the tensor cores' alignment: GEMM dimensions M, N, K; convolution channels."""
    align = ALIGNMENT.get(precision)
    dims = _dims(shape)
    if align is None or len(dims) < 2:
        return []
    a, b = dims[0], dims[1]
    if kind == "gemm" and len(a) >= 2 and len(b) >= 2:
        named = {"M": a[-2], "K": a[-1], "N": b[-1]}
    elif kind == "conv" and len(a) >= 2 and len(b) >= 2:
        named = {"input channels": a[1], "output channels": b[0]}
    else:
        return []
    return [f"{name} = {value}" for name, value in named.items() if value % align]


def _kv_len(shape: str) -> int | None:
    found = KV_LEN.search(shape)
    return int(found.group(1)) if found else None


def _tiny(kind: str, shape: str) -> int | None:
    dims = _dims(shape)
    if kind == "gemm" and dims and len(dims[0]) >= 2 and dims[0][-2] <= TINY_M:
        return dims[0][-2]
    return None


def check(ctx: Context) -> list[dict[str, Any]]:
    trace = ctx.trace
    if not trace.has_shapes:
        raise Skip("no input shapes: capture with record_shapes=True")
    calls, _ = roofline.collect(trace)
    roofs = roofline.Roofs.of(trace.device_name(trace.devices[0] if trace.devices else None))
    if not roofs.name:
        raise Skip("no roofs for this device in attntrace/peaks.toml")
    steady = set(trace.steady_steps)
    names = trace.op_names
    # The matmuls of an unfused attention chain (and their backward): fusing the chain (AT102) removes them.
    unfused, sides = _unfused_attention(ctx)
    groups: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for call in calls:
        if call.cost.kind not in ("gemm", "conv", "attention") or not call.precision or call.precision == "fp32":
            continue  # FP32 on CUDA cores: AT201's
        if call.step is not None and steady and call.step not in steady:
            continue
        if call.op is not None and any(names[a] in OWNED_OPS for a in trace.op_ancestors(call.op)):
            continue
        verdict, at_us = roofline.bound(call.cost.hw_flops, call.cost.bytes, call.precision, roofs)
        if at_us is None:
            continue
        key = (call.cost.kind, call.precision, _direction(call.cost.shape), call.name + "|" + call.cost.shape)
        row = groups.setdefault(key, {"us": 0.0, "bound_us": 0.0, "flops": 0.0, "bytes": 0.0, "calls": 0,
                                      "bound": verdict, "kernels": defaultdict(float), "op": call.op,
                                      "name": call.name, "shape": call.cost.shape, "ops": set(), "steps": set(),
                                      "in_unfused_attention": True})
        row["us"] += call.us
        row["bound_us"] += at_us
        row["flops"] += call.cost.hw_flops
        row["bytes"] += call.cost.bytes
        row["calls"] += 1
        row["ops"].add(call.op)
        row["in_unfused_attention"] &= _in_unfused(ctx, call, unfused, sides)
        if call.step is not None:
            row["steps"].add(call.step)
        for kernel, us in call.kernels.items():
            row["kernels"][kernel] += us
    steps = max(1, len(steady) or trace.step_count)
    by_class: dict[tuple[str, str, str], list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for (kind, precision, direction, signature), row in groups.items():
        if row["us"] > 0:
            row["share"] = row["bound_us"] / row["us"]
            by_class[(kind, precision, direction)].append((signature, row))
    findings = []
    for (kind, precision, direction), rows in sorted(by_class.items()):
        for signature, row in sorted(rows, key=lambda r: (-r[1]["us"], r[0])):
            finding = _judge(ctx, kind, precision, direction, signature, row, rows, steps)
            if finding:
                findings.append(finding)
    return findings


def _unfused_attention(ctx: Context) -> tuple[set[int], set[int]]:
    """AT102's unfused attention chains: their ops (and the backward nodes it links to them), and the sides S of
    their S x S score tensors."""
    min_seq = load_rules()["AT102"].parameters["min_seq"].default
    ops = at102.chain_ops(ctx, min_seq)
    sides = set()
    if ctx.trace.has_shapes:
        groups, _, _ = at102.unfused_chains(ctx, min_seq)
        for hits in groups.values():
            for hit in hits:
                dims, _, _ = ctx.trace.op_input(hit[0])  # the softmax: [.., S, S]
                if dims and isinstance(dims[0], list) and dims[0] and isinstance(dims[0][-1], int):
                    sides.add(dims[0][-1])
    return ops, sides


def _in_unfused(ctx: Context, call: roofline.OpCall, ops: set[int], sides: set[int]) -> bool:
    """A matmul of an unfused attention chain: in the chain AT102 found, or, in the backward, a product that
    reads or writes an S x S score tensor of one (its gradient: fusing the forward removes these too)."""
    if call.op is None:
        return False
    ancestors = ctx.trace.op_ancestors(call.op)
    if set(ancestors) & ops:
        return True
    if not sides or not any("autograd::engine" in ctx.trace.op_names[a] for a in ancestors):
        return False
    dims = _dims(call.cost.shape)
    if len(dims) < 2 or len(dims[0]) < 2 or len(dims[1]) < 2:
        return False
    a, b = dims[0], dims[1]
    return any(shape[-2:] == [side, side] for side in sides for shape in (a, b, [a[-2], b[-1]]))


def _judge(ctx: Context, kind: str, precision: str, direction: str, signature: str, row: dict[str, Any],
           rows: list[tuple[str, dict[str, Any]]], steps: int) -> dict[str, Any] | None:
    us_per_step = row["us"] / steps
    share = row["share"]
    if share > ctx.params["max_share_of_bound"] or us_per_step < ctx.params["min_gpu_us"]:
        return None
    if ctx.step_us and us_per_step / ctx.step_us < ctx.params["min_step_share"]:
        return None
    # What the class reaches elsewhere: the best share of its bound among the other signatures that ran long
    # enough to be measured (a few microseconds are launch latency more than rate).
    others = [(s, r) for s, r in rows if s != signature and r["us"] / steps >= ctx.params["min_gpu_us"] / 4]
    reference = max(others, key=lambda sr: (sr[1]["share"], sr[0]), default=None)
    misaligned = _misaligned(kind, row["shape"], precision)
    tiny = _tiny(kind, row["shape"])
    shown = reference is not None and reference[1]["share"] >= ctx.params["min_gap"] * share
    kv_len = _kv_len(row["shape"]) if kind == "attention" else None
    slow_attention = kv_len is not None and kv_len >= LONG_SEQUENCE and share <= ctx.params["attention_min_share"]
    if not shown and not misaligned and not slow_attention:
        return None
    if shown and reference:
        target = min(1.0, reference[1]["share"])
    else:
        target = ctx.params["attention_expected_share"] if slow_attention else ctx.params["expected_share"]
    saving = max(0.0, row["us"] - row["bound_us"] / target) / steps
    if saving <= 0:
        return None
    seconds = row["us"] * 1e-6
    tflops = row["flops"] / seconds / 1e12 if seconds else 0.0
    tbs = row["bytes"] / seconds / 1e12 if seconds else 0.0
    kernel = max(row["kernels"], key=lambda k: (row["kernels"][k], k))
    rate = f"{tflops:.1f} TFLOP/s" if row["bound"] == "compute" else f"{tbs:.2f} TB/s"
    why = []
    if misaligned:
        why.append(f"{', '.join(misaligned)} not a multiple of {ALIGNMENT[precision]} for {precision} tensor cores")
    if tiny is not None:
        why.append(f"M = {tiny} rows: a matrix-vector product in all but name")
    if slow_attention and not shown:
        why.append(f"attention over {kv_len} keys, where the fused backends reach "
                   f"{100 * ctx.params['attention_expected_share']:.0f}% of the bound or more")
    if shown and reference:
        ref = reference[1]
        ref_rate = ref["flops"] / (ref["us"] * 1e-6) / 1e12
        why.append(f"{ref['name']} {ref['shape']} reaches {100 * ref['share']:.0f}% of its bound "
                   f"({ref_rate:.0f} TFLOP/s) in this trace")
    fix = _fix(ctx, kind, misaligned, tiny)
    direction_text = " backward" if direction == "backward" and kind == "attention" else ""
    message = (f"{row['name']} {row['shape']} ({precision}{direction_text}) runs at {rate}, "
               f"{100 * share:.0f}% of its {row['bound']} bound, {fmt_us(us_per_step)} {ctx.each_step} "
               + (f"({100 * us_per_step / ctx.step_us:.1f}% of the step)" if ctx.step_us else "") + ": "
               + "; ".join(why))
    assumption = (f"if it reached the {100 * target:.0f}% of its bound that "
                  + (f"{reference[1]['name']} {reference[1]['shape']} reaches in this trace" if shown and reference
                     else "FlashAttention-2 reaches on an H200 (attention_expected_share)" if slow_attention
                     else "a well-aligned shape reaches (expected_share)"))
    ref_evidence = None
    if reference is not None:
        ref = reference[1]
        ref_evidence = {"op": ref["name"], "shape": ref["shape"], "share_of_bound": ref["share"],
                        "tflops": ref["flops"] / (ref["us"] * 1e-6) / 1e12,
                        "gpu_us_per_step": ref["us"] / steps}
    op = row["op"]
    return ctx.finding(
        key=f"{kind}|{precision}|{direction}|{signature}",
        message=message,
        where={"op_chain": " > ".join(ctx.trace.op_chain(op)) if op is not None else None, "kernel": kernel,
               "steps": sorted(row["steps"])},
        evidence={"op": row["name"], "shape": row["shape"], "precision": precision, "op_class": kind,
                  "calls_per_step": row["calls"] / steps, "gpu_us_per_step": us_per_step,
                  "achieved_tflops": tflops, "achieved_tbs": tbs, "bound": row["bound"],
                  "bound_us_per_step": row["bound_us"] / steps, "share_of_bound": share,
                  "roof_tflops": ctx_roof(ctx, precision), "misaligned": misaligned or None,
                  "reference": ref_evidence, "in_unfused_attention": row["in_unfused_attention"]},
        gpu_us_per_step=saving,
        assumption=assumption,
        fix=fix,
        op=op,
    )


def ctx_roof(ctx: Context, precision: str) -> float | None:
    roofs = roofline.Roofs.of(ctx.trace.device_name(ctx.trace.devices[0] if ctx.trace.devices else None))
    return roofs.roof.get(precision)


def _fix(ctx: Context, kind: str, misaligned: list[str], tiny: int | None) -> str:
    if misaligned and kind == "gemm":
        return ("Pad the GEMM's dimensions to a multiple of 8 for bf16/fp16 (64 is better): round the model's "
                "hidden, FFN and vocabulary sizes up (e.g. `model.resize_token_embeddings(n, pad_to_multiple_of=64)` "
                "in Hugging Face), or pad the inputs and slice the output.")
    if misaligned and kind == "conv":
        return ("Pad the channels to a multiple of 8 (16-bit) or 4 (TF32), e.g. the input image's 3 channels to 4 "
                "with a zero channel, and use channels_last (`model.to(memory_format=torch.channels_last)`).")
    if tiny is not None:
        return "Batch more rows per call (more sequences or tokens per step): a GEMM on a few rows is bound by memory."
    if kind == "attention":
        return ("Measure the other attention backends at this shape: `attntrace run --from-trace "
                f"{ctx.trace.path}` (flash, cuDNN, memory-efficient, FlexAttention).")
    return str(ctx.rule.docs["fix"]).strip()
