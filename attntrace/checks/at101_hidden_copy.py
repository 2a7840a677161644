"""AT101 hidden-copy: GPU copies that no explicit copy op asked for."""

from __future__ import annotations

import re
from typing import Any

import polars as pl

from attntrace.checks.at102_materialized_scores import chain_ops
from attntrace.checks.base import ITEM_SIZE, Context, fmt_bytes, fmt_us, steps_in

# Ops that are a copy the user asked for: a copy kernel under only these (up to the user's own annotations)
# was asked for.
EXPLICIT_COPY_OPS = {"aten::clone", "aten::contiguous", "aten::copy_", "aten::to", "aten::_to_copy",
                     "aten::copy", "aten::_copy_from", "aten::index_copy_", "aten::cat", "aten::stack"}
# Allocations nest around a copy only by clock rounding: they never ask for one.
ALLOCATION_OPS = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_", "aten::zeros",
                  "aten::new_empty", "aten::new_empty_strided"}
CAST_OPS = {"aten::to", "aten::_to_copy", "aten::type_as", "aten::_autocast_to_reduced_precision",
            "aten::_autocast_to_full_precision"}
FIXES = {
    "torch::autograd::AccumulateGrad": (
        "The gradient reaches the leaf tensor in another memory layout (e.g. a transposed view from a fused "
        "backward), so AccumulateGrad copies it into .grad. Create the leaf in the layout the gradient comes "
        "in (e.g. allocate [B, S, H, D] and transpose to [B, H, S, D]) so that the gradient can be stolen."),
    "aten::masked_fill": "Use the in-place `masked_fill_` (e.g. `scores.masked_fill_(mask, float('-inf'))`; "
                         "under `torch.no_grad()` or where autograd allows it), or fuse the attention with "
                         "`F.scaled_dot_product_attention(q, k, v, is_causal=True)`.",
}
BACKWARD_NODE = re.compile(r"^(?:torch::autograd::)?([A-Za-z0-9_]+?)Backward\d*$")
FUSED_ATTENTION_NODE = re.compile(r"^ScaledDotProduct(?:Flash|Efficient|Cudnn|FusedAttentionOverrideable)?Attention$")
LAYOUT_BACKWARD = {"View", "Reshape", "UnsafeView", "Transpose", "Permute", "Expand", "T", "Select", "Slice"}


def backward_fix(node: str) -> str | None:
    """The fix for a copy that autograd's backward formula of a forward op makes (MaskedFillBackward0 >
    aten::masked_fill > aten::clone): it names the forward op, and the change that removes the copy, since an
    in-place form in forward does not."""
    match = BACKWARD_NODE.match(node)
    if not match:
        return None
    forward = match.group(1)
    name = re.sub(r"(?<!^)(?=[A-Z])", "_", forward).lower()
    if FUSED_ATTENTION_NODE.match(forward):
        # The fused kernel's backward reads q, k, v, the output and its gradient in [batch, seq, heads, head_dim]
        # memory: inputs made contiguous as [batch, heads, seq, head_dim] are copied back (two `aten::contiguous`
        # of [4, 2048, 16, 64] tensors with strides [2097152, 64, 131072, 1] in one flash backward on an H200);
        # Hugging Face's projections, viewed and transposed, make none. Avoiding the fused op is no fix.
        return (f"The copy is made inside the fused attention's backward (`{node}`), which reads q, k, v, the "
                "output and its gradient in [batch, seq, heads, head_dim] memory: build q, k and v as views of the "
                "projection's output, `x.view(b, s, h, d).transpose(1, 2)`, rather than contiguous [batch, heads, "
                "seq, head_dim] tensors (no `.contiguous()` after the transpose), and let the output keep the "
                "layout the kernel gives it.")
    if forward == "MaskedFill":
        return (f"The copy is made in backward by `{node}`, the gradient of the forward `masked_fill` of the "
                "attention scores; `masked_fill_` or `torch.no_grad()` in forward do not remove it. Replace the "
                "mask-softmax chain with `F.scaled_dot_product_attention(q, k, v, is_causal=True)` (or "
                "`attn_mask=`), whose backward makes no such copy.")
    if forward in LAYOUT_BACKWARD:
        return (f"The copy is made in backward by `{node}`: the gradient of a forward `{name}` of a tensor that is "
                "not contiguous in the layout the gradient comes in. Make the forward tensor contiguous where it "
                "is produced (or use the layout downstream ops expect), so that the gradient is a view again.")
    return (f"The copy is made in backward by `{node}`, autograd's formula for the forward `{name}`; a change in "
            f"forward that avoids `{name}` (a fused op, or `torch.compile` fusing it with its neighbours) removes "
            "it.")


