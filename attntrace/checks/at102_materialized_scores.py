"""AT102 materialized-scores: unfused attention writing an S x S score tensor to memory and reading it back."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import polars as pl

from attntrace.checks.base import ITEM_SIZE, Context, fmt_bytes, fmt_us

SOFTMAX = {"aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::log_softmax"}
MATMUL = {"aten::matmul", "aten::bmm", "aten::baddbmm", "aten::einsum"}
SDPA = "aten::scaled_dot_product_attention"


def _dims(ctx: Context, op: int) -> tuple[list[Any], list[str]]:
    dims, types, _ = ctx.trace.op_input(op)
    return (dims if isinstance(dims, list) else []), (types if isinstance(types, list) else [])


def _square(shape: Any, side: int | None = None) -> int | None:
    if isinstance(shape, list) and len(shape) >= 2 and all(isinstance(d, int) for d in shape[-2:]) \
            and shape[-1] == shape[-2] and (side is None or shape[-1] == side):
        return shape[-1]
    return None


def _numel(shape: list[int]) -> int:
    out = 1
    for d in shape:
        out *= d if isinstance(d, int) else 1
    return out


def _chain_around(ctx: Context, softmax: int, side: int) -> list[int] | None:
    """The sibling ops from the matmul that makes the S x S scores to the matmul that consumes them."""
    siblings = ctx.trace.op_children.get(ctx.trace.op_parent[softmax], [])
    at = siblings.index(softmax)
    names = ctx.trace.op_names
    start = end = None
    for i in range(at - 1, max(-1, at - 8), -1):  # scale and mask take a few ops at most
        op = siblings[i]
        dims, _ = _dims(ctx, op)
        if names[op] in MATMUL and len(dims) >= 2 and isinstance(dims[0], list) and isinstance(dims[1], list) \
                and dims[0][-2:-1] == [side] and dims[1][-1:] == [side]:
            start = i
            break
    for i in range(at + 1, min(len(siblings), at + 6)):
        op = siblings[i]
        dims, _ = _dims(ctx, op)
        if names[op] in MATMUL and dims and _square(dims[0], side):
            end = i
            break
    if start is None or end is None:
        return None
    return siblings[start:end + 1]


def check(ctx: Context) -> list[dict[str, Any]]:
    names = ctx.trace.op_names
    candidates = ctx.trace.ops_stepped.filter(pl.col("step").is_not_null() & pl.col("name").is_in(list(SOFTMAX)))
    groups: dict[str, list[tuple[int, int, list[int], int, int]]] = defaultdict(list)
    for op, step in candidates.select("idx", "step").iter_rows():
        ancestors = [names[a] for a in ctx.trace.op_ancestors(op)]
        if any(SDPA in a or "autograd::engine" in a for a in ancestors):
            continue  # SDPA's math backend is AT202's; backward ops replay the forward
        dims, types = _dims(ctx, op)
        side = _square(dims[0]) if dims else None
        if side is None or side < ctx.params["min_seq"]:
            continue
        chain = _chain_around(ctx, op, side)
        if chain is None:
            continue
        score_bytes = _numel(dims[0]) * ITEM_SIZE.get(types[0] if types else "", 2)
        pattern = " > ".join(names[o] for o in chain)  # the attention op chain, in call order
        groups[pattern].append((op, step, chain, side, score_bytes))

    findings = []
    for pattern, hits in sorted(groups.items()):
        per_step = len(hits) / ctx.step_count
        score_bytes = hits[0][4]
        # Each op between the two matmuls that launches GPU work reads and writes the S x S tensor once
        # (views such as slices launch none), once more for a copy it makes; the first matmul writes the
        # tensor and the last one reads it.
        launched = ctx.gpu_under({o for _, _, chain, _, _ in hits for o in chain[1:-1]})
        gpu_us = float(launched["dur"].sum())
        copies = launched.group_by("under").agg((pl.col("kind") == "memcpy").any().alias("copies"))["copies"]
        passes = 2 + sum(2 + 2 * copied for copied in copies.to_list()) / len(hits)
        moved = passes * score_bytes * per_step
        us_per_step = gpu_us / ctx.step_count
        side = hits[0][3]
        findings.append(ctx.finding(
            op=hits[0][0],
            key=pattern,
            message=(f"unfused attention materialises a {side}x{side} score tensor ({fmt_bytes(score_bytes)}) "
                     f"{ctx.per_step(len(hits), 'time')} via {pattern}: about {fmt_bytes(moved)} of memory traffic "
                     "per step "
                     f"and {fmt_us(us_per_step)} of GPU time in the elementwise and softmax kernels"),
            where={"op_chain": pattern, "kernel": None, "steps": sorted({s for _, s, _, _, _ in hits})},
            evidence={"seq_len": side, "score_shape": _dims(ctx, hits[0][0])[0][0], "score_bytes": score_bytes,
                      "calls_per_step": per_step, "memory_passes": passes, "bytes_per_step": moved,
                      "memory_saved_bytes_per_call": 2 * score_bytes, "gpu_us_per_step": us_per_step},
            gpu_us_per_step=us_per_step,
            fix=ctx.rule.docs["fix"],
        ))
    return findings
