"""Check the roofline's FLOP counts and achieved rates on a GPU (issue 42).
First run on an H100 (2026-12-05): its traces held no GPU work (exported after the cycle cleared); fixed.

Each case runs one op at one shape: timed with CUDA events without the profiler (median of repeats), then
captured with the profiler (record_shapes, 3 steps of one call). `report` (run where attntrace's dependencies
are installed, e.g. this repository's venv) reads the traces back through attntrace's roofline and compares, per
case: the FLOPs attntrace/model/flops.py counts from the recorded shapes against a hand count written here, and the
achieved TFLOP/s (or TB/s) from the trace's kernel time against the CUDA-event one.

    python bench/gpu/roofline_check.py capture OUT         # on the GPU (torch only): OUT/*.pt.trace.json.gz, timings
    python bench/gpu/roofline_check.py report OUT          # anywhere with attntrace: the comparison table
    ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\\
        sm__inst_executed_pipe_tensor.sum -k regex:'gemm|nvjet|elementwise' \\
        python bench/gpu/roofline_check.py one CASE        # Nsight Compute on one case (e.g. bf16_gemm, add_bf16)

The pair `bf16_gemm_vocab_30522` / `bf16_gemm_vocab_30528` is AT601's: BERT's LM head at a misaligned and an aligned
vocabulary; their traces are the committed captures AT601 must fire on and stay silent on, and the difference of
their timed ms (scaled to 30522 columns) is the saving AT601's estimate is checked against (within 25%).
"""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

STEPS = 3


def _cases() -> dict[str, dict[str, Any]]:
    """name -> how to build the inputs, the call, the hand count of FLOPs (0 for a memory-bound op) and bytes."""
    b16 = 2
    causal_pairs = 2048 * 2049 // 2
    return {
        "bf16_gemm": dict(kind="mm", m=8192, n=8192, k=8192, dtype="bfloat16", flops=2 * 8192**3),
        "fp16_gemm": dict(kind="mm", m=4096, n=4096, k=4096, dtype="float16", flops=2 * 4096**3),
        "tf32_gemm": dict(kind="mm", m=4096, n=4096, k=4096, dtype="float32", tf32=True, flops=2 * 4096**3),
        "fp32_gemm": dict(kind="mm", m=4096, n=4096, k=4096, dtype="float32", tf32=False, flops=2 * 4096**3),
        "bf16_gemm_vocab_30522": dict(kind="linear", m=16384, n=30522, k=768, dtype="bfloat16",
                                      flops=2 * 16384 * 30522 * 768),
        "bf16_gemm_vocab_30528": dict(kind="linear", m=16384, n=30528, k=768, dtype="bfloat16",
                                      flops=2 * 16384 * 30528 * 768),
        "bf16_gemm_tiny_m": dict(kind="linear", m=4, n=8192, k=8192, dtype="bfloat16", flops=2 * 4 * 8192 * 8192),
        # conv 3x3, stride 2, padding 1, dilation 1, groups 2: output 28x28
        "bf16_conv": dict(kind="conv", batch=64, cin=128, cout=256, hw=56, kernel=3, stride=2, padding=1, groups=2,
                          dtype="bfloat16", flops=2 * 64 * (256 * 64 * 9) * 28 * 28),
        "sdpa_fwd_causal": dict(kind="sdpa", b=4, h=16, kv=16, s=2048, d=64, causal=True, backward=False,
                                dtype="bfloat16", flops=4 * 64 * 16 * 4 * causal_pairs),
        "sdpa_fwd_gqa": dict(kind="sdpa", b=4, h=16, kv=4, s=2048, d=64, causal=False, backward=False,
                             dtype="bfloat16", flops=4 * 64 * 16 * 4 * 2048 * 2048),
        "sdpa_fwdbwd_causal": dict(kind="sdpa", b=4, h=16, kv=16, s=2048, d=64, causal=True, backward=True,
                                   dtype="bfloat16", flops=4 * 64 * 16 * 4 * causal_pairs * 3.5),
        "sdpa_fwdbwd_gqa": dict(kind="sdpa", b=4, h=16, kv=4, s=2048, d=64, causal=False, backward=True,
                                dtype="bfloat16", flops=4 * 64 * 16 * 4 * 2048 * 2048 * 3.5),
        "add_bf16": dict(kind="add", numel=1 << 28, dtype="bfloat16", flops=0, bytes=3 * (1 << 28) * b16),
    }


