"""FLOPs and bytes of one op from its recorded inputs (Input Dims, Input type, Concrete Inputs): the one place
the arithmetic lives. `run`'s comparison table (compare.py), the roofline of any trace (roofline.py) and AT601
use it; each formula is a small function tested against torch's FlopCounterMode or a hand count.

Conventions (FlopCounterMode's, where it has one): a multiply-add is 2 FLOPs; a GEMM's bias add and an
activation are not counted; attention counts its two matmuls, 2*D FLOPs per (query, key) pair and query head,
over the pairs a causal or windowed mask leaves (FlopCounterMode counts the full rectangle; a fused kernel skips
the masked blocks, so the pairs are the useful work). Its backward is 2x the forward in model FLOPs (four
matmuls, PaLM's MFU convention) and 2.5x in hardware FLOPs (fused kernels recompute the scores first, as
FlopCounterMode counts it). Elementwise ops,
reductions, norms and copies are modelled by bytes only: every tensor input read once, an output written once,
an estimate of DRAM traffic that caches can only lower."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

ITEMSIZE = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "bool": 1, "long int": 8, "int": 4,
            "short int": 2, "signed char": 1, "unsigned char": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
            "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "long unsigned int": 8}
# The peak a matmul on these inputs is held to (fp32 is TF32 or plain FP32 by the kernel that ran).
PRECISION = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64",
             "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
             "c10::Float8_e5m2fnuz": "fp8"}
GEMMS = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::matmul"}
RANK = {"aten::mm": 2, "aten::addmm": 2, "aten::_scaled_mm": 2, "aten::bmm": 3, "aten::baddbmm": 3,
        "aten::addbmm": 3}  # operand ranks the op takes
ATTENTION_BACKWARD_MODEL = 2.0  # backward over forward FLOPs: dS, dP, dQ, dK, dV need four matmuls
ATTENTION_BACKWARD_HARDWARE = 2.5  # ... and a fused backward recomputes S = QK^T first: five


@dataclass(frozen=True)
class Cost:
    """What one op costs: FLOPs the model needs, FLOPs the hardware runs (more where a kernel recomputes),
    bytes moved, the precision its FLOPs run in, and its op class."""
    kind: str  # gemm, conv, attention, elementwise, reduction, norm, copy, communication
    flops: float
    hw_flops: float
    bytes: float
    precision: str | None  # bf16, fp16, fp8, fp32 (tf32 when the kernel says so), None for bytes-only ops
    shape: str  # a short text of the shapes that decided it, for tables and findings
    # The part of `bytes` counted from tensor lists at LIST_ITEMSIZE, their element type not being recorded.
    assumed_list_bytes: float = 0.0


def _tensors(dims: Any, types: Any) -> list[tuple[list[int], str]]:
    """(shape, type) of the inputs that are tensors of a known element size; a scalar tensor is shape []."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return []
    return [(d, t) for d, t in zip(dims, types, strict=False)
            if isinstance(d, list) and t in ITEMSIZE and all(isinstance(x, int) for x in d)]


def _size(shape: list[int], dtype: str) -> int:
    return math.prod(shape) * ITEMSIZE.get(dtype, 0)


def _ints(text: Any) -> list[int] | None:
    """A recorded int list ('[1, 1]') or int ('2') as a list of ints."""
    if isinstance(text, int) and not isinstance(text, bool):
        return [text]
    if not isinstance(text, str):
        return None
    try:
        return [int(x) for x in text.strip("[]").split(",") if x.strip()]
    except ValueError:
        return None


def _flag(concrete: Any, index: int) -> str:
    return str(concrete[index]).strip().lower() if isinstance(concrete, list) and len(concrete) > index else ""


