"""The roofline of real traces (attntrace/model/roofline.py): MFU against a hand count from the model's size and
tokens, the same attention FLOPs as `run`'s table, coverage and what it leaves out, and the surfaces
(`summary --ops`, lint's JSON, the HTML report, diff)."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner
from conftest import DATA, SAMPLES, sample

from attntrace.cli import main
from attntrace.model import roofline
from attntrace.model.loading import load
from attntrace.report import compare

H200_BF16 = 989.4e12


def _hand_training_flops(batch: int, seq: int, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int,
                         ffn_matrices: int, vocab: int) -> float:
    """6 x (matmul parameters) x tokens, plus causal attention: 4 x D x heads x S(S+1)/2 per sequence and layer
    forward, three times that for forward and backward (PaLM's MFU count)."""
    head_dim = hidden // heads
    per_layer = 2 * hidden * hidden + 2 * hidden * head_dim * kv_heads + ffn_matrices * hidden * ffn
    params = layers * per_layer + hidden * vocab  # the LM head; the embedding is a lookup
    attention = 3 * layers * 4 * batch * heads * head_dim * seq * (seq + 1) // 2
    return 6.0 * params * batch * seq + attention


@pytest.mark.parametrize(("name", "sizes"), [
    # bench/gpu/from_trace_models.py's Hugging Face models, captured on the H200 (sample_traces/from_trace/)
    ("llama_train_sdpa", dict(batch=8, seq=1024, hidden=1024, layers=4, heads=16, kv_heads=4, ffn=2816,
                              ffn_matrices=3, vocab=32000)),
    ("gpt2_train_sdpa", dict(batch=16, seq=1024, hidden=768, layers=4, heads=12, kv_heads=12, ffn=3072,
                             ffn_matrices=2, vocab=32000)),
])
def test_mfu_of_hugging_face_training_matches_a_hand_count(name: str, sizes: dict[str, int]) -> None:
    trace = load(str(SAMPLES / "from_trace" / f"{name}.pt.trace.json.gz"))
    found = roofline.analyse(trace)
    assert found is not None and found["mfu_precision"] == "bf16" and found["mfu_peak_tflops"] == 989.4
    hand = _hand_training_flops(**sizes)
    for step in found["per_step"]:
        assert step["model_flops"] == pytest.approx(hand, rel=1e-4)
        assert step["mfu"] == pytest.approx(hand / (step["step_us"] * 1e-6 * H200_BF16), rel=0.05)
    assert 0.15 < found["mfu"] < 0.3


def test_attention_flops_are_run_s() -> None:
    """`run`'s table and the roofline count a flash forward+backward step alike (one formula module)."""
    run = orjson.loads((SAMPLES / "bf16_causal_fwdbwd" / "run.json").read_bytes())
    found = roofline.analyse(load(str(SAMPLES / "bf16_causal_fwdbwd" / "sdpa_flash.pt.trace.json.gz")))
    assert found is not None
    attention = next(c for c in found["classes"] if c["class"] == "attention")
    config = run["config"]  # (its stored figure predates the diagonal's pairs: S^2/2 where S(S+1)/2 are attended)
    assert attention["flops_per_step"] == compare.attention_flops(config["shape"], config["causal"], True)
    assert attention["flops_per_step"] == pytest.approx(run["flops_per_step"], rel=1e-3)
    assert found["coverage"] == 1.0
    assert [o["bound"] for o in found["ops"] if o["class"] == "attention"] == ["compute", "compute"]


def test_coverage_names_what_has_no_model() -> None:
    """With shapes the resnet is modelled whole; without them only the memsets are, and the rest is listed by
    time with the reason."""
    shapes = roofline.analyse(load(str(SAMPLES / "heldout" / "resnet18_infer_fp32.shapes.pt.trace.json.gz")))
    assert shapes is not None and shapes["coverage"] == 1.0 and not shapes["unmodelled"]
    convs = [o for o in shapes["ops"] if o["class"] == "conv"]
    # fp32 inputs: held to TF32's roof where the kernel ran TF32, to FP32's where it ran on CUDA cores (ffma)
    assert {o["precision"] for o in convs} == {"tf32", "fp32"}
    assert all(o["precision"] == ("tf32" if "tf32" in o["kernel"] else "fp32") for o in convs)
    plain = roofline.analyse(load(sample("gpu_bound/llama_train_b8_compiled.plain")))
    assert plain is not None and plain["coverage"] < 0.01 and plain["mfu"] is None
    assert plain["unmodelled"][0]["op"] == "aten::mm"
    assert plain["unmodelled"][0]["reason"] == "no input shapes (record_shapes off)"
    assert roofline.analyse(load(str(DATA / "hf_tiny_cpu" / "llama_train_eager.pt.trace.json.gz"))) is None


def test_roofs_use_measured_figures_where_present() -> None:
    h200 = roofline.Roofs.of("NVIDIA H200")
    assert h200.roof["bf16"] == 790.0 and h200.datasheet["bf16"] == 989.4 and h200.hbm_tbs == 4.3
    assert roofline.Roofs.of("NVIDIA A100-SXM4-80GB").roof["bf16"] == 312.0
    assert roofline.Roofs.of("Some New GPU").name is None
    # a bf16 GEMM of 2*4096^3 FLOPs is compute-bound; at the roof it takes FLOPs / 790 TFLOP/s
    verdict, at_us = roofline.bound(2.0 * 4096**3, 3 * 4096 * 4096 * 2, "bf16", h200)
    assert verdict == "compute" and at_us == pytest.approx(2.0 * 4096**3 / 790e12 * 1e6)


def test_summary_ops_and_lint_json_carry_the_roofline() -> None:
    path = str(SAMPLES / "from_trace" / "gpt2_train_sdpa.pt.trace.json.gz")
    table = CliRunner().invoke(main, ["summary", "--ops", path])
    assert table.exit_code == 0, table.output
    assert "op class" in table.output and "top ops" in table.output and "MFU 23.4%" in table.output
    assert "aten::_foreach_mul_" in table.output  # the unmodelled ops, by time
    plain = CliRunner().invoke(main, ["summary", path])
    assert "op class" not in plain.output
    lint = CliRunner().invoke(main, ["lint", "--format", "json", "--fail-on", "never", path])
    doc = orjson.loads(lint.output)
    found = doc["traces"][0]["roofline"]
    assert found["mfu"] == pytest.approx(0.2345, abs=1e-3)
    assert {"classes", "ops", "per_step", "unmodelled", "coverage", "device", "hfu"} <= found.keys()
    # the documented contract: attntrace/schema/report.schema.json holds it, and the report meets it
    jsonschema = pytest.importorskip("jsonschema")
    schema = orjson.loads((SAMPLES.parent / "attntrace" / "schema" / "report.schema.json").read_bytes())
    assert "roofline" in schema["definitions"]["trace"]["properties"]
    jsonschema.validate(doc, schema)


def test_diff_compares_mfu_and_each_class_s_rate() -> None:
    base = str(SAMPLES / "from_trace" / "llama_train_eager.pt.trace.json.gz")
    new = str(SAMPLES / "from_trace" / "llama_train_sdpa.pt.trace.json.gz")
    text = CliRunner().invoke(main, ["diff", base, new])
    assert "MFU 11.8% -> 18.8%" in text.output and "gemm 594 -> 738 TFLOP/s" in text.output
    doc = orjson.loads(CliRunner().invoke(main, ["diff", "--format", "json", base, new]).output)
    roof = doc["comparisons"][0]["roofline"]
    assert roof["base"]["mfu"] < roof["new"]["mfu"]
    assert "attention" in roof["new"]["classes"] and "attention" not in roof["base"]["classes"]


# --- AT601 far-from-roofline on real traces ------------------------------------------------------------
def _at601(path: str) -> list[dict]:
    from attntrace.report.engine import lint_trace

    return [f for f in lint_trace(load(path)).findings if f["rule"] == "AT601"]


def test_at601_fires_on_bert_s_misaligned_vocabulary_gemm() -> None:
    """BERT's 30522-word vocabulary (not a multiple of 8): its LM-head GEMM ran at 30% of the bf16 roof while the
    model's aligned GEMMs reached it, in the H200 capture of bench/gpu/from_trace_models.py."""
    found = _at601(str(SAMPLES / "from_trace" / "bert_infer_sdpa.pt.trace.json.gz"))
    assert len(found) == 1
    f = found[0]
    assert f["severity"] == "warning" and f["evidence"]["shape"] == "[16384,768] x [768,30522]"
    assert f["evidence"]["misaligned"] == ["N = 30522"] and f["evidence"]["bound"] == "compute"
    reference = f["evidence"]["reference"]
    assert reference["share_of_bound"] > 0.9 and f["evidence"]["share_of_bound"] < 0.35
    # the saving: the time now minus the time at the share of its bound the reference reaches
    ev = f["evidence"]
    expected = ev["gpu_us_per_step"] - ev["bound_us_per_step"] / min(1.0, reference["share_of_bound"])
    assert f["impact"]["gpu_us_per_step"] == pytest.approx(expected, rel=0.02)
    assert "pad_to_multiple_of" in f["fix"]


def test_at601_silent_on_an_aligned_vocabulary() -> None:
    """The same kind of model with a 32000-word vocabulary: its LM head runs near the roof, nothing to report."""
    assert _at601(str(SAMPLES / "from_trace" / "gpt2_train_sdpa.pt.trace.json.gz")) == []
    assert _at601(str(SAMPLES / "gpu_bound" / "llama_train_b8_compiled.shapes_stack.pt.trace.json.gz")) == []


def test_at601_leaves_unfused_attention_matmuls_to_at102() -> None:
    """GPT-2 eager at context 511: its score matmuls are misaligned, but fusing the chain (AT102) removes them."""
    found = _at601(str(SAMPLES / "workloads" / "gpt2_eager_train.pt.trace.json.gz"))
    assert found and all(f.get("subsumed_by") == "AT102" for f in found)


def test_at601_slow_attention_saving_matches_the_timed_backend() -> None:
    """The memory-efficient kernel at 13% of the bf16 roof over 2048 keys: AT601's saving (at FlashAttention-2's
    share) against the CUDA-event times of both backends at this shape on the H200 (run.json): within 25%."""
    found = _at601(str(SAMPLES / "bf16_causal_fwd" / "sdpa_efficient.pt.trace.json.gz"))
    assert len(found) == 1 and found[0]["evidence"]["op_class"] == "attention"
    run = orjson.loads((SAMPLES / "bf16_causal_fwd" / "run.json").read_bytes())
    timed = {v["name"]: v["event_ms"] for v in run["variants"]}
    saving_us = (timed["sdpa_efficient"] - timed["sdpa_flash"]) * 1e3
    assert found[0]["impact"]["gpu_us_per_step"] == pytest.approx(saving_us, rel=0.25)
    assert "--from-trace" in found[0]["fix"]
    assert _at601(str(SAMPLES / "bf16_causal_fwd" / "sdpa_flash.pt.trace.json.gz")) == []
    # forward and backward at GPT-2's shape (B=16 H=12 S=1024, the from-trace run of gpt2_train_eager): the two
    # findings' savings against the timed efficient - flash difference
    site = SAMPLES / "from_trace" / "fromtrace" / "gpt2_train_eager" / "site-1"
    both = _at601(str(site / "sdpa_efficient.pt.trace.json.gz"))
    timed = {v["name"]: v["event_ms"] for v in orjson.loads((site / "run.json").read_bytes())["variants"]}
    assert len(both) == 2
    assert sum(f["impact"]["gpu_us_per_step"] for f in both) == pytest.approx(
        (timed["sdpa_efficient"] - timed["sdpa_flash"]) * 1e3, rel=0.25)


H100 = DATA / "roofline_h100"


def _h100_case(name: str) -> tuple[dict, dict]:
    timings = orjson.loads((H100 / "timings.json").read_bytes())
    found = roofline.analyse(load(str(H100 / f"{name}.pt.trace.json.gz")))
    assert found is not None, name
    return timings["cases"][name], found


@pytest.mark.parametrize("name", sorted(orjson.loads((H100 / "timings.json").read_bytes())["cases"]))
def test_h100_flops_match_the_hand_count_and_every_kernel_is_covered(name: str) -> None:
    """One op per trace, captured on an H100 by bench/gpu/roofline_check.py (README in the data folder): the FLOPs
    counted from the recorded shapes equal the hand count of the same op, and no kernel is left unmodelled."""
    entry, found = _h100_case(name)
    per_step = sum(s["hw_flops"] for s in found["per_step"]) / max(1, len(found["per_step"]))
    assert per_step == pytest.approx(entry["case"]["flops"], rel=1e-3, abs=1.0)
    assert found["coverage"] == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["bf16_gemm", "fp16_gemm", "tf32_gemm", "fp32_gemm", "bf16_gemm_vocab_30522",
                                  "bf16_gemm_vocab_30528", "bf16_conv"])