COMPILED_FIX = ("torch.compile copies back the graph inputs it mutates in place and clones outputs that alias "
                "inputs: move in-place updates of inputs (buffers, caches) out of the compiled region or make them "
                "outputs, and return new tensors rather than views of inputs.")
BUCKET_VIEW_FIX = ("DDP copies each gradient between its bucket and `.grad` every step. Construct the model with "
                   "`DistributedDataParallel(model, gradient_as_bucket_view=True)` so that `.grad` is a view into "
                   "the bucket and the copy disappears.")
# Copies that are the op's own output (padding), or staging buffers of a collective: not hidden copies.
OWN_OUTPUT_OPS = {"aten::pad", "aten::constant_pad_nd", "aten::reflection_pad1d", "aten::reflection_pad2d",
                  "aten::replication_pad1d", "aten::replication_pad2d", "aten::cat", "aten::stack"}
COLLECTIVE = re.compile(r"nccl|rccl|c10d::|all_reduce|allreduce|all_gather|reduce_scatter|record_param_comms|"
                        r"broadcast_coalesced|_broadcast|alltoall|vllm::all_reduce")
DDP = re.compile(r"copy_bucket_to_grad|DistributedDataParallel|[Rr]educer::|mark_variable_ready")
GQA_FIX = ("This repeats the key/value heads for grouped-query attention (repeat_kv: a [batch, kv_heads, n_rep, "
           "seq, head_dim] expand made contiguous): pass the un-repeated K and V to "
           "`F.scaled_dot_product_attention(q, k, v, enable_gqa=True)` (PyTorch >= 2.5) or to FlexAttention "
           "(`enable_gqa=True`), which read each KV head once for its group of query heads.")
SDPA_MATH_OP = "aten::_scaled_dot_product_attention_math"
MATH_GQA_FIX = ("SDPA's math backend repeats the key/value heads itself for `enable_gqa=True` (the call already passes "
                "un-repeated K and V): a fused backend (flash, cuDNN, efficient) reads each KV head once for its "
                "group of query heads. Let SDPA pick one; the math backend's own finding (AT202) says why it ran.")
REPEAT_OPS = {"aten::reshape", "aten::flatten", "aten::contiguous", "aten::repeat_interleave"}
GENERIC_FIX = ("Find the op that copies (the op chain names it) and give it an input it can use as is: the "
               "in-place variant, a contiguous layout produced once outside the loop, or a fused op.")


def _copy_bytes(ctx: Context, row: dict[str, Any]) -> float | None:
    if row["kind"] == "memcpy":
        return row["bytes"]
    dims, types, _ = ctx.trace.op_input(row["op"]) if row["op"] is not None else (None, None, None)
    if not dims or not types or not isinstance(dims[0], list):
        return None
    numel = 1
    for d in dims[0]:
        numel *= d if isinstance(d, int) else 1
    return float(numel * ITEM_SIZE.get(types[0], 0)) or None


def _is_cast(ctx: Context, op: int | None, chain: list[str]) -> bool:
    if any(name in CAST_OPS for name in chain):
        return True
    # copy_(dst, src) between dtypes. Only copy_: `aten::cat`'s inputs read ['TensorList', 'Scalar'], and its
    # copies were taken for a cast (a ViT's UnbindBackward0 copies showed only in the capture without shapes).
    if op is None or ctx.trace.op_names[op] != "aten::copy_":
        return False
    types = ctx.op_types(op)
    return len(types) >= 2 and types[0] != types[1]


def culprit(ctx: Context, op: int | None) -> tuple[list[str], str | None]:
    """The op chain without user annotations, and the op nearest the copy that is not itself a copy op: the
    one that asked for the copy without saying so (None when the copy was asked for)."""
    cats = ctx.trace.op_cats
    ops = [i for i in ctx.trace.op_ancestors(op) if cats[i] != "user_annotation"]
    names = [ctx.trace.op_names[i] for i in ops]
    for name in reversed(names):
        if name not in EXPLICIT_COPY_OPS and name not in ALLOCATION_OPS:
            return names, name
    return names, None


def _unfused_attention_ops(ctx: Context) -> set[int]:
    """The ops of the unfused attention chains (AT102's), and the autograd nodes of their backward
    (MaskedFillBackward0 clones the scores): a copy under one of them goes when the chain is fused."""
    from attntrace.checks.catalog import load_rules

    # With or without recorded shapes, as AT102 finds them: without, a copy inside the chain was a second
    # warning beside AT102's, its time counted twice.
    return chain_ops(ctx, load_rules()["AT102"].parameters["min_seq"].default)


