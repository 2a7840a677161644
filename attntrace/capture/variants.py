"""The attention implementations that `attntrace run` profiles side by side.

Each variant states what it needs; `unsupported_reason` turns a mismatch into a skip with a reason
instead of a crash. `build` is called once per run, so anything a variant prepares up front (the causal
mask, a compiled graph, a block mask) is outside the profiled loop, as it would be in a real model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    seq: int
    head_dim: int


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    build: Callable[[Shape, bool, torch.device], AttentionFn]
    devices: frozenset[str] = frozenset({"cuda", "cpu"})
    dtypes: frozenset[torch.dtype] = frozenset({torch.float32, torch.float16, torch.bfloat16})
    min_compute_capability: tuple[int, int] | None = None
    supports_backward: bool = True
    needs: tuple[str, ...] = field(default_factory=tuple)  # importable modules


def _causal_mask(shape: Shape, device: torch.device) -> torch.Tensor:
    return torch.ones(shape.seq, shape.seq, dtype=torch.bool, device=device).triu(1)


def _naive(inplace: bool) -> Callable[[Shape, bool, torch.device], AttentionFn]:
    def build(shape: Shape, causal: bool, device: torch.device) -> AttentionFn:
        mask = _causal_mask(shape, device) if causal else None
        scale = 1.0 / math.sqrt(shape.head_dim)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            scores = (q @ k.transpose(-2, -1)) * scale
            if mask is not None:
                scores = scores.masked_fill_(mask, float("-inf")) if inplace else scores.masked_fill(
                    mask, float("-inf"))
            return torch.softmax(scores, dim=-1) @ v

        return attend

    return build


def _sdpa(backend_name: str | None) -> Callable[[Shape, bool, torch.device], AttentionFn]:
    def build(shape: Shape, causal: bool, device: torch.device) -> AttentionFn:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if backend_name is None:
            return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        backend = getattr(SDPBackend, backend_name)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return attend

    return build


def _compiled(shape: Shape, causal: bool, device: torch.device) -> AttentionFn:
    return torch.compile(_naive(inplace=True)(shape, causal, device))


def _flex(shape: Shape, causal: bool, device: torch.device) -> AttentionFn:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention)
    if not causal:
        return lambda q, k, v: compiled(q, k, v)

    def causal_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return q_idx >= kv_idx

    block_mask = create_block_mask(causal_mod, None, None, shape.seq, shape.seq, device=str(device))
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def _triton(shape: Shape, causal: bool, device: torch.device) -> AttentionFn:
    from attntrace.capture import triton_attention

    return lambda q, k, v: triton_attention.attention(q, k, v, causal)


HALF = frozenset({torch.float16, torch.bfloat16})
CUDA = frozenset({"cuda"})

VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("naive", "matmul, scale, out-of-place masked_fill, softmax, matmul", _naive(inplace=False)),
    Variant("naive_inplace", "the naive version with in-place masked_fill_", _naive(inplace=True)),
    Variant("sdpa_math", "SDPA pinned to the math backend", _sdpa("MATH")),
    Variant("sdpa_efficient", "SDPA pinned to the memory-efficient (CUTLASS) backend",
            _sdpa("EFFICIENT_ATTENTION"), devices=CUDA),
    Variant("sdpa_flash", "SDPA pinned to the FlashAttention-2 backend", _sdpa("FLASH_ATTENTION"),
            devices=CUDA, dtypes=HALF, min_compute_capability=(8, 0)),
    Variant("sdpa_cudnn", "SDPA pinned to the cuDNN backend", _sdpa("CUDNN_ATTENTION"),
            devices=CUDA, dtypes=HALF, min_compute_capability=(8, 0)),
    Variant("sdpa", "SDPA with its default backend choice", _sdpa(None)),
    Variant("compiled", "torch.compile of the in-place naive version", _compiled, devices=CUDA,
            needs=("triton",)),
    Variant("flex", "FlexAttention with a causal block mask", _flex, devices=CUDA, needs=("triton",)),
    Variant("triton", "attntrace's own fused causal attention forward in Triton (online softmax)", _triton,
            devices=CUDA, dtypes=HALF, supports_backward=False, needs=("triton",)),
]}


def unsupported_reason(variant: Variant, device: torch.device, dtype: torch.dtype, shape: Shape,
                       backward: bool) -> str | None:
    """Why this variant cannot run here, or None when it can."""
    import importlib.util

    if device.type not in variant.devices:
        return f"needs {'/'.join(sorted(variant.devices))}, not {device.type}"
    if dtype not in variant.dtypes:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in variant.dtypes))
        return f"takes {names}, not {str(dtype).removeprefix('torch.')}"
    if backward and not variant.supports_backward:
        return "forward only; no backward kernel"
    for module in variant.needs:
        if importlib.util.find_spec(module) is None:
            return f"needs the {module} package"
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