# --- GEMMs ----------------------------------------------------------------------------------------
def matmul_flops(a: list[int], b: list[int]) -> float:
    """2*M*N*K over the broadcast batch of a @ b (torch.matmul's rules, 1-D operands included)."""
    if not a or not b:
        return 0.0
    a2 = [1, *a] if len(a) == 1 else a
    b2 = [*b, 1] if len(b) == 1 else b
    m, k, n = a2[-2], a2[-1], b2[-1]
    batch_a, batch_b = a2[:-2], b2[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a = [1] * (width - len(batch_a)) + batch_a
    batch_b = [1] * (width - len(batch_b)) + batch_b
    batch = math.prod(max(x, y) for x, y in zip(batch_a, batch_b, strict=True))
    return 2.0 * batch * m * n * k


def gemm_cost(name: str, dims: Any, types: Any) -> Cost | None:
    """mm, addmm, bmm, baddbmm, addbmm, matmul, linear and fp8's _scaled_mm: their backward runs as mm/bmm ops,
    which this counts where they launch."""
    tensors = _tensors(dims, types)
    first = 1 if name in ("aten::addmm", "aten::baddbmm", "aten::addbmm") else 0  # after the bias
    if len(tensors) < first + 2:
        return None
    (a, dtype), (b, _) = tensors[first], tensors[first + 1]
    if name == "aten::linear":  # weight is [out, in]
        if len(b) != 2 or not a:
            return None
        flops = 2.0 * math.prod(a[:-1]) * a[-1] * b[0]
        out = math.prod(a[:-1]) * b[0]
    elif len(a) != RANK.get(name, len(a)) or len(b) != RANK.get(name, len(b)):
        return None
    else:
        flops = matmul_flops(a, b)
        a2, b2 = ([1, *a] if len(a) == 1 else a), ([*b, 1] if len(b) == 1 else b)
        out = flops / 2.0 / max(1, a2[-1])
        if name == "aten::addbmm":  # the batch is summed into one [M, N]
            out = a2[-2] * b2[-1]
    moved = _size(a, dtype) + _size(b, tensors[first + 1][1]) + out * ITEMSIZE[dtype]
    if first:
        moved += _size(*tensors[0])
    precision = PRECISION.get(dtype)
    return Cost("gemm", flops, flops, float(moved), precision, f"{_shape(a)} x {_shape(b)}")


def _shape(shape: list[int]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


# --- convolutions ---------------------------------------------------------------------------------
# Where each op records (stride, padding, dilation, transposed, groups) in Concrete Inputs: -1 is not recorded
# (not transposed). cudnn_convolution(input, weight, padding, stride, dilation, groups, ...) has its own order.
CONV_ARGS = {
    "aten::convolution": (3, 4, 5, 6, 8), "aten::_convolution": (3, 4, 5, 6, 8),
    "aten::conv1d": (3, 4, 5, -1, 6), "aten::conv2d": (3, 4, 5, -1, 6), "aten::conv3d": (3, 4, 5, -1, 6),
    "aten::cudnn_convolution": (3, 2, 4, -1, 5), "aten::cudnn_convolution_relu": (3, 4, 5, -1, 6),
    "aten::cudnn_convolution_add_relu": (5, 6, 7, -1, 8), "aten::miopen_convolution": (4, 3, 5, -1, 6),
    "aten::cudnn_convolution_transpose": (4, 3, 5, -2, 6),  # -2: transposed by name
    "aten::conv_transpose1d": (3, 4, 6, -2, 7), "aten::conv_transpose2d": (3, 4, 6, -2, 7),
    "aten::conv_transpose3d": (3, 4, 6, -2, 7),
}
CONV_BACKWARD = "aten::convolution_backward"  # (grad_out, input, weight, bias_sizes, stride, padding, dilation,
#                                               transposed, output_padding, groups, output_mask)


def conv_flops(x: list[int], w: list[int], stride: list[int], padding: list[int], dilation: list[int],
               transposed: bool, groups: int) -> tuple[float, list[int]]:
    """2 * batch * (weight elements) * (output positions), FlopCounterMode's count; for a transposed conv the
    positions are the input's. Returns the FLOPs and the output's spatial shape."""
    spatial = x[2:]
    kernel = w[2:]
    nd = len(spatial)

    def pick(values: list[int], i: int, default: int) -> int:
        return values[i] if len(values) > i else (values[0] if values else default)

    if transposed:
        out = [(spatial[i] - 1) * pick(stride, i, 1) - 2 * pick(padding, i, 0) + pick(dilation, i, 1)
               * (kernel[i] - 1) + 1 for i in range(nd)]
        positions = math.prod(spatial)
    else:
        out = [(spatial[i] + 2 * pick(padding, i, 0) - pick(dilation, i, 1) * (kernel[i] - 1) - 1)
               // pick(stride, i, 1) + 1 for i in range(nd)]
        positions = math.prod(out)
    del groups  # the weight's shape already holds in_channels / groups
    return 2.0 * x[0] * math.prod(w) * max(0, positions), out


def conv_cost(name: str, dims: Any, types: Any, concrete: Any) -> Cost | None:
    backward = name == CONV_BACKWARD
    if not backward and name not in CONV_ARGS:
        return None
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    at = 1 if backward else 0
    if len(dims) < at + 2 or len(types) < at + 2:
        return None
    x, w = dims[at], dims[at + 1]
    dtype = types[at]
    if not (isinstance(x, list) and isinstance(w, list)) or len(x) < 3 or len(x) != len(w) or dtype not in ITEMSIZE:
        return None
    if not all(isinstance(v, int) for v in x + w):
        return None
    if backward:
        stride_at, pad_at, dil_at, trans_at, groups_at = 4, 5, 6, 7, 9
    else:
        stride_at, pad_at, dil_at, trans_at, groups_at = CONV_ARGS[name]
    concrete = concrete if isinstance(concrete, list) else []

    def ints(index: int, default: int) -> list[int]:
        found = _ints(concrete[index]) if 0 <= index < len(concrete) else None
        return found if found else [default]

    transposed = trans_at == -2 or (trans_at >= 0 and _flag(concrete, trans_at) == "true")
    groups = ints(groups_at, 1)[0]
    flops, out = conv_flops(x, w, ints(stride_at, 1), ints(pad_at, 0), ints(dil_at, 1), transposed, groups)
    channels_out = w[1] * groups if transposed else w[0]
    y_size = x[0] * channels_out * math.prod(out) * ITEMSIZE[dtype]
    moved = _size(x, dtype) + _size(w, dtype) + y_size
    if backward:
        mask = [m.strip().lower() == "true" for m in str(concrete[10]).strip("[]").split(",")] \
            if len(concrete) > 10 else [True, True, False]
        passes = int(bool(mask and mask[0])) + int(len(mask) > 1 and mask[1])
        flops *= passes
        moved = moved + y_size * max(0, passes - 1)  # grad_out read once per pass, grads written
    return Cost("conv", flops, flops, float(moved), PRECISION.get(dtype),
                f"{_shape(x)} * {_shape(w)}" + (" bwd" if backward else ""))


# --- attention ------------------------------------------------------------------------------------
def attended_pairs(shape: dict[str, Any], causal: bool) -> int:
    """(query, key) pairs that take part, summed over the batch, for one head: queries are the last q_len
    positions, a causal query sees keys up to its own position, a window only the last `window` of them,
    and variable length only the sequence's own tokens (padded rows are not useful work)."""
    kv = shape["seq"]
    q = shape.get("query_len") or kv
    window = shape.get("window")
    if not shape.get("lengths"):  # every sequence alike: in closed form (a loop over rows costs per call)
        return shape["batch"] * _pairs_one(q, kv, causal, window)
    lengths = shape["lengths"]
    offset = kv - q
    total = 0
    for length in lengths:
        for row in range(min(q, length)):
            pos = row + offset
            hi = min(pos + 1, length) if causal else length
            lo = max(0, pos - window + 1) if window else 0
            total += max(0, hi - lo)
    return total


def _pairs_one(q: int, kv: int, causal: bool, window: int | None) -> int:
    """Pairs of one sequence of q queries (the last q of kv positions) against kv keys."""
    offset = kv - q

    def seen_below(limit: int) -> int:
        """Sum over positions p in [offset, limit) of min(p + 1, window) (or p + 1 without a window)."""
        def tri(n: int) -> int:  # sum of 1..n
            return n * (n + 1) // 2
        if limit <= offset:
            return 0
        if window is None:
            return tri(limit) - tri(offset)
        split = min(max(window - 1, offset), limit)  # positions below it see p + 1 < window keys
        return (tri(split) - tri(offset)) + (limit - split) * window

    if causal:
        return seen_below(kv)
    if window:  # a window without causality: keys in (p - window, kv)
        return sum(kv - max(0, p - window + 1) for p in range(offset, kv))
    return q * kv


def attention_flops(shape: dict[str, Any], causal: bool, backward: bool) -> float:
    """Useful FLOPs of one call: two matmuls of 2*D FLOPs per attended (query, key) pair and head, and 2.5x
    that again for the backward (the fused kernels' count, as `run` reports it)."""
    forward = 4.0 * shape["head_dim"] * shape["heads"] * attended_pairs(shape, causal)
    return forward * (1.0 + ATTENTION_BACKWARD_HARDWARE if backward else 1.0)


@dataclass(frozen=True)
class AttentionOp:
    layout: str  # bhsd or bshd (FlashAttention's and xFormers' own ops)
    q: int  # input index of the query (1 in a backward: grad_out comes first)
    causal: int  # Concrete Inputs index of is_causal (or custom_mask_type)
    backward: bool
    mask_type: bool = False  # causal given as xFormers' custom_mask_type (1 top-left, 2 bottom-right)


ATTENTION_OPS = {
    "aten::scaled_dot_product_attention": AttentionOp("bhsd", 0, 5, False),
    "aten::_scaled_dot_product_flash_attention": AttentionOp("bhsd", 0, 4, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu": AttentionOp("bhsd", 0, 4, False),
    "aten::_scaled_dot_product_efficient_attention": AttentionOp("bhsd", 0, 6, False),
    "aten::_scaled_dot_product_cudnn_attention": AttentionOp("bhsd", 0, 6, False),
    "aten::_scaled_dot_product_fused_attention_overrideable": AttentionOp("bhsd", 0, 5, False),
    "aten::_flash_attention_forward": AttentionOp("bshd", 0, 8, False),
    "aten::_efficient_attention_forward": AttentionOp("bshd", 0, 9, False, mask_type=True),
    "aten::_cudnn_attention_forward": AttentionOp("bhsd", 0, 10, False),
    "aten::_scaled_dot_product_flash_attention_backward": AttentionOp("bhsd", 1, 11, True),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": AttentionOp("bhsd", 1, 7, True),
    "aten::_scaled_dot_product_efficient_attention_backward": AttentionOp("bhsd", 1, 11, True),
    "aten::_scaled_dot_product_cudnn_attention_backward": AttentionOp("bhsd", 1, 14, True),
    "aten::_flash_attention_backward": AttentionOp("bshd", 1, 11, True),
    "aten::_efficient_attention_backward": AttentionOp("bshd", 1, 14, True, mask_type=True),
    "aten::_cudnn_attention_backward": AttentionOp("bhsd", 1, 14, True),
}
# Third-party fused attention (torch.library ops, [batch, seq, heads, head_dim]) and FlexAttention's Triton
# template launch (q, k, v first, [batch, heads, seq, head_dim]): their masks are not recorded.
FUSED_ATTENTION = [(re.compile(r"^flash_attn(_3)?::|^xformers(_flash3?)?::"), "bshd"),
                   (re.compile(r"^triton_tem_.*flex_(attention|decoding)"), "bhsd")]


def attention_cost(name: str, dims: Any, types: Any, concrete: Any) -> Cost | None:
    spec = ATTENTION_OPS.get(name)
    causal_told: bool | None = None
    if spec is not None:
        layout, at, backward = spec.layout, spec.q, spec.backward
        flag = _flag(concrete, spec.causal)
        causal_told = flag in ("1", "2") if spec.mask_type else flag == "true"
    else:
        found = next((layout for pattern, layout in FUSED_ATTENTION if pattern.search(name)), None)
        if found is None:
            return None
        layout, at, backward = found, 0, bool(re.search(r"backward|bwd", name))
    if not isinstance(dims, list) or len(dims) < at + 3 or not isinstance(types, list) or len(types) <= at:
        return None
    q, k, v = dims[at], dims[at + 1], dims[at + 2]
    if not all(isinstance(t, list) and len(t) == 4 and all(isinstance(x, int) for x in t) for t in (q, k, v)):
        return None  # 3-D: variable length packed, whose lengths the trace does not hold
    if layout == "bshd":
        q, k, v = ([t[0], t[2], t[1], t[3]] for t in (q, k, v))
    dtype = types[at]
    if dtype not in ITEMSIZE:
        return None
    batch, heads, q_len, d_qk = q
    kv_len, d_v = k[2], v[3]
    # Unknown causality (third-party, Flex): causal where there is more than one query, as sites.py assumes.
    causal = causal_told if causal_told is not None else q_len > 1
    if q_len > kv_len:  # more queries than keys (cross attention): the rectangle
        pairs = heads * batch * q_len * kv_len
    else:
        pairs = heads * attended_pairs({"batch": batch, "seq": kv_len, "query_len": q_len}, causal)
    forward = 2.0 * pairs * (d_qk + d_v)
    item = ITEMSIZE[dtype]
    qo = batch * heads * q_len * (d_qk + d_v) * item  # q read, o written
    kv = (math.prod(k) + math.prod(v)) * item
    if backward:
        flops, hw = forward * ATTENTION_BACKWARD_MODEL, forward * ATTENTION_BACKWARD_HARDWARE
        moved = 2 * qo + 2 * kv + batch * heads * q_len * d_v * item  # q, o, dO read; dQ, dK, dV written
    else:
        flops = hw = forward
        moved = qo + kv
    mask = "causal" if causal else "full"
    return Cost("attention", flops, hw, float(moved), PRECISION.get(dtype),
                f"B={batch} H={heads} KV={k[1]} Sq={q_len} Skv={kv_len} D={d_qk} {mask}"
                + (" bwd" if backward else ""))


# --- bytes-only ops -------------------------------------------------------------------------------
NORMS = re.compile(r"norm|rms_norm")
REDUCTIONS = re.compile(r"^aten::(sum|mean|max|min|amax|amin|argmax|argmin|prod|norm|std|var|cumsum|softmax|"
                        r"_softmax|_log_softmax|log_softmax|logsumexp|_softmax_backward_data|"
                        r"_log_softmax_backward_data|nll_loss\w*|cross_entropy\w*|embedding_dense_backward|"
                        r"_safe_softmax|topk|sort)$")
COPIES = {"aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy", "aten::to", "aten::cat",
          "aten::stack", "aten::index_select", "aten::gather", "aten::scatter", "aten::index", "aten::embedding",
          "aten::fill_", "aten::zero_", "aten::zeros", "aten::ones", "aten::full", "aten::_foreach_copy_"}


WRITE_ONLY = {"aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_", "aten::random_", "aten::bernoulli_"}
# Elementwise ops whose output is bool, one byte an element whatever their inputs: counted at the inputs' size,
# an fp32 isneginf's bound was 1.6x the time the kernel took (a kernel past its roof).
BOOL_OUTPUT = {"aten::eq", "aten::ne", "aten::lt", "aten::le", "aten::gt", "aten::ge", "aten::isnan", "aten::isinf",
               "aten::isneginf", "aten::isposinf", "aten::isfinite", "aten::signbit", "aten::logical_and",
               "aten::logical_or", "aten::logical_xor", "aten::logical_not", "aten::isclose"}


# Ops that read only the rows they select: a lookup in a 151,936-row vocabulary counted the whole table, and ran
# "3.6x past its roof".
GATHERS = {"aten::index_select", "aten::embedding", "aten::gather"}
# Reductions write far less than they read: their result is counted as nothing, so that the bound stays a bound
# (an fp32 mean over the last of [16, 559, 1024], counted as written whole, ran 1.4x past its roof).
SMALL_RESULT = re.compile(r"^aten::(sum|mean|max|min|amax|amin|argmax|argmin|prod|norm|linalg_vector_norm|std|var|"
                          r"logsumexp|all|any)$")


# Losses that touch one class of each sample, by the position of their input among the arguments: the forward
# reads each sample's target class, and the backward writes it into a gradient that a fill_ of its own zeroed
# (counted on that op). Counted whole ([4088, 8192]), a GPT-2 sample's ran 3.5x and 6.5x past their roof.
PICKED_PER_SAMPLE = {"aten::nll_loss_forward": 0, "aten::nll_loss2d_forward": 0, "aten::nll_loss_backward": 1,
                     "aten::nll_loss2d_backward": 1}


def _picked_bytes(name: str, dims: list[Any], types: list[Any]) -> int | None:
    """The target read and one element of the input read (forward) or written (backward) per sample."""
    at = PICKED_PER_SAMPLE[name]
    if len(dims) < at + 2 or len(types) < at + 2:
        return None
    target = dims[at + 1]
    if not isinstance(target, list) or not all(isinstance(x, int) for x in target):
        return None
    return math.prod(target) * (ITEMSIZE.get(types[at], 4) + ITEMSIZE.get(types[at + 1], 8))


# Elementwise ops by the argument counts of their schemas without out=. One argument more, a tensor last, is the
# out= buffer (aten::mul.out(self, other, *, out)): written once, not read. Counted as read, the fp32 `mul`s of a
# corpus trace with out= ran 1.1-1.3x past their roof.
ARGS_BEFORE_OUT = {"aten::mul": {2}, "aten::div": {2, 3}, "aten::add": {3}, "aten::sub": {3}, "aten::pow": {2},
                   "aten::maximum": {2}, "aten::minimum": {2}, "aten::where": {3}, "aten::addcmul": {4},
                   "aten::addcdiv": {4}, "aten::lerp": {3}, "aten::clamp": {3}, "aten::neg": {1}, "aten::exp": {1},
                   "aten::log": {1}, "aten::sqrt": {1}, "aten::rsqrt": {1}, "aten::abs": {1}, "aten::sigmoid": {1},
                   "aten::tanh": {1}, "aten::silu": {1}, "aten::gelu": {2}, "aten::reciprocal": {1}}


def _has_out_buffer(name: str, dims: list[Any], types: list[Any]) -> bool:
    """Whether the op's last argument is its out= tensor (ARGS_BEFORE_OUT)."""
    if len(dims) - 1 not in ARGS_BEFORE_OUT.get(name, ()) or len(types) != len(dims):
        return False
    last = dims[-1]
    return isinstance(last, list) and bool(last) and types[-1] in ITEMSIZE and all(isinstance(x, int) for x in last)


def _distinct(shape: list[int], strides: Any) -> int:
    """Elements a tensor holds in memory: a dimension of stride 0 (an expand() or a broadcast) repeats the same
    elements, so it adds none. Without its strides (not recorded, or not this shape's), every element."""
    if not isinstance(strides, list) or len(strides) != len(shape) or not all(isinstance(s, int) for s in strides):
        return math.prod(shape)
    return math.prod(n for n, stride in zip(shape, strides, strict=True) if stride != 0)


def _gathered_bytes(name: str, tensors: list[tuple[list[int], int]], distinct: list[int], concrete: Any) -> int | None:
    """The index read, and the selected elements read and written once each; an expanded index or source is read
    once, however often its elements are picked."""
    if len(tensors) < 2:
        return None
    (source, size), (index, index_size) = tensors[0], tensors[1]
    picked = math.prod(index)
    if name == "aten::embedding":  # (weight [rows, dim], indices): a row of the weight for each index
        per_pick = math.prod(source[1:])
    elif name == "aten::index_select":  # (self, dim, index): the slices of self along dim that index names
        dim = _ints(concrete[1]) if isinstance(concrete, list) and len(concrete) > 1 else None
        axis = dim[0] if dim and -len(source) <= dim[0] < len(source) else 0
        per_pick = math.prod(source) // source[axis] if source[axis] else 0
    else:  # gather (self, dim, index): one element of self for each of index's
        per_pick = 1
    return distinct[1] * index_size + (min(picked * per_pick, distinct[0]) + picked * per_pick) * size


# The element type of a tensor list is not recorded ("TensorList"): 4 bytes is assumed (optimizer states are
# fp32) unless a kernel the op ran names its element size (with_list_itemsize): a bf16 `cat` counted at 4 bytes
# ran "1.94x past its roof".
LIST_ITEMSIZE = 4
OPAQUE_ITEM = re.compile(r"OpaqueType<(\d+)u?>")


def _list_elements(name: str, dims: list[Any], types: list[Any]) -> int:
    """Elements an op moves through its tensor-list inputs: each list read, and the first (a cat's or stack's
    inputs) written again, or, for a fused Adam, every list but the parameters' written back."""
    lists = [sum(math.prod(x) for x in d if all(isinstance(v, int) for v in x))
             for d, t in zip(dims, types, strict=False)
             if isinstance(d, list) and d and all(isinstance(x, list) for x in d) and isinstance(t, str)
             and t.startswith("TensorList")]
    if not lists:
        return 0
    return sum(lists) + (sum(lists[1:]) if name.startswith("aten::_fused_adam") else lists[0])


def kernel_itemsize(kernels: Iterable[str]) -> int | None:
    """The element size that the kernels' templates name (CatArrayBatchedCopy<OpaqueType<2u>, ...>), where they
    name one and agree."""
    sizes = {int(found.group(1)) for found in map(OPAQUE_ITEM.search, kernels) if found}
    return sizes.pop() if len(sizes) == 1 else None


def with_list_itemsize(cost: Cost, kernels: Iterable[str]) -> Cost:
    """The cost with its tensor lists counted at the element size its kernels name, where they name one."""
    size = kernel_itemsize(kernels) if cost.assumed_list_bytes else None
    if not size or size == LIST_ITEMSIZE:
        return cost
    return replace(cost, bytes=cost.bytes + cost.assumed_list_bytes * (size / LIST_ITEMSIZE - 1),
                   assumed_list_bytes=0.0)


def op_bytes(name: str, dims: Any, types: Any, concrete: Any = None, strides: Any = None) -> int | None:
    """Bytes an op reads and writes, from its recorded input shapes: every tensor input read once, and an
    output written (a GEMM's [.., M, N], a fused attention's query-shaped one, an in-place op's self, an
    elementwise op's largest input). A list of tensors (a foreach or fused optimizer op) counts each one. An
    input's broadcast dimensions (stride 0 in Input Strides) are read once: an expanded [32, 16, 2048, 64] key
    counted whole made a GQA copy's bound 4x what it reads, and the row ran past its roof."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    listed = _list_elements(name, dims, types)
    if listed:
        return LIST_ITEMSIZE * listed
    at = [k for k, (d, t) in enumerate(zip(dims, types, strict=False))
          if isinstance(d, list) and d and t in ITEMSIZE and all(isinstance(x, int) for x in d)]
    if not at:  # [] is a wrapped scalar (a Python number): not read from memory
        return None
    tensors = [(dims[k], ITEMSIZE[types[k]]) for k in at]
    given = strides if isinstance(strides, list) else []
    distinct = [_distinct(dims[k], given[k] if k < len(given) else None) for k in at]
    sizes = [math.prod(d) * size for d, size in tensors]  # as written: an output has the broadcast shape
    reads = [n * size for n, (_, size) in zip(distinct, tensors, strict=True)]
    if name in PICKED_PER_SAMPLE:
        return _picked_bytes(name, dims, types)
    if name in GATHERS:
        return _gathered_bytes(name, tensors, distinct, concrete)
    if SMALL_RESULT.match(name):
        return sum(reads)
    first = 1 if name in ("aten::addmm", "aten::baddbmm", "aten::addbmm") else 0  # after the bias
    if name in GEMMS and len(tensors) >= first + 2:
        (a, size), (b, _) = tensors[first], tensors[first + 1]
        # A tensor after the operands is the out= buffer: written once, not read.
        return sum(reads[: first + 2]) + math.prod(a[:-1]) * b[-1] * size
    if name.startswith("triton_"):
        return sum(reads)  # a Triton kernel's recorded inputs are all its buffers, outputs included
    if name == "aten::copy_":
        return sizes[0] + sum(reads[1:])  # write the destination, read the source
    if name in WRITE_ONLY:
        return sizes[0]
    if "attention" in name or name.endswith("_"):  # a fused attention's output, an in-place op's self
        return sum(reads) + sizes[0]
    if name in BOOL_OUTPUT:
        return sum(reads) + max(math.prod(d) for d, _ in tensors)
    if len(sizes) >= 2 and _has_out_buffer(name, dims, types):
        return sum(reads[:-1]) + sizes[-1]  # the inputs read, the out= buffer written
    return sum(reads) + max(sizes)


def bytes_kind(name: str) -> str:
    """The class of a bytes-only op, by name."""
    if name.startswith("triton_"):
        return "reduction" if name.startswith(("triton_red", "triton_per")) else "elementwise"
    if REDUCTIONS.match(name):
        return "reduction"
    if NORMS.search(name):
        return "norm"
    if name in COPIES:
        return "copy"
    return "elementwise"


# --- communication --------------------------------------------------------------------------------
# Bus bytes per byte of the collective's buffer on n ranks (NCCL's busBw convention, nccl-tests PERFORMANCE.md):
# what each rank's links carry, so that one figure compares against the link's bandwidth for every collective.
BUS_FACTOR = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}
COLLECTIVE_NAMES = [(re.compile(p, re.IGNORECASE), kind) for p, kind in (
    (r"all_?reduce", "allreduce"), (r"all_?gather|allgather", "allgather"),
    (r"reduce_?scatter", "reducescatter"), (r"all_?to_?all", "alltoall"), (r"broadcast", "broadcast"),
    (r"\breduce|::reduce", "reduce"), (r"send", "send"), (r"recv", "recv"))]


def collective_kind(name: str) -> str | None:
    return next((kind for pattern, kind in COLLECTIVE_NAMES if pattern.search(name)), None)


def bus_bytes(collective: str, buffer_bytes: float, ranks: int) -> float | None:
    """Bytes on each rank's links for a collective of `buffer_bytes` (the full buffer: an all-gather's
    output, a reduce-scatter's input) over `ranks` ranks; None for an unknown collective or one rank."""
    factor = BUS_FACTOR.get(collective)
    if factor is None or ranks < 2:
        return None
    return factor(ranks) * buffer_bytes


def collective_cost(name: str, dims: Any, types: Any, ranks: int | None) -> Cost | None:
    kind = collective_kind(name)
    tensors = _tensors(dims, types)
    if kind is None or not tensors or not ranks:
        return None
    buffer = max(_size(d, t) for d, t in tensors)
    if kind == "allgather" and len(tensors) >= 2 and name.startswith("c10d::_allgather_base"):
        buffer = _size(*tensors[0])  # (output, input): the output is the whole buffer
    moved = bus_bytes(kind, buffer, ranks)
    if moved is None:
        return None
    return Cost("communication", 0.0, 0.0, moved, None, f"{kind} of {buffer} B on {ranks} ranks")


# --- one entry point ------------------------------------------------------------------------------
def op_cost(name: str, dims: Any, types: Any, concrete: Any, ranks: int | None = None,
            strides: Any = None) -> Cost | None:
    """The cost of an op from its recorded inputs, or None when no formula applies (no shapes, an op with no
    model) or the shapes are no tensor's (a negative size, a stride of 0, a count past what a float holds)."""
    if dims is None or any(isinstance(d, list) and any(isinstance(x, int) and x < 0 for x in d) for d in dims):
        return None
    try:
        cost = _op_cost(name, dims, types, concrete, ranks, strides)
    except (OverflowError, ZeroDivisionError, ValueError, TypeError, IndexError):
        return None
    if cost is None or not all(math.isfinite(v) for v in (cost.flops, cost.hw_flops, cost.bytes)):
        return None
    return cost


def _op_cost(name: str, dims: Any, types: Any, concrete: Any, ranks: int | None, strides: Any) -> Cost | None:
    if name in GEMMS or name in ("aten::linear", "aten::_scaled_mm"):
        return gemm_cost(name, dims, types)
    if name in CONV_ARGS or name == CONV_BACKWARD:
        return conv_cost(name, dims, types, concrete)
    found = attention_cost(name, dims, types, concrete)
    if found is not None or name in ATTENTION_OPS:
        return found
    if name.startswith(("c10d::", "nccl:", "record_param_comms")):
        return collective_cost(name, dims, types, ranks)
    moved = op_bytes(name, dims, types, concrete, strides)
    if moved is None:
        return None
    return Cost(bytes_kind(name), 0.0, 0.0, float(moved), None,
                ",".join(_shape(d) for d, _ in _tensors(dims, types)[:3]),
                float(LIST_ITEMSIZE * _list_elements(name, dims, types)))
