"""Capture the small CPU training traces in tests/data/cpu_training/ (torch on a CPU, no GPU needed):
`python tools/capture_training_cpu.py autocast OUT.json` is one attention layer trained under bf16 autocast with
q and k upcast to fp32 before SDPA, as Hugging Face's rotary embeddings do: the SDPA call records fp32 inputs,
its backend runs the cast bf16 ones. `compiled` is the same layer under torch.compile (one autograd node for the
graph's backward)."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

BATCH, HEADS, SEQ, HEAD_DIM = 2, 4, 64, 16


class Attention(torch.nn.Module):
    def __init__(self, upcast: bool) -> None:
        super().__init__()
        self.upcast = upcast
        self.qkv = torch.nn.Linear(HEADS * HEAD_DIM, 3 * HEADS * HEAD_DIM)
        self.out = torch.nn.Linear(HEADS * HEAD_DIM, HEADS * HEAD_DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(BATCH, SEQ, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        if self.upcast:
            q, k = q.float(), k.float()
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(BATCH, SEQ, HEADS * HEAD_DIM))


def main(kind: str, out: str) -> None:
    torch.manual_seed(0)
    model = Attention(upcast=kind == "autocast")
    step = torch.compile(model) if kind == "compiled" else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(BATCH, SEQ, HEADS * HEAD_DIM)

    def train() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "autocast"):
            y = step(x)
        y.float().sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(2):  # warm-up (and compilation)
        train()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for i in range(3):
            with record_function(f"ProfilerStep#{i}"):
                train()
    prof.export_chrome_trace(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
