"""Profile each attention variant: check it against a float64 reference, time it without the profiler,
then capture a Kineto trace of a few steps. Everything torch-specific in attntrace lives under capture/."""

from __future__ import annotations

import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from attntrace.capture.variants import VARIANTS, Impl, Shape, Variant, keep_mask, unsupported_reason

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Relative L2 error allowed against the float64 reference: fp32 arithmetic lands far below 1e-3,
# 16-bit operands between 1e-3 and 1e-2.
TOLERANCE = {torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 3e-2}


@dataclass(frozen=True)
class RunConfig:
    variants: tuple[str, ...]
    shape: Shape
    dtype: str
    causal: bool
    backward: bool
    steps: int
    warmup: int
    device: str
    out_dir: Path
    with_stack: bool = False


# The float64 reference holds a few [batch, heads, queries, keys] tensors: past this many score elements the
# check runs on a reduced copy of the shape (the kernel and its dispatch are the same; only sizes shrink).
REFERENCE_ELEMENTS = {"cuda": 2**27, "cpu": 2**22}


def reduced_for_check(shape: Shape, device: str) -> Shape:
    """The shape the float64 check runs at: the shape itself when its reference fits, else one batch, one KV
    head group and shorter sequences (decode keeps its query count, and queries stay no longer than keys)."""
    limit = REFERENCE_ELEMENTS.get(device, REFERENCE_ELEMENTS["cpu"])
    if shape.batch * shape.heads * shape.q_len * shape.kv_len <= limit:
        return shape
    groups = shape.heads // shape.n_kv_heads
    kv_heads = 1 if shape.gqa or shape.n_kv_heads > 1 else None
    kv_len, q_len = shape.kv_len, shape.q_len
    while groups * q_len * kv_len > limit and kv_len > 64:
        kv_len //= 2
        q_len = kv_len if not shape.decode else min(q_len, kv_len)
    lengths = None if shape.lengths is None else (kv_len,)
    window = None if shape.window is None else min(shape.window, kv_len)
    return Shape(1, groups, kv_len, shape.head_dim, kv_heads if groups > 1 else None,
                 q_len if q_len != kv_len else None, window, lengths)


@dataclass
class VariantResult:
    name: str
    description: str
    status: str  # "ok", "skipped" or "failed"
    reason: str | None = None
    rel_error: float | None = None
    event_ms: float | None = None  # per step, timed without the profiler
    trace: str | None = None
    detail: str | None = None  # PyTorch's whole message behind a skip
    warnings: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    checked_at: dict[str, Any] | None = None  # the reduced shape of the float64 check, when not the full one


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        # Which peak an fp32 GEMM is held to: TF32 tensor cores when PyTorch allows them, else plain FP32.
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = props.name
        env["compute_capability"] = f"{props.major}.{props.minor}"
    else:
        env["gpu"] = None
        env["cpu"] = platform.processor() or platform.machine()
    return env


def _make_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, backward: bool,
                 seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q_dims = (shape.batch, shape.heads, shape.q_len, shape.head_dim)
    kv_dims = (shape.batch, shape.n_kv_heads, shape.kv_len, shape.head_dim)
    q, k, v, grad_out = (torch.randn(dims, generator=gen).to(device=device, dtype=dtype)
                         for dims in (q_dims, kv_dims, kv_dims, q_dims))
    rows = _valid_rows(shape, device)
    if rows is not None:
        grad_out = grad_out * rows  # padded query rows are not part of the loss
    for t in (q, k, v):
        t.requires_grad_(backward)
    return q, k, v, grad_out