def _build(case: dict[str, Any]) -> Callable[[], Any]:
    import torch

    torch.manual_seed(0)
    dtype = getattr(torch, case["dtype"])
    torch.backends.cuda.matmul.allow_tf32 = bool(case.get("tf32"))
    torch.backends.cudnn.allow_tf32 = bool(case.get("tf32"))
    dev = "cuda"
    if case["kind"] == "mm":
        a = torch.randn(case["m"], case["k"], device=dev, dtype=dtype)
        b = torch.randn(case["k"], case["n"], device=dev, dtype=dtype)
        return lambda: torch.mm(a, b)
    if case["kind"] == "linear":
        x = torch.randn(case["m"], case["k"], device=dev, dtype=dtype)
        layer = torch.nn.Linear(case["k"], case["n"], device=dev, dtype=dtype)
        return lambda: layer(x)
    if case["kind"] == "conv":
        x = torch.randn(case["batch"], case["cin"], case["hw"], case["hw"], device=dev, dtype=dtype)
        conv = torch.nn.Conv2d(case["cin"], case["cout"], case["kernel"], stride=case["stride"],
                               padding=case["padding"], groups=case["groups"], device=dev, dtype=dtype)
        x, conv = x.to(memory_format=torch.channels_last), conv.to(memory_format=torch.channels_last)
        return lambda: conv(x)
    if case["kind"] == "sdpa":
        shape_q = (case["b"], case["h"], case["s"], case["d"])
        shape_kv = (case["b"], case["kv"], case["s"], case["d"])
        grad = case["backward"]
        q = torch.randn(shape_q, device=dev, dtype=dtype, requires_grad=grad)
        k = torch.randn(shape_kv, device=dev, dtype=dtype, requires_grad=grad)
        v = torch.randn(shape_kv, device=dev, dtype=dtype, requires_grad=grad)
        gqa = case["kv"] != case["h"]

        def attention() -> Any:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=case["causal"], enable_gqa=gqa)
            if grad:
                out.backward(torch.ones_like(out))
            return out

        return attention
    a = torch.randn(case["numel"], device=dev, dtype=dtype)
    b = torch.randn(case["numel"], device=dev, dtype=dtype)
    return lambda: torch.add(a, b)


def _time_ms(call: Callable[[], Any], reps: int = 20) -> float:
    import torch

    for _ in range(5):
        call()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def capture(out: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": {}}
    for name, case in _cases().items():
        call = _build(case)
        ms = _time_ms(call)
        plain = out / f"{name}.pt.trace.json"
        # Exported when the active cycle ends: the profiler clears its events then, and an export after the
        # context held the CPU ops alone (the first GPU run's traces had no GPU work).
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                     schedule=schedule(wait=0, warmup=1, active=STEPS),
                     on_trace_ready=lambda done, path=str(plain): done.export_chrome_trace(path)) as prof:
            for _ in range(STEPS + 1):
                call()
                torch.cuda.synchronize()
                prof.step()
        with open(plain, "rb") as src, gzip.open(f"{plain}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        plain.unlink()
        timings["cases"][name] = {"event_ms": ms, "case": case}
        print(f"{name}: {ms:.4f} ms", flush=True)
    (out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")


def one(name: str) -> None:
    """One case, a few calls: for `ncu` (it profiles every kernel; filter with -k)."""
    import torch

    call = _build(_cases()[name])
    for _ in range(3):
        call()
    torch.cuda.synchronize()


def report(out: Path) -> None:
    from attntrace.model.loading import load
    from attntrace.model.roofline import analyse

    timings = json.loads((out / "timings.json").read_text())
    print(f"{timings['gpu']}, torch {timings['torch']}")
    print(f"{'case':<24} {'hand FLOPs':>12} {'trace FLOPs':>12} {'ratio':>7} {'event TF/s':>10} {'trace TF/s':>10} "
          f"{'event TB/s':>10} {'trace TB/s':>10} {'class':>9} {'coverage':>8}")
    for name, entry in timings["cases"].items():
        case = entry["case"]
        found = analyse(load(str(out / f"{name}.pt.trace.json.gz")))
        if found is None:
            print(f"{name:<24} no GPU work in the trace")
            continue
        steps = max(1, len(found["per_step"]))
        flops = sum(s["hw_flops"] for s in found["per_step"]) / steps
        moved = sum(c["bytes_per_step"] for c in found["classes"] if "bytes_per_step" in c)
        gpu_us = sum(c["us_per_step"] for c in found["classes"] if c["class"] not in ("unmodelled", "transfer"))
        seconds = entry["event_ms"] * 1e-3
        hand = case["flops"]
        ratio = flops / hand if hand else None
        main = max((c for c in found["classes"] if c["class"] != "unmodelled"), key=lambda c: c["us_per_step"],
                   default={})
        print(f"{name:<24} {hand:>12.4g} {flops:>12.4g} {('-' if ratio is None else f'{ratio:.4f}'):>7} "
              f"{(hand / seconds / 1e12 if hand else 0):>10.1f} {(flops / gpu_us / 1e6 if gpu_us else 0):>10.1f} "
              f"{(case.get('bytes', moved) / seconds / 1e12):>10.3f} {(moved / gpu_us / 1e6 if gpu_us else 0):>10.3f} "
              f"{main.get('class', '-')!s:>9} {100 * (found['coverage'] or 0):>7.1f}%")
    aligned = timings["cases"].get("bf16_gemm_vocab_30528", {}).get("event_ms")
    misaligned = timings["cases"].get("bf16_gemm_vocab_30522", {}).get("event_ms")
    if aligned and misaligned:
        saving = (misaligned - aligned * 30522 / 30528) * 1e3
        print(f"AT601 pair: misaligned {misaligned:.3f} ms, aligned {aligned:.3f} ms: timed saving {saving:.1f} us "
              "per call (compare AT601's impact on bf16_gemm_vocab_30522.pt.trace.json.gz: lint --select AT601)")


if __name__ == "__main__":
    verb, arg = sys.argv[1], sys.argv[2]
    {"capture": lambda: capture(Path(arg)), "report": lambda: report(Path(arg)), "one": lambda: one(arg)}[verb]()
