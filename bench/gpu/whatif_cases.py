"""What each cause's fix really saves, timed, beside what attntrace's what-if predicts from a trace of the program
before the fix (the wall-time savings of `attntrace whatif` and the findings' `impact.wall_us_per_step`).

Each case is one program in two forms that differ only in the fix: `before` (with the cause) and `after` (the fix
applied: the sync removed, the copy pinned and asynchronous, the step captured as a CUDA graph, TF32 allowed,
SDPA instead of unfused attention, the data loader's work off the main thread). Both are timed without the
profiler in the same fresh process, interleaved over rounds so the host's drift falls on both; `before` is also
captured under the profiler (record_shapes; some with with_stack too).

On the GPU machine (one process per case, so that no case inherits another's allocator or compiled code):
    python bench/gpu/whatif_cases.py capture OUT_DIR [CASE ...]
writes OUT_DIR/CASE.SETTING.pt.trace.json.gz and OUT_DIR/CASE.json ({"before_ms": [...], "after_ms": [...],
"host": ...}). `python bench/gpu/whatif_report.py OUT_DIR` (no GPU) prints the predicted saving beside the timed one.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from profiler_calibration import capture, host_info, time_unprofiled, training_step  # noqa: E402

Step = Callable[[], None]
ROUNDS = 3


def loss_log(item: bool) -> Callable[[torch.Tensor], None]:
    """Where a step's loss goes: read on the host at once (`.item()`, a sync), or kept on the GPU (a bounded list,
    so that memory stays flat)."""
    kept: list[torch.Tensor] = []

    def log(loss: torch.Tensor) -> None:
        if item:
            float(loss.item())
            return
        kept.append(loss.detach())
        if len(kept) > 64:
            kept.clear()

    return log


def _resnet(batch: int = 64) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def resnet_loop(pinned: bool, item: bool, copy: bool = True) -> Step:
    """A ResNet-50 training loop whose 38.5 MB batch comes from host memory each step (pageable, or pinned and
    copied with non_blocking=True), logging its loss with .item() or keeping it on the GPU."""
    model, opt = _resnet()
    host = torch.randn(64, 3, 224, 224)
    host = host.pin_memory() if pinned else host
    resident = host.cuda()
    y = torch.randint(0, 1000, (64,), device="cuda")
    log = loss_log(item)

    def step() -> None:
        x = host.cuda(non_blocking=pinned) if copy else resident
        x = x.to(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        log(loss)

    return step


def mlp_micro(item: bool) -> Step:
    """profiler_calibration's four micro-batches of a small MLP, each logging its loss (a .item() each, or none)."""
    from profiler_calibration import mlp_item_sync

    return mlp_item_sync(log=loss_log(item))