def _valid_rows(shape: Shape, device: torch.device) -> torch.Tensor | None:
    """[batch, 1, queries, 1]: which query rows hold a real token (variable length), or None for all."""
    if shape.lengths is None:
        return None
    lengths = torch.tensor(shape.lengths, device=device)
    return (torch.arange(shape.q_len, device=device)[None, :] < lengths[:, None])[:, None, :, None]


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: Shape,
               causal: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Attention in float64, and the float64 leaves whose .grad the backward fills."""
    q64, k64, v64 = (t.detach().double().requires_grad_(t.requires_grad) for t in (q, k, v))
    groups = shape.heads // shape.n_kv_heads
    kx, vx = (t.repeat_interleave(groups, dim=1) for t in (k64, v64))
    scores = (q64 @ kx.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    keep = keep_mask(shape, causal, q.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ vx, (q64, k64, v64)


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got64 = got.detach().double()
    if not torch.isfinite(got64).all():
        return math.inf
    return float((got64 - want.detach()).norm() / want.detach().norm().clamp_min(1e-30))


def check_correctness(impl: Impl, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
                      shape: Shape, causal: bool, backward: bool) -> float:
    """Worst relative error of the output (and of dq, dk, dv with backward) against float64, over the
    query rows that hold real tokens."""
    ref, leaves = _reference(q, k, v, shape, causal)
    inputs = impl.prepare(q, k, v) if impl.prepare else (q, k, v)
    out = impl.call(*inputs)
    dense = impl.dense(out) if impl.dense else out
    rows = _valid_rows(shape, q.device)
    if rows is None:
        errors = [_rel_error(dense, ref)]
    else:
        errors = [_rel_error(dense.detach().masked_fill(~rows, 0), ref.detach().masked_fill(~rows, 0))]
    if backward:
        ref.backward(grad_out.double())
        out.backward(grad_out)
        for mine, theirs in zip((q, k, v), leaves, strict=True):
            errors.append(_rel_error(mine.grad, theirs.grad))
            mine.grad = None
    return max(errors)


def _step_fn(impl: Impl, inputs: tuple[torch.Tensor, ...], grad_out: torch.Tensor, shape: Shape,
             backward: bool) -> Callable[[], None]:
    """One step: a forward (and backward). In decode it first writes the new tokens' K and V into the cache,
    as a generation loop does."""
    cache_writes = []
    if shape.decode:
        k, v = inputs[1], inputs[2]
        cache_writes = [(t.narrow(2, shape.kv_len - shape.q_len, shape.q_len), t[:, :, -shape.q_len:].clone())
                        for t in (k, v)]

    def step() -> None:
        for slot, new in cache_writes:
            slot.copy_(new)
        out = impl.call(*inputs)
        if backward:
            out.backward(grad_out)
            for t in inputs:
                t.grad = None

    return step


def time_step(step: Callable[[], None], device: torch.device, calls: int = 10, repeats: int = 5) -> float:
    """Milliseconds of device time per step, without the profiler (median of `repeats` runs)."""
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            # A long sleep kernel first keeps the GPU queue full, so the events time the kernels
            # back to back and not the CPU's launch gaps: the same thing as the trace's busy time.
            torch.cuda._sleep(200_000_000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                step()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / calls)
        else:
            begin = time.perf_counter()
            for _ in range(calls):
                step()
            samples.append((time.perf_counter() - begin) * 1e3 / calls)
    return statistics.median(samples)


def profile_steps(step: Callable[[], None], steps: int, trace_path: Path, with_stack: bool = False) -> None:
    """Capture `steps` steps through attntrace.profile: as many steps before them run with the profiler off and are
    timed, and the trace keeps those timings (its "attntrace_measured" metadata)."""
    from torch.profiler import ProfilerActivity, schedule

    from attntrace.capture.measured import profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True, with_stack=with_stack,
                 schedule=schedule(wait=steps, warmup=1, active=steps, repeat=1),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(str(trace_path))) as prof:
        for _ in range(2 * steps + 1):
            step()
            prof.step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_variant(variant: Variant, config: RunConfig, device: torch.device) -> VariantResult:
    """Check, time and profile one variant. PyTorch's warnings and anything its C++ side prints while it
    runs are kept in the result rather than printed over the table."""
    with warnings.catch_warnings(record=True) as caught, _captured_stderr() as printed:
        warnings.simplefilter("always")
        result = _run_variant(variant, config, device, caught)
    messages = [f"{w.category.__name__}: {str(w.message).strip()}" for w in caught] + printed
    result.warnings = [f"{text} (x{n})" if n > 1 else text for text, n in Counter(messages).items()]
    return result


def _run_variant(variant: Variant, config: RunConfig, device: torch.device,
                 caught: list[warnings.WarningMessage]) -> VariantResult:
    result = VariantResult(variant.name, variant.description, "skipped")
    dtype = DTYPES[config.dtype]
    shape = config.shape
    reason = unsupported_reason(variant, device, dtype, shape, config.backward)
    if reason:
        result.reason = reason
        return result
    check = reduced_for_check(shape, device.type)
    try:
        if check != shape:
            result.checked_at = asdict(check)
            built = variant.build(check, config.causal, device)
            small = built if isinstance(built, Impl) else Impl(built)
            cq, ck, cv, cgrad = _make_inputs(check, dtype, device, config.backward, seed=0)
            result.rel_error = check_correctness(small, cq, ck, cv, cgrad, check, config.causal, config.backward)
            del small, cq, ck, cv, cgrad
        q, k, v, grad_out = _make_inputs(shape, dtype, device, config.backward, seed=0)
        built = variant.build(shape, config.causal, device)
        impl = built if isinstance(built, Impl) else Impl(built)
        if check == shape:
            result.rel_error = check_correctness(impl, q, k, v, grad_out, shape, config.causal, config.backward)
        inputs = impl.prepare(q, k, v) if impl.prepare else (q, k, v)
    except (RuntimeError, NotImplementedError, ValueError, TypeError, AssertionError) as exc:
        # A pinned SDPA backend that refuses these inputs raises here: that is a skip, not a failure. The
        # table gets one phrase; run.json keeps PyTorch's whole message.
        warned = [str(w.message) for w in caught]
        result.reason = short_reason(exc, warned, variant.name)
        result.detail = _full_text(exc, backend_reasons(warned, variant.name))
        return result
    if not result.rel_error <= TOLERANCE[dtype]:
        result.status = "failed"
        result.reason = f"relative error {result.rel_error:.2e} > {TOLERANCE[dtype]:.0e} against float64"
        return result
    step = _step_fn(impl, inputs, grad_out, shape, config.backward)
    trace_path = config.out_dir / f"{variant.name}.pt.trace.json.gz"
    try:
        for _ in range(config.warmup):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        result.event_ms = time_step(step, device)
        profile_steps(step, config.steps, trace_path, config.with_stack)
    except torch.OutOfMemoryError:
        # A real model's shapes can be past what an unfused variant fits in memory: a skip, not a crash.
        result.reason = "out of memory at this shape"
        return result
    result.status = "ok"
    result.trace = trace_path.name  # relative to the output directory, which may move
    return result


@contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Collect what is written to file descriptor 2 (Kineto's and cuBLAS's C++ messages) in the block."""
    lines: list[str] = []
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to redirect
        yield lines
        return
    with tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(line.rstrip() for line in sink.read().decode(errors="replace").splitlines()
                         if line.strip())


