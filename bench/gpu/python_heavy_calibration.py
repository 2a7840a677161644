"""Issue 40's Python-heavy set: steps whose pace the CPU sets, captured with `with_stack=True` (as the Hugging Face
and PyTorch tutorials profile) through attntrace.profile, each timed without the profiler in the same process:
before the capture, by attntrace.profile itself (the schedule's wait steps, kept in the trace's
"attntrace_measured" metadata), and after it.

    python bench/gpu/python_heavy_calibration.py OUT_DIR [WORKLOAD ...]      (a CUDA machine; torch >= 2.4)

Writes OUT_DIR/WORKLOAD.shapes_stack.pt.trace.json.gz and OUT_DIR/python_heavy_timings.json:
{workload: {"split": "fit"|"held_out", "kind": ..., "unprofiled_before_ms", "unprofiled_after_ms",
"measured_in_capture_ms" (median of attntrace.profile's steady wait steps), "profiled_ms", "measured": {...the
trace's metadata...}}}. The split is fixed by name (every third workload held out), so that a cost fitted on the
"fit" cases is judged on cases it never saw: `python tools/fit_profiler_cost.py` and `bench/gpu/profiler_rounds.py
table` read the traces; `attntrace summary OUT_DIR --format json` gives each trace's estimate, measured step and
error (profiler.est_error) side by side.

Needs transformers (Llama, GPT-2, BERT, T5, Mixtral from configs: no download) and torchvision; a workload whose
package is missing is skipped with a line. Not run in CI (no GPU there).
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, schedule

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench" / "gpu")]

import profiler_calibration as calib  # noqa: E402  (bench/gpu/profiler_calibration.py: its workloads and timer)

import attntrace  # noqa: E402

Step = Callable[[], None]
WAIT, WARMUP, ACTIVE = 6, 1, 5


# --- workloads not in the earlier sets ----------------------------------------------------------------------
class TopTwoMoE(torch.nn.Module):
    """A mixture-of-experts MLP routed top-2 in Python, as most research code does it: a softmax router, then a
    loop over the experts, each gathering its tokens (index ops, nonzero: a host sync per expert)."""

    def __init__(self, width: int = 512, experts: int = 8, hidden: int = 1024) -> None:
        super().__init__()
        self.router = torch.nn.Linear(width, experts, bias=False)
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.SiLU(), torch.nn.Linear(hidden, width))
            for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.softmax(self.router(tokens), dim=-1).topk(2, dim=-1)
        out = torch.zeros_like(tokens)
        for index, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(chosen == index, as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, expert(tokens[rows]) * weights[rows, slot, None])
        return out.reshape_as(x)


class MoEModel(torch.nn.Module):
    def __init__(self, layers: int = 4, width: int = 512) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(TopTwoMoE(width) for _ in range(layers))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, block in zip(self.norms, self.blocks, strict=True):
            x = x + block(norm(x))
        return x


def moe_train(batch: int = 8) -> Step:
    torch.manual_seed(0)
    model = MoEModel().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(batch, 256, 512, device="cuda")
    return calib.training_step(lambda: model(x).square().mean(), opt)


def moe_infer(batch: int = 1) -> Step:
    torch.manual_seed(0)
    model = MoEModel().cuda().eval().to(torch.bfloat16)
    x = torch.randn(batch, 64, 512, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        with torch.no_grad():
            model(x)

    return step


def mixtral_train() -> Step:
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                           num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                           max_position_embeddings=2048)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = MixtralForCausalLM(config).to("cuda", torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, 32000, (2, 512), device="cuda")
    return calib.training_step(lambda: model(input_ids=ids, labels=ids).loss, opt, autocast=False)


def mixtral_generate() -> Step:
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                           num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                           max_position_embeddings=2048)
    torch.manual_seed(0)
    model = MixtralForCausalLM(config).to("cuda", torch.bfloat16).eval()
    return calib.generate_step(model, torch.randint(0, 32000, (1, 64), device="cuda"), 16)


def small_mlp_compiled(batch: int = 16) -> Step:
    """A small compiled MLP training step: Inductor's wrapper and launcher are most of the step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(12)]).cuda()
    forward = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, 256, device="cuda")
    return calib.training_step(lambda: forward(x).square().mean(), opt, autocast=False)


def sync_and_pageable_copy_loop() -> Step:
    """A small CNN trained with a pageable host-to-device copy of each batch and a `.item()` of its loss: two host
    syncs a step (issue 40's ResNet case, at a size that needs no torchvision)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batch = torch.randn(32, 3, 64, 64)  # pageable: the copy blocks the host
    labels = torch.randint(0, 10, (32,))
    losses: list[float] = []

    def step() -> None:
        x, y = batch.cuda(), labels.cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())

    return step


def per_head_python_attention() -> Step:
    """Attention written with a Python loop over heads (research code): many small ops per layer."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 12, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def step() -> None:
        with torch.no_grad():
            for _ in range(4):  # layers
                heads = [torch.softmax(q[:, h] @ k[:, h].transpose(-1, -2) * 0.125, dim=-1) @ v[:, h]
                         for h in range(q.shape[1])]
                torch.stack(heads, dim=1)

    return step


def bert_infer_b1() -> Step:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig()).to("cuda", torch.float16).eval()
    ids = torch.randint(0, 30000, (1, 128), device="cuda")

    def step() -> None:
        with torch.no_grad():
            model(input_ids=ids)

    return step


