"""GPU check of attntrace's Triton attention: correctness on random inputs (sequence lengths that are
and are not multiples of the block size) and speed against SDPA flash. Run on a CUDA machine:

    python bench/gpu/triton_check.py
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from attntrace.capture.triton_attention import attention


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    q, k, v = (t.double() for t in (q, k, v))
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def main() -> None:
    worst = 0.0
    for seq in (1, 77, 128, 129, 1000, 2048):
        for head_dim in (32, 64, 128):
            for dtype in (torch.bfloat16, torch.float16):
                for causal in (True, False):
                    q, k, v = (torch.randn(2, 3, seq, head_dim, device="cuda", dtype=dtype) for _ in range(3))
                    out = attention(q, k, v, causal)
                    ref = reference(q, k, v, causal)
                    err = float((out.double() - ref).norm() / ref.norm())
                    worst = max(worst, err)
                    assert torch.isfinite(out).all() and err < 2e-2, (seq, head_dim, dtype, causal, err)
    print(f"correct: worst relative error {worst:.2e} over 72 cases")
    q, k, v = (torch.randn(4, 16, 2048, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ours = do_bench(lambda: attention(q, k, v, True), warmup=50, rep=300, return_mode="median")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), warmup=50, rep=300,
                         return_mode="median")
    print(f"B=4 H=16 S=2048 D=64 bf16 causal: triton {ours:.4f} ms, sdpa flash {flash:.4f} ms, "
          f"ratio {ours / flash:.2f}x")


if __name__ == "__main__":
    main()
