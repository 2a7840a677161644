"""The attention implementations that `attntrace run` profiles side by side.

Each variant states what it needs; `unsupported_reason` turns a mismatch into a skip with a reason
instead of a crash. `build` is called once per run, so anything a variant prepares up front (the mask, a
compiled graph, a block mask, jagged inputs) is outside the profiled loop, as it would be in a real model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attntrace.capture.options import Shape

AttentionFn = Callable[..., torch.Tensor]

__all__ = ["VARIANTS", "AttentionFn", "Impl", "Shape", "Variant", "keep_mask", "unsupported_reason"]


@dataclass(frozen=True)
class Impl:
    """A built variant: `prepare` turns the padded [batch, heads, seq, dim] inputs into what `call` takes
    (once, outside the timed loop); `dense` turns `call`'s output back into a padded tensor for the check."""

    call: AttentionFn
    prepare: Callable[..., tuple[torch.Tensor, ...]] | None = None
    dense: Callable[[torch.Tensor], torch.Tensor] | None = None


Builder = Callable[[Shape, bool, torch.device], "Impl | AttentionFn"]


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    build: Builder
    devices: frozenset[str] = frozenset({"cuda", "cpu"})
    dtypes: frozenset[torch.dtype] = frozenset({torch.float32, torch.float16, torch.bfloat16})
    min_compute_capability: tuple[int, int] | None = None
    supports_backward: bool = True
    needs: tuple[str, ...] = field(default_factory=tuple)  # importable modules
    gqa: bool = True  # fewer KV heads than query heads
    decode: bool = True  # fewer queries than keys
    window: bool = True
    varlen: bool = True


def keep_mask(shape: Shape, causal: bool, device: torch.device) -> torch.Tensor | None:
    """Which keys each query sees ([batch or 1, 1, queries, keys], True = attend), or None when all of
    them. Queries are the last positions of the sequence, so a causal decode query sees the whole cache."""
    offset = shape.kv_len - shape.q_len
    rows = torch.arange(shape.q_len, device=device)[:, None] + offset
    cols = torch.arange(shape.kv_len, device=device)[None, :]
    keep = torch.ones(shape.q_len, shape.kv_len, dtype=torch.bool, device=device)
    if causal:
        keep &= cols <= rows
    if shape.window:
        keep &= cols > rows - shape.window
    keep = keep[None, None]
    if shape.lengths is not None:
        lengths = torch.tensor(shape.lengths, device=device)
        keep = keep & (cols[None, None] < lengths[:, None, None, None])
    return None if bool(keep.all()) else keep


def repeat_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    """Hugging Face's repeat_kv: expand the KV heads, then reshape, which copies."""
    if groups == 1:
        return t
    b, h, s, d = t.shape
    return t[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


def _naive(inplace: bool) -> Builder:
    def build(shape: Shape, causal: bool, device: torch.device) -> AttentionFn:
        keep = keep_mask(shape, causal, device)
        drop = None if keep is None else ~keep
        scale = 1.0 / math.sqrt(shape.head_dim)
        groups = shape.heads // shape.n_kv_heads

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k, v = repeat_kv(k, groups), repeat_kv(v, groups)
            scores = (q @ k.transpose(-2, -1)) * scale
            if drop is not None:
                scores = scores.masked_fill_(drop, float("-inf")) if inplace else scores.masked_fill(
                    drop, float("-inf"))
            return torch.softmax(scores, dim=-1) @ v

        return attend

    return build


def _sdpa_mask(shape: Shape, causal: bool, device: torch.device) -> dict[str, object]:
    """The cheapest way to tell SDPA the mask: is_causal when it means what we mean, a lower-right causal
    bias for decode, an explicit boolean mask for windows and padding."""
    keep = keep_mask(shape, causal, device)
    if keep is None:
        return {}
    if shape.window is None and shape.lengths is None:
        if not shape.decode:
            return {"is_causal": True}
        from torch.nn.attention.bias import causal_lower_right

        return {"attn_mask": causal_lower_right(shape.q_len, shape.kv_len)}
    return {"attn_mask": keep}


def _sdpa(backend_name: str | None, repeat: bool = False) -> Builder:
    def build(shape: Shape, causal: bool, device: torch.device) -> AttentionFn:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        kwargs = _sdpa_mask(shape, causal, device)
        groups = shape.heads // shape.n_kv_heads
        if shape.gqa and not repeat:
            kwargs["enable_gqa"] = True

        def plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if repeat:
                k, v = repeat_kv(k, groups), repeat_kv(v, groups)
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

        if backend_name is None:
            return plain
        backend = getattr(SDPBackend, backend_name)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            with sdpa_kernel(backend):
                return plain(q, k, v)

        return attend

    return build


def _compiled(shape: Shape, causal: bool, device: torch.device) -> AttentionFn:
    return torch.compile(_naive(inplace=True)(shape, causal, device))


def _flex(shape: Shape, causal: bool, device: torch.device) -> AttentionFn:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention)
    offset, window = shape.kv_len - shape.q_len, shape.window
    lengths = None if shape.lengths is None else torch.tensor(shape.lengths, device=device)
    gqa = {"enable_gqa": True} if shape.gqa else {}
    if keep_mask(shape, causal, device) is None:
        return lambda q, k, v: compiled(q, k, v, **gqa)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        pos = q_idx + offset
        keep = kv_idx <= pos if causal else kv_idx >= 0
        if window:
            keep = keep & (pos - kv_idx < window)
        if lengths is not None:
            keep = keep & (kv_idx < lengths[b])
        return keep

    block_mask = create_block_mask(mask_mod, shape.batch if lengths is not None else None, None, shape.q_len,
                                   shape.kv_len, device=str(device))
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask, **gqa)