def gpt2_infer_b1() -> Step:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6)).to("cuda", torch.float16).eval()
    ids = torch.randint(0, 50000, (1, 64), device="cuda")

    def step() -> None:
        with torch.no_grad():
            model(input_ids=ids)

    return step


def llama_generate_compiled() -> Step:
    """Llama `generate()` with a static cache and its forward compiled: issue 40's compiled generate() case."""
    model = calib._llama("sdpa")
    model.eval()
    model.generation_config.cache_implementation = "static"
    model.forward = torch.compile(model.forward)
    return calib.generate_step(model, torch.randint(0, 32000, (1, 128), device="cuda"), 32)


# Kinds, for the per-setting spread (docs/profiler_cost.md): transformers training and generate(), mixture of experts,
# compiled steps, loops with host syncs, small-batch inference.
WORKLOADS: dict[str, tuple[str, Callable[[], Step]]] = {
    "llama_train_sdpa": ("transformers training", lambda: calib.llama_train("sdpa")),
    "llama_train_eager": ("transformers training", lambda: calib.llama_train("eager")),
    "gpt2_train_item": ("transformers training", calib.gpt2_train),
    "bert_train_sdpa": ("transformers training", calib.bert_train),
    "qwen2_train_checkpointed": ("transformers training", calib.qwen2_train_checkpointed),
    "llama_generate": ("transformers generate", calib.llama_generate),
    "gpt2_generate": ("transformers generate", calib.gpt2_generate),
    "t5_generate": ("transformers generate", calib.t5_generate),
    "mistral_generate": ("transformers generate", calib.mistral_generate),
    "moe_train": ("mixture of experts", moe_train),
    "moe_infer_b1": ("mixture of experts", moe_infer),
    "mixtral_train": ("mixture of experts", mixtral_train),
    "mixtral_generate": ("mixture of experts", mixtral_generate),
    "llama_train_compiled": ("compiled", lambda: calib.llama_train("sdpa", compiled=True)),
    "gpt2_train_compiled": ("compiled", lambda: calib.gpt2_train(compiled=True)),
    "small_mlp_compiled": ("compiled", small_mlp_compiled),
    "llama_generate_compiled": ("compiled", llama_generate_compiled),
    "mlp_item_sync": ("host syncs", calib.mlp_item_sync),
    "sync_and_pageable_copy": ("host syncs", sync_and_pageable_copy_loop),
    "resnet50_train_item": ("host syncs", lambda: calib.resnet_train(after=lambda loss: float(loss.item()))),
    "bert_infer_b1": ("small-batch inference", bert_infer_b1),
    "gpt2_infer_b1": ("small-batch inference", gpt2_infer_b1),
    "per_head_python_attention": ("small-batch inference", per_head_python_attention),
    "vit_small_infer": ("small-batch inference", calib.vit_infer),
}


def split_of(name: str) -> str:
    """Every third workload, in the table's order, is held out of any fit."""
    return "held_out" if list(WORKLOADS).index(name) % 3 == 2 else "fit"


def capture(step: Step, path: Path) -> tuple[float, dict]:
    """Capture ACTIVE steps with record_shapes and with_stack through attntrace.profile, after WAIT steps it times
    without the profiler; the wall ms per recorded step (host clock, as attntrace.profile measures it)."""
    calib._sync()
    with attntrace.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                           with_stack=True, schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
                           on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(WAIT + WARMUP + ACTIVE):
            step()
            prof.step()
    calib._sync()
    record = prof.measured[-1]
    return statistics.median(record["profiled_step_us"]) / 1e3, record


def steady_median_ms(values_us: list[float]) -> float | None:
    if not values_us:
        return None
    steady = [v for v in values_us if v <= 1.5 * min(values_us)]
    return statistics.median(steady) / 1e3


def main(out: Path, names: list[str]) -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "python_heavy_timings.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    results["_host"] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                        "python": platform.python_version(), "cpu": platform.processor(),
                        "attntrace": attntrace.__version__}
    for name in names or list(WORKLOADS):
        kind, build = WORKLOADS[name]
        print(f"{name} ({kind}) ...", flush=True)
        try:
            step = build()
            for _ in range(5):  # compile, autotune, allocate
                step()
            before, _, _ = calib.time_unprofiled(step)
            profiled, record = capture(step, out / f"{name}.shapes_stack.pt.trace.json.gz")
            after, _, _ = calib.time_unprofiled(step)
        except ImportError as exc:
            print(f"  skipped: {exc}", flush=True)
            continue
        except Exception:  # one workload's failure is its line, not the end of the set
            traceback.print_exc()
            continue
        results[name] = {"split": split_of(name), "kind": kind, "unprofiled_before_ms": before,
                         "unprofiled_after_ms": after,
                         "measured_in_capture_ms": steady_median_ms(record["unprofiled_step_us"]),
                         "profiled_ms": profiled, "measured": record, "time": time.time()}
        print(f"  {before:.2f} ms before, {results[name]['measured_in_capture_ms']:.2f} ms in the capture's wait "
              f"steps, {after:.2f} ms after; {profiled:.2f} ms profiled", flush=True)
        results_path.write_text(json.dumps(results, indent=1, sort_keys=True))
        del step
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))
