"""AT201's matrix-vector case on a GPU: a batch-1 fp32 decode-shaped loop (Linear layers on one token, which
cuBLAS runs as gemv kernels), captured with the profiler as a sample trace, and the same products timed without
the profiler in fp32, fp32 with TF32 allowed, and bf16: what AT201's `gemv_speedup` assumes.

Run on a CUDA machine: python bench/gpu/gemv_capture.py OUT_DIR   (writes OUT_DIR/fp32_gemv_decode.pt.trace.json.gz
and OUT_DIR/gemv_timings.json)
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import torch

HIDDEN, LAYERS, STEPS = 4096, 8, 5


def _model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(LAYERS)]
    return torch.nn.Sequential(*layers).to("cuda", dtype)


def _time_ms(model: torch.nn.Module, x: torch.Tensor, reps: int = 200) -> float:
    with torch.no_grad():
        for _ in range(20):
            model(x)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            model(x)
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fp32 = _model(torch.float32)
    token = torch.randn(1, HIDDEN, device="cuda")
    timings = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "hidden": HIDDEN,
               "layers": LAYERS}
    torch.backends.cuda.matmul.allow_tf32 = False
    timings["fp32_ms"] = _time_ms(fp32, token)
    torch.backends.cuda.matmul.allow_tf32 = True
    timings["fp32_tf32_ms"] = _time_ms(fp32, token)
    torch.backends.cuda.matmul.allow_tf32 = False
    timings["bf16_ms"] = _time_ms(_model(torch.bfloat16), token.to(torch.bfloat16))
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=STEPS)
    path = out / "fp32_gemv_decode.pt.trace.json"
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                             torch.profiler.ProfilerActivity.CUDA],
                                                 schedule=schedule, record_shapes=True,
                                                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(2 + STEPS):
            fp32(token)
            prof.step()
    with path.open("rb") as src, gzip.open(f"{path}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    (out / "gemv_timings.json").write_text(json.dumps(timings, indent=1) + "\n")
    print(json.dumps(timings))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