_BACKEND_HEADERS = {"flash": "flash attention kernel not used because",
                    "efficient": "memory efficient kernel not used because",
                    "cudnn": "cudnn attention kernel not used because"}
_SHORTENERS = [
    (re.compile(r"less than or equal to (\d+)\. Got Query\.size\(-1\): (\d+)"),
     lambda m: f"head dim {m[2]} > {m[1]}"),
    (re.compile(r"dtype: \{([^}]*)\}\. Got Query dtype: (\w+)"), lambda m: f"dtype {m[2]} not in {m[1]}"),
    (re.compile(r"not support non-null attn_mask", re.I), lambda m: "no attn_mask support"),
    (re.compile(r"(?:lower|upper)[ _]right|CausalBias", re.I), lambda m: "no lower-right causal mask"),
    (re.compile(r"same num_heads|enable_gqa|number of heads in key/value", re.I),
     lambda m: "no grouped-query heads"),
    (re.compile(r"nested", re.I), lambda m: "no nested tensors"),
]


def _is_header(text: str) -> bool:
    return any(text.lower().startswith(h) for h in _BACKEND_HEADERS.values())


def backend_reasons(warned: list[str], variant: str) -> list[str]:
    """PyTorch's reasons why the backend a variant pins refused the inputs: the warnings after that
    backend's 'kernel not used because:' header, up to the next backend's header."""
    backend = next((b for b in _BACKEND_HEADERS if variant.endswith(b)), None)
    if backend is None:
        return []
    header = _BACKEND_HEADERS[backend]
    start = next((i for i, w in enumerate(warned) if w.lower().startswith(header)), None)
    if start is None:
        return []
    section = []
    for text in warned[start + 1:]:
        if _is_header(text):
            break
        section.append(_untriggered(text))
    return section


def short_reason(exc: BaseException, warned: list[str], variant: str) -> str:
    """One phrase for the table: `flash: head dim 1000 > 256` rather than PyTorch's 'No available kernel',
    whose real reason is in the warnings printed just before it."""
    backend = next((b for b in _BACKEND_HEADERS if variant.endswith(b)), None)
    section = backend_reasons(warned, variant)
    for text in [*section, str(exc)]:
        for pattern, phrase in _SHORTENERS:
            found = pattern.search(text)
            if found:
                return f"{backend}: {phrase(found)}" if backend else phrase(found)
    if backend is not None:
        return f"{backend}: {_first_sentence(section[0]) if section else _first_sentence(str(exc))}"
    return _first_sentence(str(exc)) or type(exc).__name__


def _untriggered(text: str) -> str:
    return re.sub(r"\s*\(Triggered internally at [^)]*\)\.?", "", text).strip()


def _first_sentence(text: str, limit: int = 60) -> str:
    first = re.split(r"(?<=[a-z0-9)])\. |\n", _untriggered(text), maxsplit=1)[0].strip().rstrip(".")
    return first if len(first) <= limit else first[: limit - 1].rstrip() + "…"


def _full_text(exc: BaseException, reasons: list[str]) -> str:
    return "\n".join([f"{type(exc).__name__}: {str(exc).strip()}", *reasons])


def usable_device(name: str) -> torch.device:
    """The device to measure on; RuntimeError when torch cannot use it here."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"--device cuda, but torch {torch.__version__} sees no CUDA device: run on a GPU machine "
                           "with a CUDA build of torch, or pass --device cpu (naive, math and sdpa at small shapes)")
    return device


def run(config: RunConfig, progress: Callable[[str], None]) -> tuple[dict[str, Any], list[VariantResult]]:
    device = usable_device(config.device)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for index, name in enumerate(config.variants, 1):
        progress(f"[{index}/{len(config.variants)}] {name}")
        result = run_variant(VARIANTS[name], config, device)
        # A failure is a diagnostic worth a line as it happens; a skipped variant is one row of the table, which
        # says why.
        if result.status == "failed":
            progress(f"    {name} failed: {result.reason}")
        results.append(result)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    meta = {
        "config": {**asdict(config), "out_dir": str(config.out_dir), "shape": asdict(config.shape),
                   "scenario": config.shape.scenario()},
        "environment": environment(device),
    }
    return meta, results