def _triton(shape: Shape, causal: bool, device: torch.device) -> AttentionFn:
    from attntrace.capture import triton_attention

    return lambda q, k, v: triton_attention.attention(q, k, v, causal)


def _nested(shape: Shape, causal: bool, device: torch.device) -> Impl:
    """Variable length without padding: jagged nested tensors through SDPA (FlashAttention's varlen path)."""
    lengths = shape.lengths or (shape.seq,) * shape.batch
    gqa = {"enable_gqa": True} if shape.gqa else {}

    def jagged(t: torch.Tensor) -> torch.Tensor:
        pieces = [t[b, :, :n].transpose(0, 1) for b, n in enumerate(lengths)]  # each [len, heads, dim]
        return torch.nested.nested_tensor(pieces, layout=torch.jagged).transpose(1, 2)

    def prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return jagged(q), jagged(k), jagged(v)

    def dense(out: torch.Tensor) -> torch.Tensor:
        padded = out.transpose(1, 2).to_padded_tensor(0.0).transpose(1, 2)
        return F.pad(padded, (0, 0, 0, shape.seq - padded.shape[2]))

    return Impl(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa), prepare, dense)


def _bshd(fn: Callable[..., object]) -> AttentionFn:
    """Wrap a kernel that takes [batch, seq, heads, dim] (and may return (out, lse))."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        out = out[0] if isinstance(out, tuple) else out
        return out.transpose(1, 2)

    return attend


def _flash_attn(module: str) -> Builder:
    def build(shape: Shape, causal: bool, device: torch.device) -> AttentionFn:
        import importlib

        func = importlib.import_module(module).flash_attn_func
        # FlashAttention aligns causal masks bottom-right, as ours; (left, right) window, -1 = unbounded.
        window = (shape.window - 1, 0) if shape.window else (-1, -1)
        return _bshd(lambda q, k, v: func(q, k, v, causal=causal, window_size=window))

    return build


def _xformers(shape: Shape, causal: bool, device: torch.device) -> AttentionFn:
    import xformers.ops as xops

    bias = xops.fmha.attn_bias.LowerTriangularFromBottomRightMask() if causal else None
    return _bshd(lambda q, k, v: xops.memory_efficient_attention(q, k, v, attn_bias=bias))


def _transformer_engine(shape: Shape, causal: bool, device: torch.device) -> AttentionFn:
    import transformer_engine.pytorch as te

    mask = ("causal_bottom_right" if shape.decode else "causal") if causal else "no_mask"
    window = (shape.window - 1, 0) if shape.window else None
    layer = te.DotProductAttention(shape.heads, shape.head_dim, num_gqa_groups=shape.n_kv_heads,
                                   attn_mask_type=mask, qkv_format="bshd", window_size=window)

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = layer(q, k, v)  # [batch, seq, heads * dim]
        return out.view(q.shape[0], q.shape[1], shape.heads, shape.head_dim)

    return _bshd(call)


HALF = frozenset({torch.float16, torch.bfloat16})
CUDA = frozenset({"cuda"})

VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("naive", "matmul, scale, out-of-place masked_fill, softmax, matmul (repeat_kv for GQA)",
            _naive(inplace=False)),
    Variant("naive_inplace", "the naive version with in-place masked_fill_", _naive(inplace=True)),
    Variant("sdpa_math", "SDPA pinned to the math backend", _sdpa("MATH")),
    Variant("sdpa_efficient", "SDPA pinned to the memory-efficient (CUTLASS) backend",
            _sdpa("EFFICIENT_ATTENTION"), devices=CUDA),
    Variant("sdpa_flash", "SDPA pinned to the FlashAttention-2 backend", _sdpa("FLASH_ATTENTION"),
            devices=CUDA, dtypes=HALF, min_compute_capability=(8, 0)),
    Variant("sdpa_cudnn", "SDPA pinned to the cuDNN backend", _sdpa("CUDNN_ATTENTION"),
            devices=CUDA, dtypes=HALF, min_compute_capability=(8, 0)),
    Variant("sdpa", "SDPA with its default backend choice (enable_gqa=True for GQA)", _sdpa(None)),
    Variant("compiled", "torch.compile of the in-place naive version", _compiled, devices=CUDA,
            needs=("triton",)),
    Variant("flex", "FlexAttention with a block mask (causal, sliding window, padding)", _flex, devices=CUDA,
            needs=("triton",)),
    Variant("triton", "attntrace's own fused causal attention forward in Triton (online softmax)", _triton,
            devices=CUDA, dtypes=HALF, supports_backward=False, needs=("triton",), gqa=False, decode=False,
            window=False, varlen=False),
    Variant("sdpa_repeat_kv", "SDPA after Hugging Face's repeat_kv copies the KV heads", _sdpa(None, repeat=True)),
    Variant("sdpa_nested", "SDPA on jagged nested tensors: no padding", _nested, supports_backward=False,
            decode=False, window=False),
    Variant("flash_attn2", "FlashAttention-2 package (flash_attn.flash_attn_func)", _flash_attn("flash_attn"),
            devices=CUDA, dtypes=HALF, min_compute_capability=(8, 0), needs=("flash_attn",), varlen=False),
    Variant("flash_attn3", "FlashAttention-3 package (flash_attn_interface.flash_attn_func, Hopper)",
            _flash_attn("flash_attn_interface"), devices=CUDA, dtypes=HALF, min_compute_capability=(9, 0),
            needs=("flash_attn_interface",), varlen=False),
    Variant("xformers", "xFormers memory_efficient_attention", _xformers, devices=CUDA, needs=("xformers",),
            gqa=False, window=False, varlen=False),
    Variant("transformer_engine", "Transformer Engine DotProductAttention", _transformer_engine, devices=CUDA,
            dtypes=HALF, min_compute_capability=(8, 0), needs=("transformer_engine",), varlen=False),
]}


def unsupported_reason(variant: Variant, device: torch.device, dtype: torch.dtype, shape: Shape,
                       backward: bool) -> str | None:
    """Why this variant cannot run here, as one short phrase, or None when it can."""
    import importlib.util

    if device.type not in variant.devices:
        return f"needs {'/'.join(sorted(variant.devices))}, not {device.type}"
    for module in variant.needs:
        if importlib.util.find_spec(module) is None:
            return f"{module} not installed"
    if dtype not in variant.dtypes:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in variant.dtypes))
        return f"takes {names}, not {str(dtype).removeprefix('torch.')}"
    if backward and not variant.supports_backward:
        return "forward only; no backward here"
    asked = (("fewer KV heads (GQA/MQA)", shape.gqa, variant.gqa), ("queries shorter than keys", shape.decode,
             variant.decode), ("a sliding window", bool(shape.window), variant.window),
             ("variable lengths", shape.lengths is not None, variant.varlen))
    for what, wanted, supported in asked:
        if wanted and not supported:
            return f"does not take {what}"
    if variant.min_compute_capability and device.type == "cuda":
        cc = torch.cuda.get_device_capability(device)
        if cc < variant.min_compute_capability:
            need = ".".join(map(str, variant.min_compute_capability))
            return f"needs compute capability {need}+, this GPU is {cc[0]}.{cc[1]}"
    if variant.name == "triton":
        from attntrace.capture.triton_attention import SUPPORTED_HEAD_DIMS

        if shape.head_dim not in SUPPORTED_HEAD_DIMS:
            return f"head dim {shape.head_dim} not in {SUPPORTED_HEAD_DIMS}"
    return None
