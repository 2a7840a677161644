"""Each GPU microsecond is counted once: a cause's consequences are nested in it and left out of the totals, and
the causes' GPU-time savings (and the GPU time they claim) never add up to more than the trace's GPU time, on
every trace of tests/data (sample_traces/ in test_golden, the shared corpus in test_corpus)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DATA, ROOT, SAMPLES, impact_problems
from tracebuild import read_json, write_json

from attntrace.checks.catalog import load_rules
from attntrace.report import engine

SDPA_MATH = "aten::_scaled_dot_product_attention_math"


def test_tests_data_traces_count_each_gpu_microsecond_once(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(ROOT)
    traces = sorted(str(p.relative_to(ROOT)) for p in DATA.rglob("*.json.gz"))
    report = engine.run(traces, engine.default_settings(load_rules()))
    assert len(report["traces"]) == len(traces) and not report["summary"]["errors"]
    assert impact_problems(report) == []


def _fp32(tmp_path: Path) -> str:
    """An fp32 grouped-query Llama's attention (16 query heads on 8 KV heads) trained with SDPA's math backend:
    the bf16 sample run by `run --from-trace`, its recorded input types made fp32 (the kernels are the math
    backend's fp32 GEMMs in both)."""
    doc = read_json(SAMPLES / "from_trace/fromtrace/llama_train_sdpa/site-1/sdpa_math.pt.trace.json.gz")
    for event in doc["traceEvents"]:
        types = (event.get("args") or {}).get("Input type")
        if types:
            event["args"]["Input type"] = ["float" if t == "c10::BFloat16" else t for t in types]
    return write_json(doc, tmp_path / "llama_fp32_gqa_sdpa_math.json")


def test_fp32_gemms_of_the_sdpa_math_backend_are_counted_in_at202_only(tmp_path: Path):
    """AT201's finding of the model's fp32 GEMMs held the math backend's too, which AT202 claims: they are a
    finding of their own now, nested in AT202's."""
    report = engine.run([_fp32(tmp_path)], engine.default_settings(load_rules()))
    causes = {f["rule"]: f for f in report["findings"]}
    assert causes["AT202"]["evidence"]["reason"] == "gqa-fp32"
    nested = [c for c in causes["AT202"].get("consequences", ()) if c["rule"] == "AT201"]
    assert [c["evidence"]["cause"] for c in nested] == ["sdpa-math-fp32"]
    assert all(SDPA_MATH in chain for chain in nested[0]["evidence"]["op_chains"])
    # The AT201 left at the top holds only GEMMs outside the math call (autograd's replay of its bmm):
    top = [f for f in report["findings"] if f["rule"] == "AT201"]
    assert top and not any(SDPA_MATH in chain for f in top for chain in f["evidence"]["op_chains"])
    assert impact_problems(report) == []


def test_hugging_face_fix_of_a_causal_call_without_a_mask_says_nothing_of_masks(tmp_path: Path):
    """The fp32 grouped-query call above (is_causal=True, no attn_mask) inside a Hugging Face model's forward (a
    with_stack frame of transformers around the step): its fix is the bf16 switch, not "let the model build a
    causal mask"; a call with a mask keeps the mask's fix (test_frameworks)."""
    path = _fp32(tmp_path)
    doc = read_json(path)
    steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    for n, step in enumerate(steps):
        doc["traceEvents"].append({"ph": "X", "cat": "python_function", "pid": step["pid"], "tid": step["tid"],
                                   "ts": step["ts"] + 0.001, "dur": step["dur"] - 0.002,
                                   "name": "transformers/models/llama/modeling_llama.py(250): forward",
                                   "args": {"Python id": 9000 + n, "Python parent id": None}})
    report = engine.run([write_json(doc, tmp_path / "hf.json")], engine.default_settings(load_rules()))
    (math,) = [f for f in report["findings"] if f["rule"] == "AT202"]
    assert math["where"]["framework"] == "transformers"
    framework_part = math["fix"].split(" In plain PyTorch:")[0]
    assert "bf16" in framework_part and "mask" not in framework_part


def test_report_findings_are_causes_and_to_polars_has_their_consequences_too():
    """`report.findings` counts causes, `to_polars()` has a row per cause and per consequence: the README and the
    docstrings said both were "one per finding"."""
    pytest.importorskip("polars")
    import attntrace

    report = attntrace.lint(str(SAMPLES / "bf16_causal_fwd" / "sdpa_math.pt.trace.json.gz"))
    rows = report.to_polars()
    assert rows.height == sum(len(f.and_consequences()) for f in report.findings) > len(report.findings)
    said = "one row per cause and per consequence"
    assert said in attntrace.Report.to_polars.__doc__.lower()
    assert said in (ROOT / "README.md").read_text()
