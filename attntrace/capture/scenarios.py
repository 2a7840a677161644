"""Whole-program traces beyond the attention microbenchmark, for the rules that need a real workload:
a small GPT-2-style model training with eager or SDPA attention (the eager one logs its loss with
`.item()` every step), a launch-bound loop of tiny kernels, and a kernel whose occupancy really is low.

    python -m attntrace.capture.scenarios OUT_DIR [NAME ...]
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule


class Block(nn.Module):
    def __init__(self, width: int, heads: int, context: int, eager: bool) -> None:
        super().__init__()
        self.heads, self.eager = heads, eager
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))
        # As in the Hugging Face GPT-2 eager path: a causal buffer sliced and applied with torch.where.
        self.register_buffer("bias", torch.tril(torch.ones(context, context, dtype=torch.bool))[None, None])

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.eager:
            w = (q @ k.transpose(-1, -2)) / math.sqrt(k.shape[-1])
            w = torch.where(self.bias[:, :, :t, :t], w, torch.finfo(w.dtype).min)
            y = torch.softmax(w, dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, eager: bool, vocab: int = 8192, width: int = 512, heads: int = 8, layers: int = 4,
                 context: int = 512) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, context, eager) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _profile(step: Callable[[], None], path: Path, steps: int = 3, warmup: int = 3) -> None:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(steps + 1):
            step()
            prof.step()
    torch.cuda.synchronize()


def gpt2_train(out: Path, eager: bool) -> None:
    torch.manual_seed(0)
    model = TinyGPT(eager).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    idx = torch.randint(0, 8192, (8, 512), device="cuda")
    losses: list[float] = []

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if eager:
            losses.append(loss.item())  # the habit AT302 catches: a host sync every step

    _profile(step, out / f"gpt2_{'eager' if eager else 'sdpa'}_train.pt.trace.json.gz")


def launch_bound(out: Path) -> None:
    x = torch.randn(1024, device="cuda")

    def step() -> None:
        y = x
        for _ in range(200):
            y = y * 1.0001 + 0.0001
        y.sum()

    _profile(step, out / "launch_bound_tiny_ops.pt.trace.json.gz")


LOW_OCC_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// Reserves 200 KB of shared memory per 64-thread block, so one block (2 warps of 64) fits on an SM.
__global__ void attntrace_lowocc_scale(const float* __restrict__ x, float* __restrict__ y, long n) {
  extern __shared__ float stage[];
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    stage[threadIdx.x] = x[i];
    y[i] = stage[threadIdx.x] * 2.0f;
  }
}

torch::Tensor lowocc_scale(torch::Tensor x) {
  auto y = torch::empty_like(x);
  const int smem = 200 * 1024;
  cudaFuncSetAttribute(attntrace_lowocc_scale, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  attntrace_lowocc_scale<<<sms * 4, 64, smem, at::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}
"""


def low_occupancy(out: Path) -> None:
    from torch.utils.cpp_extension import load_inline

    ext = load_inline("attntrace_lowocc", cpp_sources="torch::Tensor lowocc_scale(torch::Tensor x);",
                      cuda_sources=LOW_OCC_SOURCE.replace("#include <torch/extension.h>\n", ""),
                      functions=["lowocc_scale"], extra_cuda_cflags=["-O3"], verbose=False)
    x = torch.randn(64 * 2**20, device="cuda")
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)

    torch.testing.assert_close(ext.lowocc_scale(x), x * 2)

    def step() -> None:
        ext.lowocc_scale(x)
        a @ a

    _profile(step, out / "low_occupancy_kernel.pt.trace.json.gz")


SCENARIOS: dict[str, Callable[[Path], None]] = {
    "gpt2_eager": lambda out: gpt2_train(out, eager=True),
    "gpt2_sdpa": lambda out: gpt2_train(out, eager=False),
    "launch_bound": launch_bound,
    "low_occupancy": low_occupancy,
}


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name in argv[1:] or list(SCENARIOS):
        print(f"scenario {name}", flush=True)
        try:
            SCENARIOS[name](out)
        except Exception as exc:
            print(f"  failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
