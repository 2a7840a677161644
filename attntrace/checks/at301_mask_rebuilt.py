"""AT301 mask-rebuilt: a causal or attention mask built again in every step or call."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import polars as pl

from attntrace.checks.base import Context, fmt_us

TRIANGLE_OPS = {"aten::tril", "aten::triu", "aten::tril_", "aten::triu_"}
BUILD_OPS = TRIANGLE_OPS | {"aten::ones", "aten::full", "aten::where", "aten::logical_not", "aten::scalar_tensor",
                            "aten::zeros", "aten::masked_fill", "aten::masked_fill_", "aten::bitwise_not"}


def _square_side(ctx: Context, op: int) -> int | None:
    dims, _, _ = ctx.trace.op_input(op)
    first = dims[0] if dims and isinstance(dims[0], list) else None
    if first and len(first) >= 2 and first[-1] == first[-2] and isinstance(first[-1], int):
        return first[-1]
    return None


def check(ctx: Context) -> list[dict[str, Any]]:
    ops = ctx.trace.ops_stepped.filter(pl.col("step").is_not_null() & pl.col("name").is_in(list(TRIANGLE_OPS)))
    parent = ctx.trace.op_parent
    cats = ctx.trace.ops["cat"].to_list()
    groups: dict[str, list[tuple[int, int, int]]] = defaultdict(list)  # caller chain -> (op, step, side)
    for op, step in ops.select("idx", "step").iter_rows():
        side = _square_side(ctx, op)
        if side is None or side < ctx.params["min_seq"]:
            continue
        # The same construction under different labels (record_function names) is one construction.
        callers = [ctx.trace.op_names[i] for i in ctx.trace.op_ancestors(parent[op]) if cats[i] != "user_annotation"]
        groups[" > ".join(callers) or "(top level)"].append((op, step, side))

    findings = []
    names = ctx.trace.op_names
    for caller, hits in sorted(groups.items()):
        steps_hit = sorted({s for _, s, _ in hits})
        sdpa_math = "_scaled_dot_product_attention_math" in caller
        # Without steps, a mask built once per call is still rebuilt: by the SDPA math backend on every call,
        # or by user code that the trace shows calling it more than once.
        steps = ctx.steps_of_ops(op for op, _, _ in hits)
        # Every step of every process it ran in (two ranks number their steps alike).
        pids = ctx.trace.op_pids
        rebuilt = (len({(pids[op], s) for op, s, _ in hits}) == steps if ctx.trace.has_step_markers
                   else sdpa_math or len(hits) > 1)
        if not rebuilt:
            continue
        # The whole construction: the triangle op and its mask-building siblings under the same caller.
        parents = {parent[op] for op, _, _ in hits}
        builders = {i for i, p in enumerate(parent) if p in parents and names[i] in BUILD_OPS}
        launched = ctx.gpu_under(builders)
        gpu_us, kernels = float(launched["dur"].sum()), launched.height
        side = hits[0][2]
        built = sorted({names[i] for i in builders})
        us_per_step = gpu_us / steps
        findings.append(ctx.finding(
            op=hits[0][0],
            key=caller,
            message=(f"a {side}x{side} causal mask is built {ctx.per_step(len(hits), 'time', steps=steps)} under "
                     f"{caller} ({', '.join(built)}; {ctx.per_step(kernels, 'kernel', steps=steps)}, "
                     f"{fmt_us(us_per_step)} GPU per "
                     f"{'step' if ctx.trace.has_step_markers else 'trace'})"),
            where={"op_chain": f"{caller} > {names[hits[0][0]]}", "kernel": None, "steps": steps_hit},
            evidence={"mask_shape": [side, side], "builds_per_step": len(hits) / steps,
                      "ops": built, "kernels_per_step": kernels / steps, "gpu_us_per_step": us_per_step,
                      "sdpa_math_backend": "aten::_scaled_dot_product_attention_math" in caller},
            gpu_us_per_step=us_per_step,
            fix=("SDPA's math backend builds this mask on every call: let SDPA use a fused backend "
                 "(flash/efficient/cuDNN take is_causal=True without a mask), or use FlexAttention with a "
                 "block mask made once." if "_scaled_dot_product_attention_math" in caller else
                 "Build the mask once (register_buffer, then slice) instead of in every call, or pass "
                 "is_causal=True to F.scaled_dot_product_attention and drop the mask."),
        ))
    return findings