def finite_check(test: bool) -> Step:
    """A mid-size MLP training step that checks its loss is finite with a boolean test of a tensor (a sync)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(6)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, 1024, device="cuda")

    def step() -> None:
        for _ in range(2):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).float().square().mean()
            loss.backward()
            if test and not torch.isfinite(loss):
                raise RuntimeError("loss is not finite")
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step


def masked_tokens(nonzero: bool) -> Step:
    """Selecting the unmasked tokens of a batch with nonzero (a sync: its size is data) before a projection,
    against multiplying by the mask (no sync, the same projection over all tokens)."""
    torch.manual_seed(0)
    proj = torch.nn.Linear(512, 512).cuda()
    x = torch.randn(8, 512, 512, device="cuda")
    mask = torch.rand(8, 512, device="cuda") > 0.3

    def step() -> None:
        with torch.no_grad():
            for layer in range(6):
                if nonzero:
                    idx = mask.flatten().nonzero().squeeze(1)
                    out = proj(x.flatten(0, 1).index_select(0, idx))
                else:
                    out = proj(x.flatten(0, 1) * mask.flatten()[:, None])
                out.sum()
                del layer

    return step


def decode(graphed: bool) -> Step:
    """A launch-bound decode: 32 tokens a step through 8 small residual blocks at batch 1, eager or as one CUDA
    graph per token."""
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.LayerNorm(512), torch.nn.Linear(512, 1024),
                                                     torch.nn.GELU(), torch.nn.Linear(1024, 512))
                                 for _ in range(8)).cuda().half().eval()
    static = torch.randn(1, 512, device="cuda", dtype=torch.half)

    def token(h: torch.Tensor) -> torch.Tensor:
        for block in blocks:
            h = h + block(h)
        return h

    if not graphed:
        def step() -> None:
            with torch.no_grad():
                h = static
                for _ in range(32):
                    h = token(h)
        return step

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            token(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = token(static)

    def step() -> None:
        for _ in range(32):
            graph.replay()
            static.copy_(out)

    return step


def tiny_ops(graphed: bool) -> Step:
    """200 tiny elementwise ops a step, eager or captured as one CUDA graph."""
    x = torch.randn(1024, device="cuda")

    def body() -> torch.Tensor:
        y = x
        for _ in range(100):
            y = y * 1.0001 + 0.0001
        return y

    if not graphed:
        return lambda: body().sum() and None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = body()

    def step() -> None:
        graph.replay()
        out.sum()

    return step


class SlowDataset(torch.utils.data.Dataset):
    """Samples that cost the CPU ~0.25 ms each to make (a decode-and-augment stand-in)."""

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        x = torch.rand(3, 64, 64, generator=g)
        for _ in range(4):
            x = torch.flip(x, dims=[2]) * 0.99 + 0.01
        return x, i % 10


def loader(workers: int) -> Step:
    """A small CNN trained on batches of 64 from a DataLoader whose samples cost CPU time: made on the main thread
    (num_workers=0, the wait is on the step's path), or by 4 workers with pinned memory (off it)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3),
                                torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(64, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(SlowDataset(), batch_size=64, num_workers=workers, pin_memory=workers > 0,
                                       persistent_workers=workers > 0, prefetch_factor=4 if workers else None)
    batches = iter(data)

    def step() -> None:
        x, y = next(batches)
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def moe(static_routing: bool) -> Step:
    """A mixture-of-experts layer stack (8 experts, top-1) that splits its tokens by the router's counts read on the
    host (`.tolist()`, a sync per layer), against fixed-capacity routing that never reads them."""
    torch.manual_seed(0)
    experts = torch.nn.ModuleList(torch.nn.ModuleList(torch.nn.Linear(512, 512) for _ in range(8))
                                  for _ in range(4)).cuda()
    routers = torch.nn.ModuleList(torch.nn.Linear(512, 8) for _ in range(4)).cuda()
    opt = torch.optim.AdamW([*experts.parameters(), *routers.parameters()], lr=1e-4)
    x = torch.randn(2048, 512, device="cuda")
    capacity = 2048 // 8 * 2

    def step() -> None:
        h = x
        for layer in range(4):
            choice = routers[layer](h).argmax(-1)
            order = choice.argsort()
            out = torch.zeros_like(h)
            if static_routing:
                counts = torch.bincount(choice, minlength=8)
                starts = torch.cumsum(counts, 0) - counts
                for e in range(8):
                    slot = (starts[e] + torch.arange(capacity, device="cuda")).clamp(max=h.shape[0] - 1)
                    rows = order[slot]
                    keep = (torch.arange(capacity, device="cuda") < counts[e])[:, None]
                    out = out.index_add(0, rows, experts[layer][e](h[rows]) * keep)
            else:
                counts = torch.bincount(choice, minlength=8).tolist()
                for e, part in enumerate(order.split(counts)):
                    if len(part):
                        out = out.index_add(0, part, experts[layer][e](h[part]))
            h = h + out
        h.square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def compiled_item(item: bool) -> Step:
    """A compiled MLP training step that logs its loss with .item() each step, or keeps it on the GPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU())
                                  for _ in range(8)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    forward = torch.compile(model)
    x = torch.randn(512, 1024, device="cuda")
    log = loss_log(item)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        log(loss)

    return step


def fp32_mlp(tf32: bool) -> Step:
    """An fp32 MLP training step at 4096 wide: FP32 GEMMs on CUDA cores, or TF32 on tensor cores."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(2048, 4096, device="cuda")
    return training_step(lambda: model(x).square().mean(), opt, autocast=False)


def attention(fused: bool) -> Step:
    """Causal attention at 4x16x2048x64 bf16, forward and backward: unfused (matmul, masked_fill, softmax) or SDPA."""
    q, k, v = (torch.randn(4, 16, 2048, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    mask = torch.ones(2048, 2048, device="cuda", dtype=torch.bool).tril()

    def step() -> None:
        if fused:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) * 0.125
            out = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v
        out.sum().backward()

    return step


def big_gemm(item: bool) -> Step:
    """A GPU-bound loop of large bf16 GEMMs that reads a scalar back each step (.item()) or not."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        out = a
        for _ in range(4):
            out = a @ a
        if item:
            float(out[0, 0].item())

    return step


def gpt2_item(item: bool) -> Step:
    from profiler_calibration import gpt2_train

    return gpt2_train(after=loss_log(item))


# case -> (before, after, settings to capture `before` under).
SHAPES = {"shapes": {"record_shapes": True}}
STACK = {"shapes": {"record_shapes": True}, "shapes_stack": {"record_shapes": True, "with_stack": True}}
CASES: dict[str, tuple[Callable[[], Step], Callable[[], Step], dict[str, dict[str, bool]]]] = {
    "resnet_pageable_item": (lambda: resnet_loop(False, True), lambda: resnet_loop(True, False), STACK),
    "resnet_pageable": (lambda: resnet_loop(False, False), lambda: resnet_loop(True, False), SHAPES),
    "resnet_item": (lambda: resnet_loop(True, True, copy=False), lambda: resnet_loop(True, False, copy=False),
                    SHAPES),
    "mlp_micro_item": (lambda: mlp_micro(True), lambda: mlp_micro(False), STACK),
    "finite_check": (lambda: finite_check(True), lambda: finite_check(False), SHAPES),
    "masked_nonzero": (lambda: masked_tokens(True), lambda: masked_tokens(False), SHAPES),
    "decode_graph": (lambda: decode(False), lambda: decode(True), SHAPES),
    "tiny_ops_graph": (lambda: tiny_ops(False), lambda: tiny_ops(True), SHAPES),
    "loader_on_path": (lambda: loader(0), lambda: loader(4), SHAPES),
    "moe_routing": (lambda: moe(False), lambda: moe(True), STACK),
    "compiled_item": (lambda: compiled_item(True), lambda: compiled_item(False), SHAPES),
    "fp32_vs_tf32": (lambda: fp32_mlp(False), lambda: fp32_mlp(True), SHAPES),
    "unfused_vs_sdpa": (lambda: attention(False), lambda: attention(True), SHAPES),
    "big_gemm_item": (lambda: big_gemm(True), lambda: big_gemm(False), SHAPES),
    "gpt2_item": (lambda: gpt2_item(True), lambda: gpt2_item(False), STACK),
}


def run_case(name: str, out: Path) -> dict[str, Any]:
    make_before, make_after, settings = CASES[name]
    before = make_before()
    for _ in range(3):
        before()
    traces = {}
    for setting, flags in settings.items():
        path = out / f"{name}.{setting}.pt.trace.json.gz"
        traces[setting] = {"profiled_ms": capture(before, path, flags, cuda=True, active=4)}
    # The fix may change global switches (TF32): the form with the cause is timed before it is built.
    after = make_after()
    for _ in range(3):
        after()
    before_ms, after_ms = [], []
    for _ in range(ROUNDS):
        before_ms.append(time_unprofiled(before)[0])
        after_ms.append(time_unprofiled(after)[0])
    if name == "fp32_vs_tf32":  # the global switch is on now: time `before` with it off again
        torch.backends.cuda.matmul.allow_tf32 = False
        before_ms = [time_unprofiled(before)[0] for _ in range(ROUNDS)]
        torch.backends.cuda.matmul.allow_tf32 = True
        after_ms = [time_unprofiled(after)[0] for _ in range(ROUNDS)]
    return {"before_ms": before_ms, "after_ms": after_ms, "traces": traces,
            "timed_saving_ms": statistics.median(before_ms) - statistics.median(after_ms), "host": host_info()}


def main(argv: list[str]) -> int:
    if argv[:1] == ["one"]:
        name, out = argv[1], Path(argv[2])
        started = time.perf_counter()
        result = run_case(name, out)
        result["seconds"] = time.perf_counter() - started
        (out / f"{name}.json").write_text(json.dumps(result, indent=1, sort_keys=True))
        print(f"{name}: before {statistics.median(result['before_ms']):.3f} ms, after "
              f"{statistics.median(result['after_ms']):.3f} ms ({result['seconds']:.0f} s)", flush=True)
        return 0
    if argv[:1] != ["capture"]:
        print(__doc__)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in argv[2:] or list(CASES):
        try:
            done = subprocess.run([sys.executable, __file__, "one", name, str(out)], check=False, timeout=150)
        except subprocess.TimeoutExpired:
            print(f"{name}: timed out", flush=True)
            continue
        if done.returncode:
            print(f"{name}: failed ({done.returncode})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