def _repeats_kv_heads(ctx: Context, op: int | None, asked_by: str) -> bool:
    """Whether the copying op repeats KV heads: repeat_interleave, or a reshape of a 5-D [batch, kv_heads, n_rep,
    seq, head_dim] tensor (Hugging Face's repeat_kv: expand, then reshape to [batch, heads, seq, head_dim])."""
    if asked_by not in REPEAT_OPS:
        return False
    if asked_by == "aten::repeat_interleave":
        return True
    names = ctx.trace.op_names
    asking = next((a for a in reversed(ctx.trace.op_ancestors(op)) if names[a] == asked_by), None)
    if asking is None:
        return False
    dims = ctx.trace.op_input(asking)[0]
    first = dims[0] if dims else None
    return isinstance(first, list) and len(first) == 5 and isinstance(first[2], int) and first[2] > 1


def check(ctx: Context) -> list[dict[str, Any]]:
    copies = ctx.gpu.filter(((pl.col("kind") == "memcpy") & pl.col("name").str.contains("DtoD"))
                            | (pl.col("cls") == "copy"))
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    ctx.trace.prefetch_inputs(copies["op"].to_list())
    needed = ["op", "kind", "name", "dur", "device", "launch_api", "launch_pid", "bytes", "step"]
    copies = copies.select([c for c in needed if c in copies.columns])
    for row in copies.iter_rows(named=True):
        chain, asked_by = culprit(ctx, row["op"])
        if asked_by is None or asked_by in OWN_OUTPUT_OPS or _is_cast(ctx, row["op"], chain):
            continue
        if any(COLLECTIVE.search(name) for name in chain) and not any(DDP.search(name) for name in chain):
            continue
        kind = "Memcpy DtoD" if row["kind"] == "memcpy" else "copy kernel"
        groups.setdefault((" > ".join(chain), kind), []).append(row)

    attention_ops = _unfused_attention_ops(ctx) if groups else set()
    findings = []
    for (chain, kind), rows in sorted(groups.items()):
        sizes = [b for b in (_copy_bytes(ctx, r) for r in rows) if b]
        largest = max(sizes) if sizes else None
        if largest is not None and largest < ctx.params["min_bytes"]:
            continue
        steps = ctx.steps_in(r.get("launch_pid") for r in rows)
        us_per_step = sum(r["dur"] for r in rows) / steps
        share = ctx.share_of_gpu(us_per_step, (r["device"] for r in rows))
        if share < ctx.params["min_share"]:
            continue
        names = chain.split(" > ")
        asked_by = next((n for n in reversed(names) if n not in EXPLICIT_COPY_OPS and n not in ALLOCATION_OPS),
                        names[-1])
        ddp = any(DDP.search(n) for n in names)
        compiled = asked_by.startswith("CompiledFunction")
        in_backward = next((fix for fix in map(backward_fix, names) if fix), None)
        # Inside SDPA's math backend the repeat is the backend's own (`enable_gqa=True` given, as the fix for a
        # model's repeat_kv asks): leaving the math backend removes it (AT202 says why it ran).
        repeats = _repeats_kv_heads(ctx, rows[0]["op"], asked_by)
        fix = BUCKET_VIEW_FIX if ddp else COMPILED_FIX if compiled else in_backward or (
            (MATH_GQA_FIX if SDPA_MATH_OP in names else GQA_FIX) if repeats
            else next((FIXES[n] for n in names if n in FIXES), GENERIC_FIX))
        count = len(rows) / steps
        # Copies of one call site differ in size (a compiled graph's copies of every parameter): the mean, with the
        # largest beside it, and bytes per step from the copies whose size is known, scaled to all of them.
        per_copy = sum(sizes) / len(sizes) if sizes else None
        if not sizes:
            size = "unknown size"
        elif largest == min(sizes):
            size = fmt_bytes(largest)
        else:
            size = f"{fmt_bytes(per_copy)} on average (largest {fmt_bytes(largest)})"
        findings.append(ctx.finding(
            op=rows[0]["op"],
            key=f"{chain}|{kind}",
            device=rows[0]["device"],
            message=(f"{asked_by} makes {ctx.per_step(len(rows), f'hidden {kind}', steps=steps)} of {size} "
                     f"({fmt_us(us_per_step)} GPU {ctx.each_step}) via {chain}"),
            where={"op_chain": chain, "kernel": rows[0]["name"], "steps": steps_in(rows)},
            evidence={"copies_per_step": count, "bytes_per_copy": per_copy,
                      "bytes_per_step": per_copy * count if per_copy else None, "largest_copy_bytes": largest,
                      "gpu_us_per_step": us_per_step, "share_of_step_gpu": share,
                      "launch_api": rows[0]["launch_api"],
                      "in_unfused_attention": all(set(ctx.trace.op_ancestors(r["op"])) & attention_ops
                                                  for r in rows)},
            gpu_us_per_step=us_per_step,
            fix=fix,
        ))
    return findings
