"""Profile each attention variant: check it against a float64 reference, time it without the profiler,
then capture a Kineto trace of a few steps. Everything torch-specific in attntrace lives under capture/."""

from __future__ import annotations

import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from attntrace.capture.variants import VARIANTS, AttentionFn, Shape, Variant, unsupported_reason

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


@dataclass
class VariantResult:
    name: str
    description: str
    status: str  # "ok", "skipped" or "failed"
    reason: str | None = None
    rel_error: float | None = None
    event_ms: float | None = None  # per step, timed without the profiler
    trace: str | None = None
    numbers: dict[str, Any] = field(default_factory=dict)


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
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
    dims = (shape.batch, shape.heads, shape.seq, shape.head_dim)
    tensors = [torch.randn(dims, generator=gen).to(device=device, dtype=dtype) for _ in range(4)]
    q, k, v, grad_out = tensors
    for t in (q, k, v):
        t.requires_grad_(backward)
    return q, k, v, grad_out


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               causal: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Attention in float64, and the float64 leaves whose .grad the backward fills."""
    q64, k64, v64 = (t.detach().double().requires_grad_(t.requires_grad) for t in (q, k, v))
    scores = (q64 @ k64.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        seq = q.shape[-2]
        scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1),
                                    float("-inf"))
    return torch.softmax(scores, dim=-1) @ v64, (q64, k64, v64)


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got64 = got.detach().double()
    if not torch.isfinite(got64).all():
        return math.inf
    return float((got64 - want.detach()).norm() / want.detach().norm().clamp_min(1e-30))


def check_correctness(fn: AttentionFn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      grad_out: torch.Tensor, causal: bool, backward: bool) -> float:
    """Worst relative error of the output (and of dq, dk, dv with backward) against float64."""
    ref, leaves = _reference(q, k, v, causal)
    out = fn(q, k, v)
    errors = [_rel_error(out, ref)]
    if backward:
        ref.backward(grad_out.double())
        out.backward(grad_out)
        for mine, theirs in zip((q, k, v), leaves, strict=True):
            errors.append(_rel_error(mine.grad, theirs.grad))
            mine.grad = None
    return max(errors)


def _step_fn(fn: AttentionFn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
             backward: bool) -> Callable[[], None]:
    def step() -> None:
        out = fn(q, k, v)
        if backward:
            out.backward(grad_out)
            for t in (q, k, v):
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
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True, with_stack=with_stack,
                 schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(str(trace_path))) as prof:
        for _ in range(steps + 1):
            step()
            prof.step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_variant(variant: Variant, config: RunConfig, device: torch.device) -> VariantResult:
    result = VariantResult(variant.name, variant.description, "skipped")
    dtype = DTYPES[config.dtype]
    reason = unsupported_reason(variant, device, dtype, config.shape, config.backward)
    if reason:
        result.reason = reason
        return result
    q, k, v, grad_out = _make_inputs(config.shape, dtype, device, config.backward, seed=0)
    try:
        fn = variant.build(config.shape, config.causal, device)
        result.rel_error = check_correctness(fn, q, k, v, grad_out, config.causal, config.backward)
    except (RuntimeError, NotImplementedError, ValueError) as exc:
        # A pinned SDPA backend that refuses these inputs raises here: that is a skip, not a failure.
        result.reason = _first_line(exc)
        return result
    if not result.rel_error <= TOLERANCE[dtype]:
        result.status = "failed"
        result.reason = f"relative error {result.rel_error:.2e} > {TOLERANCE[dtype]:.0e} against float64"
        return result
    step = _step_fn(fn, q, k, v, grad_out, config.backward)
    for _ in range(config.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    result.event_ms = time_step(step, device)
    trace_path = config.out_dir / f"{variant.name}.pt.trace.json.gz"
    profile_steps(step, config.steps, trace_path, config.with_stack)
    result.status = "ok"
    result.trace = trace_path.name  # relative to the output directory, which may move
    return result


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def run(config: RunConfig, progress: Callable[[str], None]) -> tuple[dict[str, Any], list[VariantResult]]:
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda asked for, but torch sees no CUDA device")
    config.out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for index, name in enumerate(config.variants, 1):
        progress(f"[{index}/{len(config.variants)}] {name}")
        result = run_variant(VARIANTS[name], config, device)
        if result.status != "ok":
            progress(f"    {result.status}: {result.reason}")
        results.append(result)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    meta = {
        "config": {**asdict(config), "out_dir": str(config.out_dir), "shape": asdict(config.shape)},
        "environment": environment(device),
    }
    return meta, results
