"""AT102 materialized-scores: unfused attention writing an S x S score tensor to memory and reading it back."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

import polars as pl

from attntrace.checks.base import ITEM_SIZE, Context, fmt_bytes, fmt_us
from attntrace.checks.measure_hint import point_to_measurement
from attntrace.model.peaks import device_peaks

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


TRIANGLE = {"aten::tril", "aten::triu", "aten::tril_", "aten::triu_"}
# An autograd node's own op ("SoftmaxBackward0"), not the engine's wrapper around it.
AUTOGRAD_NODE = r"^[A-Za-z0-9]+Backward[0-9]*$"
FUSED_MAX_HEAD_DIM = 256  # flash and cuDNN SDPA stop here; memory-efficient may then be slower than the chain
LOOK_BACK, LOOK_AHEAD = 12, 8  # ops between the score matmul and softmax (scale, bias, masks), and after


def _operands(ctx: Context, op: int) -> list[Any]:
    """The two matrices of a matmul-like op (baddbmm's come after its bias)."""
    dims, _ = _dims(ctx, op)
    return dims[1:3] if ctx.trace.op_names[op] == "aten::baddbmm" else dims[:2]


def _thread_sequence(ctx: Context) -> tuple[list[int], dict[int, int]]:
    """The ops the user's code called, per thread in call order: those under nothing but annotations
    (record_function, module and step markers). An attention written across helper functions is one run."""
    parent = ctx.trace.op_parent
    cats = ctx.trace.op_cats
    inside: dict[int, bool] = {}  # per annotation op: whether a real op is above it

    def internal(op: int) -> bool:
        """Whether an op that is not an annotation is above `op` (annotations' answers kept on the way up)."""
        passed: list[int] = []
        up, found = parent[op], False
        while up is not None:
            if cats[up] != "user_annotation":
                found = True
                break
            if up in inside:
                found = inside[up]
                break
            passed.append(up)
            up = parent[up]
        if passed:
            inside.update(dict.fromkeys(passed, found))
        return found

    order = ctx.trace.ops.sort(["pid", "tid", "ts"]).select("idx")["idx"].to_list()
    sequence = [op for op in order if cats[op] != "user_annotation" and not internal(op)]
    return sequence, {op: i for i, op in enumerate(sequence)}


def _chain_around(ctx: Context, softmax: int, side: int, sequence: list[int], position: dict[int, int]
                  ) -> list[int] | None:
    """The ops from the matmul that makes the S x S scores to the matmul that consumes them."""
    names = ctx.trace.op_names
    at = position.get(softmax)
    if at is None:
        return None
    start = end = None
    for i in range(at - 1, max(-1, at - LOOK_BACK), -1):
        op = sequence[i]
        pair = _operands(ctx, op) if names[op] in MATMUL else []
        if len(pair) == 2 and isinstance(pair[0], list) and isinstance(pair[1], list) \
                and pair[0][-2:-1] == [side] and pair[1][-1:] == [side]:
            start = i
            break
    for i in range(at + 1, min(len(sequence), at + LOOK_AHEAD)):
        op = sequence[i]
        pair = _operands(ctx, op) if names[op] in MATMUL else []
        if pair and _square(pair[0], side):
            end = i
            break
    if start is None or end is None:
        return None
    return sequence[start:end + 1]


Hit = tuple[int, int, list[int], int, int]  # softmax op, step, chain of ops, sequence length, score bytes


def unfused_chains(ctx: Context, min_seq: int) -> tuple[dict[str, list[Hit]], list[int], dict[int, int]]:
    """Every unfused attention chain in the steps, grouped by its op names; with the thread sequence they were
    found in. AT101 uses it to tell the copies that fusing the chain removes (computed once per trace)."""
    key = (unfused_chains, min_seq)
    if key not in ctx.trace.shared:
        ctx.trace.shared[key] = _unfused_chains(ctx, min_seq)
    return ctx.trace.shared[key]  # type: ignore[no-any-return]


def _unfused_chains(ctx: Context, min_seq: int) -> tuple[dict[str, list[Hit]], list[int], dict[int, int]]:
    names = ctx.trace.op_names
    candidates = ctx.trace.ops_stepped.filter(pl.col("step").is_not_null() & pl.col("name").is_in(list(SOFTMAX)))
    groups: dict[str, list[Hit]] = defaultdict(list)
    sequence, position = _thread_sequence(ctx) if candidates.height else ([], {})
    for op, step in candidates.select("idx", "step").iter_rows():
        ancestors = [names[a] for a in ctx.trace.op_ancestors(op)]
        if any(SDPA in a or "autograd::engine" in a for a in ancestors):
            continue  # SDPA's math backend is AT202's; backward ops replay the forward
        dims, types = _dims(ctx, op)
        side = _square(dims[0]) if dims else None
        if side is None or side < min_seq:
            continue
        chain = _chain_around(ctx, op, side, sequence, position)
        if chain is None:
            continue
        score_bytes = _numel(dims[0]) * ITEM_SIZE.get(types[0] if types else "", 2)
        pattern = " > ".join(names[o] for o in chain)  # the attention op chain, in call order
        groups[pattern].append((op, step, chain, side, score_bytes))
    return groups, sequence, position


def _chain_by_names(ctx: Context, softmax: int, sequence: list[int], position: dict[int, int]) -> list[int] | None:
    """Without recorded shapes: a matmul-like op shortly before the softmax and one shortly after it, with no
    other matmul between them (scale, mask and dropout ops only): the unfused attention's op pattern."""
    names = ctx.trace.op_names
    at = position.get(softmax)
    if at is None:
        return None
    start = next((i for i in range(at - 1, max(-1, at - LOOK_BACK), -1) if names[sequence[i]] in MATMUL), None)
    end = next((i for i in range(at + 1, min(len(sequence), at + LOOK_AHEAD)) if names[sequence[i]] in MATMUL),
               None)
    if start is None or end is None:
        return None
    return sequence[start:end + 1]


NamedChains = tuple[dict[str, list[tuple[int, int, list[int]]]], list[int], dict[int, int]]


def chains_by_names(ctx: Context) -> NamedChains:
    """Without recorded shapes: every unfused attention chain found by its op names, grouped by them (softmax op,
    step, chain), with the thread sequence they were found in; computed once per trace (AT101 asks too)."""
    key = chains_by_names
    if key not in ctx.trace.shared:
        names = ctx.trace.op_names
        candidates = ctx.trace.ops_stepped.filter(pl.col("step").is_not_null()
                                                  & pl.col("name").is_in(list(SOFTMAX)))
        sequence, position = _thread_sequence(ctx) if candidates.height else ([], {})
        groups: dict[str, list[tuple[int, int, list[int]]]] = defaultdict(list)
        for op, step in candidates.select("idx", "step").iter_rows():
            if any(SDPA in names[a] or "autograd::engine" in names[a] for a in ctx.trace.op_ancestors(op)):
                continue
            chain = _chain_by_names(ctx, op, sequence, position)
            if chain is not None:
                groups[" > ".join(names[o] for o in chain)].append((op, step, chain))
        ctx.trace.shared[key] = (dict(groups), sequence, position)
    return ctx.trace.shared[key]  # type: ignore[no-any-return]


def chain_ops(ctx: Context, min_seq: int) -> set[int]:
    """The ops of every unfused attention chain AT102 reports, and the autograd nodes of their backward whose time
    it counts: by shapes where they were recorded, else by names (the forward ops, and the softmax's backward
    where it can only be theirs)."""
    if not ctx.trace.has_shapes:
        groups = chains_by_names(ctx)[0]
        forward = {op for hits in groups.values() for _, _, chain in hits for op in chain}
        return forward.union(*_softmax_backward_by_names(ctx, groups).values())
    groups, _, _ = unfused_chains(ctx, min_seq)
    forward = {op for hits in groups.values() for _, _, chain, _, _ in hits for op in chain}
    return forward.union(*_backward_by_chain(ctx, groups).values())


def _softmax_backward_by_names(ctx: Context,
                               groups: dict[str, list[tuple[int, int, list[int]]]]) -> dict[str, set[int]]:
    """Without shapes: the SoftmaxBackward nodes of the one chain pattern found, where there are as many of them in
    the steps as the chains have softmaxes (then no other softmax has a gradient; Llama eager training without
    shapes claimed its forward alone, 1.42 ms, where with shapes the chain's backward added 0.88 ms)."""
    if len(groups) != 1:
        return {}
    ((pattern, hits),) = groups.items()
    nodes = ctx.trace.ops_stepped.filter(pl.col("step").is_not_null()
                                         & pl.col("name").str.contains(r"^SoftmaxBackward[0-9]*$"))
    if nodes.height != len(hits):
        return {}
    return {pattern: set(nodes["idx"].to_list())}


def _matmul_copies_us(ctx: Context, chains: list[list[int]]) -> float:
    """GPU time of the copies the chains' two matmuls make of their operands (a transposed K, reshaped to batch the
    GEMM): SDPA takes q, k and v as they are, and AT101 nests these copies under AT102 as counted in its cause (a
    BERT's 599 us of them were left out of its 989 us; the timed saving of SDPA was 1.93 ms)."""
    return float(_matmul_copies(ctx, chains)["dur"].sum())


def _matmul_copies(ctx: Context, chains: list[list[int]]) -> pl.DataFrame:
    ends = {op for chain in chains for op in (chain[0], chain[-1])}
    return ctx.gpu_under(ends).filter((pl.col("kind") == "memcpy") | (pl.col("cls") == "copy"))


def _check_without_shapes(ctx: Context) -> list[dict[str, Any]]:
    """AT102 on a trace recorded without record_shapes: the chain is found by its op names; the score tensor's
    size cannot be read; the softmax kernels' time bounds it (softmax reads and writes the tensor once, at most
    at the device's memory bandwidth), and the message says it is an estimate."""
    groups, sequence, position = chains_by_names(ctx)
    peaks = device_peaks(ctx.trace.device_name(ctx.trace.devices[0] if ctx.trace.devices else None))
    backward = _softmax_backward_by_names(ctx, groups)
    findings = []
    for pattern, hits in sorted(groups.items()):
        launched = ctx.gpu_under({o for _, _, chain in hits for o in chain[1:-1]})
        if not launched.height:
            continue
        steps = ctx.steps_of_ops(op for op, _, _ in hits)
        matmul_copies_us = _matmul_copies_us(ctx, [chain for _, _, chain in hits]) / steps
        backward_us = float(ctx.gpu_under(backward.get(pattern, set()))["dur"].sum()) / steps
        us_per_step = float(launched["dur"].sum()) / steps + matmul_copies_us + backward_us
        softmax_us = float(ctx.gpu_under({op for op, _, _ in hits})["dur"].sum()) / len(hits)
        estimated = (softmax_us * 1e-6 * peaks["hbm_tbs"] * 1e12 / 2 if peaks and peaks.get("hbm_tbs") else None)
        size = (f"an S x S score tensor (size estimated: the trace has no shapes; the softmax kernel's time bounds "
                f"it at ~{fmt_bytes(estimated)}, what {peaks['name']}'s memory bandwidth moves in that time)"
                if estimated else "an S x S score tensor (its size is not in the trace: no shapes)")
        findings.append(ctx.finding(
            op=hits[0][0],
            key=_stable_key(pattern),
            message=(f"unfused attention materialises {size} {ctx.per_step(len(hits), 'time', steps=steps)} "
                     f"via {pattern}: "
                     f"{fmt_us(us_per_step)} of GPU time {ctx.each_step} in the elementwise and softmax kernels "
                     "between its two matmuls"
                     + (f" and the copies its matmuls make of their operands ({fmt_us(matmul_copies_us)})"
                        if matmul_copies_us else "")
                     + (f" (forward {fmt_us(us_per_step - backward_us)}, its softmax's backward "
                        f"{fmt_us(backward_us)}; the other ops' backward cannot be told from the model's without "
                        "shapes)" if backward_us else "")),
            where={"op_chain": pattern, "kernel": None, "steps": sorted({s for _, s, _ in hits})},
            evidence={"calls_per_step": len(hits) / steps, "gpu_us_per_step": us_per_step,
                      "matmul_copy_gpu_us_per_step": matmul_copies_us, "backward_gpu_us_per_step": backward_us,
                      "score_bytes_at_most": estimated,
                      "shapes": False,
                      "causal_mask_in_trace": _causal_mask_shown(ctx, hits[0][2], sequence, position)},
            gpu_us_per_step=us_per_step,
            wall_us_per_step=ctx.wall_saving(ctx.faster(
                [*launched["idx"].to_list(), *ctx.gpu_under(backward.get(pattern, set()))["idx"].to_list(),
                 *_matmul_copies(ctx, [chain for _, _, chain in hits])["idx"].to_list()], math.inf,
                [*(o for _, _, chain in hits for o in chain), *backward.get(pattern, set())])),
            whatif=FUSED_WHATIF,
            fix=_fix(_causal_mask_shown(ctx, hits[0][2], sequence, position), False)
            + " Capture with record_shapes=True for the tensor's size and `attntrace run --from-trace`.",
        ))
    return findings


# The what-if of a fused kernel: the chain's elementwise and softmax kernels gone (its matmul kernels stay, standing
# for the fused kernel's own work), and the CPU time of the chain's ops and their backward nodes gone (one op's
# dispatch stands for them).
FUSED_WHATIF = ("the elementwise and softmax kernels between the matmuls gone, and the CPU time of the chain's ops "
                "and their backward")


def check(ctx: Context) -> list[dict[str, Any]]:
    if not ctx.trace.has_shapes:
        return _check_without_shapes(ctx)
    groups, sequence, position = unfused_chains(ctx, ctx.params["min_seq"])
    findings = []
    backward = _backward_by_chain(ctx, groups)
    for pattern, hits in sorted(groups.items()):
        steps = ctx.steps_of_ops(hit[0] for hit in hits)
        per_step = len(hits) / steps
        score_bytes = hits[0][4]
        # Each op between the two matmuls that launches GPU work reads and writes the S x S tensor once
        # (views such as slices launch none), once more for a copy it makes; the first matmul writes the
        # tensor and the last one reads it.
        launched = ctx.gpu_under({o for _, _, chain, _, _ in hits for o in chain[1:-1]})
        gpu_us = float(launched["dur"].sum())
        backward_us = float(ctx.gpu_under(backward[pattern])["dur"].sum()) / steps
        copies = launched.group_by("under").agg((pl.col("kind") == "memcpy").any().alias("copies"))["copies"]
        passes = 2 + sum(2 + 2 * copied for copied in copies.to_list()) / len(hits)
        moved = passes * score_bytes * per_step
        matmul_copies_us = _matmul_copies_us(ctx, [chain for _, _, chain, _, _ in hits]) / steps
        us_per_step = gpu_us / steps + backward_us + matmul_copies_us
        side = hits[0][3]
        first = _operands(ctx, hits[0][2][0])
        head_dim = first[0][-1] if first and isinstance(first[0], list) and first[0] else None
        too_wide = isinstance(head_dim, int) and head_dim > FUSED_MAX_HEAD_DIM
        causal = _causal_mask_shown(ctx, hits[0][2], sequence, position)
        findings.append(ctx.finding(
            op=hits[0][0],
            key=_stable_key(pattern),
            message=(f"unfused attention materialises a {side}x{side} score tensor ({fmt_bytes(score_bytes)}) "
                     f"{ctx.per_step(len(hits), 'time', steps=steps)} via {pattern}: about {fmt_bytes(moved)} of "
                     f"memory traffic {'in forward ' if backward_us else ''}{ctx.each_step} "
                     f"and {fmt_us(us_per_step)} of GPU time in the elementwise and softmax kernels"
                     + (f" and the copies its matmuls make of their operands ({fmt_us(matmul_copies_us)})"
                        if matmul_copies_us else "")
                     + (f" (forward {fmt_us(us_per_step - backward_us)}, their backward {fmt_us(backward_us)})"
                        if backward_us else "")
                     + (f"; head dim {head_dim} is above what flash and cuDNN take ({FUSED_MAX_HEAD_DIM}), so a "
                        "fused kernel may not be faster here: measure before switching" if too_wide else "")),
            where={"op_chain": pattern, "kernel": None, "steps": sorted({s for _, s, _, _, _ in hits})},
            evidence={"seq_len": side, "score_shape": _dims(ctx, hits[0][0])[0][0], "score_bytes": score_bytes,
                      "calls_per_step": per_step, "memory_passes": passes, "bytes_per_step": moved,
                      "memory_saved_bytes_per_call": 2 * score_bytes, "gpu_us_per_step": us_per_step,
                      "backward_gpu_us_per_step": backward_us, "matmul_copy_gpu_us_per_step": matmul_copies_us,
                      "head_dim": head_dim, "causal_mask_in_trace": causal},
            gpu_us_per_step=0.0 if too_wide else us_per_step,
            wall_us_per_step=None if too_wide else ctx.wall_saving(ctx.faster(
                [*launched["idx"].to_list(), *ctx.gpu_under(backward[pattern])["idx"].to_list(),
                 *_matmul_copies(ctx, [chain for _, _, chain, _, _ in hits])["idx"].to_list()], math.inf,
                [*(o for _, _, chain, _, _ in hits for o in chain), *backward[pattern]])),
            whatif=None if too_wide else FUSED_WHATIF,
            fix=_fix(causal, too_wide),
        ))
    return point_to_measurement(ctx, findings)


def backward_node(op_name: str) -> str:
    """The autograd node of an aten op's gradient, without its number: aten::masked_fill -> MaskedFillBackward."""
    return "".join(part.capitalize() for part in op_name.removeprefix("aten::").split("_") if part) + "Backward"


def _backward_by_chain(ctx: Context, groups: dict[str, list[Any]]) -> dict[str, set[int]]:
    """For each chain pattern, the autograd nodes that run the backward of its ops between the matmuls
    (SoftmaxBackward0, MaskedFillBackward0, MulBackward0), each known by an op under it taking a tensor of as many
    elements as the scores (in any dtype: autocast's gradients may be fp32): SDPA's backward replaces them too.
    A node goes to the first pattern that claims it."""
    names = ctx.trace.op_names
    nodes = ctx.trace.ops.filter(pl.col("name").str.contains(AUTOGRAD_NODE))
    candidates = list(zip(nodes["idx"].to_list(), [re.sub(r"[0-9]+$", "", n) for n in nodes["name"].to_list()],
                          strict=True))
    claimed: set[int] = set()
    by_chain: dict[str, set[int]] = {}
    for pattern, hits in sorted(groups.items()):
        score_numel = _first_input_numel(ctx, hits[0][0])
        wanted = {backward_node(names[o]) for _, _, chain, _, _ in hits for o in chain[1:-1]
                  if names[o].startswith("aten::")}
        by_chain[pattern] = {node for node, name in candidates
                             if score_numel and node not in claimed and name in wanted
                             and any(_first_input_numel(ctx, op) == score_numel
                                     for op in ctx.trace.op_children.get(node, []))}
        claimed |= by_chain[pattern]
    return by_chain


def _first_input_numel(ctx: Context, op: int) -> int | None:
    dims = ctx.trace.op_input(op)[0]
    first = dims[0] if dims else None
    if not isinstance(first, list) or not first or not all(isinstance(d, int) for d in first):
        return None
    return math.prod(first)


def _stable_key(pattern: str) -> str:
    """The chain with in-place ops named as their out-of-place forms: following AT101's fix (`masked_fill` ->
    `masked_fill_`) keeps the attention the same finding for a baseline."""
    return " > ".join(name[:-1] if name.endswith("_") and not name.endswith("__") else name
                      for name in pattern.split(" > "))


def _causal_mask_shown(ctx: Context, chain: list[int], sequence: list[int], position: dict[int, int]) -> bool:
    """The trace shows the mask is causal: a tril/triu builds it in the same run of ops."""
    names = ctx.trace.op_names
    at = position[chain[0]]
    near = sequence[max(0, at - LOOK_BACK):position[chain[-1]] + 1]
    return any(names[o] in TRIANGLE for o in near) or any(
        names[a] in TRIANGLE for o in chain for a in ctx.trace.op_children.get(o, []))


def _fix(causal: bool, too_wide: bool) -> str:
    """is_causal=True only when the trace shows the mask is causal; attn_mask= otherwise."""
    call = ("`F.scaled_dot_product_attention(q, k, v, is_causal=True)`" if causal else
            "`F.scaled_dot_product_attention(q, k, v, attn_mask=mask)` (`is_causal=True` instead if the mask is "
            "causal)")
    if too_wide:
        return (f"At this head dim only SDPA's memory-efficient kernel (or FlexAttention) fuses the chain, and it "
                f"can be slower than the unfused chain: time {call} against the current code before switching.")
    return (f"Replace the chain with {call}, or with FlexAttention (`flex_attention` with a `score_mod`/"
            "`block_mask`) for custom masking.")
