"""attntrace's own fused attention forward in Triton: one kernel, online softmax, causal or not.

Imported only when the `triton` variant runs, so that a machine without Triton still captures the rest.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)


@triton.jit
def attntrace_attention_fwd(
    q_ptr, k_ptr, v_ptr, o_ptr,
    sm_scale,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_ob, stride_oh, stride_os, stride_od,
    heads, seq_len,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    block_m = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = batch_head // heads
    head = batch_head % heads

    rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols_in_block = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)

    q_base = q_ptr + batch * stride_qb + head * stride_qh
    k_base = k_ptr + batch * stride_kb + head * stride_kh
    v_base = v_ptr + batch * stride_vb + head * stride_vh
    q = tl.load(q_base + rows[:, None] * stride_qs + dims[None, :] * stride_qd,
                mask=rows[:, None] < seq_len, other=0.0)

    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # exp2 is cheaper than exp; fold log2(e) into the scale once.
    qk_scale = sm_scale * 1.4426950408889634

    end = tl.minimum((block_m + 1) * BLOCK_M, seq_len) if CAUSAL else seq_len
    for start in range(0, end, BLOCK_N):
        cols = start + cols_in_block
        k = tl.load(k_base + cols[None, :] * stride_ks + dims[:, None] * stride_kd,
                    mask=cols[None, :] < seq_len, other=0.0)
        scores = tl.dot(q, k) * qk_scale
        keep = cols[None, :] < seq_len
        if CAUSAL:
            keep = keep & (rows[:, None] >= cols[None, :])
        scores = tl.where(keep, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        probs = tl.math.exp2(scores - new_max[:, None])
        rescale = tl.math.exp2(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        v = tl.load(v_base + cols[:, None] * stride_vs + dims[None, :] * stride_vd,
                    mask=cols[:, None] < seq_len, other=0.0)
        acc = acc * rescale[:, None]
        acc = tl.dot(probs.to(v.dtype), v, acc)
        row_max = new_max

    out = acc / row_sum[:, None]
    o_base = o_ptr + batch * stride_ob + head * stride_oh
    tl.store(o_base + rows[:, None] * stride_os + dims[None, :] * stride_od,
             out.to(o_ptr.dtype.element_ty), mask=rows[:, None] < seq_len)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              block_m: int = 128, block_n: int = 64, num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """Attention over [batch, heads, seq, head_dim] tensors of fp16 or bf16."""
    batch, heads, seq_len, head_dim = q.shape
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim {head_dim} not in {SUPPORTED_HEAD_DIMS}")
    out = torch.empty_like(q)
    grid = (triton.cdiv(seq_len, block_m), batch * heads)
    attntrace_attention_fwd[grid](
        q, k, v, out, 1.0 / math.sqrt(head_dim),
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        heads, seq_len,
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
