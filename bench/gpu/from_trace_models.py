"""Real Hugging Face models built from configs (no weights), for checking `attntrace run --from-trace`: each model
in eager and in SDPA attention is timed without the profiler and captured with record_shapes=True; `report` then
sets the per-step saving that the from-trace runs predict for switching eager -> sdpa against the saving timed.

    python bench/gpu/from_trace_models.py capture OUT MODEL [--tiny] [--device cuda|cpu]
    python bench/gpu/from_trace_models.py report OUT

MODEL: llama_train (GQA, training step), gpt2_train, bert_infer, llama_generate (generate() with a KV cache).
--tiny shrinks every size so that the script's CPU-safe parts run on a laptop's CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

IMPLS = ("eager", "sdpa")


def _sizes(tiny: bool) -> dict[str, dict[str, int]]:
    if tiny:
        return {"llama_train": dict(batch=2, seq=64, hidden=128, layers=2, heads=4, kv_heads=2, vocab=512),
                "gpt2_train": dict(batch=2, seq=64, hidden=128, layers=2, heads=4, vocab=512),
                "bert_infer": dict(batch=2, seq=64, hidden=128, layers=2, heads=4, vocab=512),
                "llama_generate": dict(batch=2, seq=32, new=8, hidden=128, layers=2, heads=4, kv_heads=2,
                                       vocab=512)}
    return {"llama_train": dict(batch=8, seq=1024, hidden=1024, layers=4, heads=16, kv_heads=4, vocab=32000),
            "gpt2_train": dict(batch=16, seq=1024, hidden=768, layers=4, heads=12, vocab=32000),
            "bert_infer": dict(batch=32, seq=512, hidden=768, layers=4, heads=12, vocab=30522),
            # Long enough a cache, and enough sequences, that decode is bound by the GPU (repeat_kv's copies)
            # rather than by launching kernels: a saving of GPU time then shows in the step's time.
            "llama_generate": dict(batch=64, seq=2048, new=32, hidden=1024, layers=4, heads=16, kv_heads=4,
                                   vocab=32000)}


def _build(name: str, impl: str, s: dict[str, int], device: Any, dtype: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, BertConfig, GPT2Config, LlamaConfig

    torch.manual_seed(0)
    if name.startswith("llama"):
        config = LlamaConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["hidden"] * 11 // 4,
                             num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                             num_key_value_heads=s["kv_heads"], max_position_embeddings=4096)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=dtype)
    elif name == "gpt2_train":
        config = GPT2Config(vocab_size=s["vocab"], n_embd=s["hidden"], n_layer=s["layers"], n_head=s["heads"],
                            n_positions=s["seq"], attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=dtype)
    else:
        config = BertConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                            num_attention_heads=s["heads"], intermediate_size=s["hidden"] * 4,
                            attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0,
                            max_position_embeddings=max(512, s["seq"]))
        model = AutoModelForMaskedLM.from_config(config, attn_implementation=impl, dtype=dtype)
    return model.to(device)


def _step(name: str, model: Any, s: dict[str, int], device: Any) -> Callable[[], None]:
    """One step of the workload: a training step, a forward, or one generate() call."""
    import torch

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), generator=gen).to(device)
    if name.endswith("_train"):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

        def train() -> None:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return train
    model.eval()
    if name == "bert_infer":
        def infer() -> None:
            with torch.no_grad():
                model(input_ids=ids)

        return infer

    def generate() -> None:
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=s["new"],
                           min_new_tokens=s["new"], do_sample=False, pad_token_id=0)

    return generate


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _time(step: Callable[[], None], device: Any, warmup: int = 3, calls: int = 5, repeats: int = 3) -> float:
    """Milliseconds per step without the profiler: the median over repeats of `calls` steps, synchronised."""
    for _ in range(warmup):
        step()
    _sync(device)
    samples = []
    for _ in range(repeats):
        begin = time.perf_counter()
        for _ in range(calls):
            step()
        _sync(device)
        samples.append((time.perf_counter() - begin) * 1e3 / calls)
    return statistics.median(samples)


def _capture(step: Callable[[], None], device: Any, path: Path, active: int) -> None:
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True, schedule=schedule(wait=0, warmup=1, active=active),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(active + 1):
            step()
            prof.step()
    _sync(device)


def capture(out: Path, name: str, tiny: bool, device_name: str) -> None:
    import torch
    import transformers

    device = torch.device(device_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    s = _sizes(tiny)[name]
    timings: dict[str, Any] = {"model": name, "sizes": s, "dtype": str(dtype), "device": device_name,
                               "torch": torch.__version__, "transformers": transformers.__version__,
                               "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
    generate = name == "llama_generate"
    for impl in IMPLS:
        model = _build(name, impl, s, device, dtype)
        step = _step(name, model, s, device)
        timings[f"{impl}_ms_per_step"] = _time(step, device, warmup=2 if generate else 3, calls=1 if generate else 5)
        _capture(step, device, out / f"{name}_{impl}.pt.trace.json.gz", active=1 if generate else 2)
        del model, step
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"{name} {impl}: {timings[f'{impl}_ms_per_step']:.3f} ms per step", flush=True)
    (out / f"{name}_timing.json").write_text(json.dumps(timings, indent=2) + "\n")


def _predicted(run: dict[str, Any], variant: str) -> tuple[float | None, list[str]]:
    """Per-step saving that a from-trace run predicts for switching every site to `variant`, and why a site
    could not count."""
    total, problems = 0.0, []
    for site in run["sites"]:
        times = site.get("variants_ms_per_step") or {}
        if variant not in times:
            problems.append(f"site {site['id']}: {variant} not measured")
            continue
        total += site["yours_ms_per_step"] - times[variant]
    return (total if not problems or total else None), problems


def report(out: Path) -> int:
    """results.json and results.md: predicted vs timed saving of eager -> sdpa for each model."""
    rows = []
    for timing_file in sorted(out.glob("*_timing.json")):
        timing = json.loads(timing_file.read_text())
        name = timing["model"]
        run_file = out / "fromtrace" / f"{name}_eager" / "run.json"
        row: dict[str, Any] = {"model": name, "eager_ms": timing.get("eager_ms_per_step"),
                               "sdpa_ms": timing.get("sdpa_ms_per_step")}
        row["measured_saving_ms"] = row["eager_ms"] - row["sdpa_ms"] if row["eager_ms"] and row["sdpa_ms"] else None
        if run_file.is_file():
            run = json.loads(run_file.read_text())
            row["predicted_saving_ms"], row["problems"] = _predicted(run, "sdpa")
            row["verdicts"] = [s["verdict"] for s in run["sites"]] + [run["step"]["verdict"]]
            row["sites"] = [{k: s.get(k) for k in ("id", "implementation", "calls_per_step", "trace_ms_per_step",
                                                   "best", "best_ms_per_step", "variants_ms_per_step")}
                            for s in run["sites"]]
        sdpa_run = out / "fromtrace" / f"{name}_sdpa" / "run.json"
        if sdpa_run.is_file():
            row["sdpa_trace_verdicts"] = [s["verdict"] for s in json.loads(sdpa_run.read_text())["sites"]]
        predicted, measured = row.get("predicted_saving_ms"), row["measured_saving_ms"]
        if predicted is not None and measured:
            row["error_pct"] = 100.0 * (predicted - measured) / measured
            row["within_25pct"] = abs(row["error_pct"]) <= 25.0
        rows.append(row)
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = ["| model | eager ms/step | sdpa ms/step | saving timed | saving predicted | error |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        def ms(v: Any) -> str:
            return "-" if v is None else f"{v:.2f}"

        err = "-" if r.get("error_pct") is None else f"{r['error_pct']:+.0f}%"
        lines.append(f"| {r['model']} | {ms(r['eager_ms'])} | {ms(r['sdpa_ms'])} | {ms(r['measured_saving_ms'])} | "
                     f"{ms(r.get('predicted_saving_ms'))} | {err} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capture")
    cap.add_argument("out", type=Path)
    cap.add_argument("model", choices=sorted(_sizes(False)))
    cap.add_argument("--tiny", action="store_true")
    cap.add_argument("--device", default="cuda")
    rep = sub.add_parser("report")
    rep.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "capture":
        args.out.mkdir(parents=True, exist_ok=True)
        capture(args.out, args.model, args.tiny, args.device)
        return 0
    return report(args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