def test_h100_achieved_rate_matches_cuda_events(name: str) -> None:
    """The rate from the trace's kernel time against the rate from CUDA events around the same op without the
    profiler: within 20% where one call runs 0.2 ms or more (shorter calls' events also time the launch gap)."""
    entry, found = _h100_case(name)
    kernel_us = sum(c["us_per_step"] for c in found["classes"] if c["class"] not in ("unmodelled", "transfer"))
    assert entry["event_ms"] >= 0.2
    assert kernel_us / 1e3 == pytest.approx(entry["event_ms"], rel=0.20)


def test_at601_saving_matches_the_aligned_vocabulary_timed_on_an_h100() -> None:
    """BERT's LM head at 30522 and 30528 words, each timed without the profiler: AT601 fires on the misaligned
    one only, and its saving is within 25% of the timed difference (scaled to the same columns)."""
    timings = orjson.loads((H100 / "timings.json").read_bytes())["cases"]
    assert _at601(str(H100 / "bf16_gemm_vocab_30528.pt.trace.json.gz")) == []
    found = _at601(str(H100 / "bf16_gemm_vocab_30522.pt.trace.json.gz"))
    assert len(found) == 1 and found[0]["evidence"]["misaligned"] == ["N = 30522"]
    timed_us = (timings["bf16_gemm_vocab_30522"]["event_ms"]
                - timings["bf16_gemm_vocab_30528"]["event_ms"] * 30522 / 30528) * 1e3
    assert found[0]["impact"]["gpu_us_per_step"] == pytest.approx(timed_us, rel=0.25)
