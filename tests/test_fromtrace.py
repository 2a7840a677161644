"""`attntrace run --from-trace`: the attention sites of real traces (every committed sample kind, Hugging Face
models traced on a CPU, wild traces), the --plan JSON contract, the message for a trace without shapes, the
measurement on the CPU, and lint pointing to it (`--measured`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from attntrace.capture import fromtrace
from attntrace.cli import main
from attntrace.model.loading import load
from tests.conftest import ROOT, SAMPLES
from tests.tracebuild import read_json, write_json

HF = ROOT / "tests" / "data" / "hf_tiny_cpu"


def plan_of(path: str | Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["run", "--from-trace", str(path), "--plan", "--format", "json", *args])
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout)


def only_site(path: str | Path) -> dict[str, Any]:
    doc = plan_of(path)
    assert len(doc["sites"]) == 1, doc["sites"]
    return doc["sites"][0]


# (trace, implementation, q [B, H, S, D], kv_heads, kv_len, causal, backward, calls per step, repeat_kv, rule linked)
SAMPLE_SITES = [
    ("bf16_causal_fwd/naive", "eager (unfused)", [4, 16, 2048, 64], 16, 2048, True, False, 1.0, False, "AT102"),
    ("bf16_causal_fwd/sdpa_math", "sdpa (math)", [4, 16, 2048, 64], 16, 2048, True, False, 1.0, False, "AT202"),
    ("bf16_causal_fwd/sdpa_cudnn", "sdpa (cudnn)", [4, 16, 2048, 64], 16, 2048, True, False, 1.0, False, None),
    ("bf16_causal_fwd/flex", "flex_attention", [4, 16, 2048, 64], 16, 2048, True, False, 1.0, False, None),
    ("bf16_causal_fwd_stack/naive", "eager (unfused)", [4, 16, 2048, 64], 16, 2048, True, False, 1.0, False,
     "AT102"),
    ("bf16_causal_fwdbwd/naive", "eager (unfused)", [4, 16, 2048, 64], 16, 2048, True, True, 1.0, False, "AT102"),
    ("bf16_causal_fwdbwd/sdpa_flash", "sdpa (flash)", [4, 16, 2048, 64], 16, 2048, True, True, 1.0, False, None),
    ("bf16_causal_fwd_d512/sdpa", "sdpa (efficient)", [4, 16, 1024, 512], 16, 1024, True, False, 1.0, False, None),
    ("fp32_causal_fwd/sdpa", "sdpa (efficient)", [4, 16, 2048, 64], 16, 2048, True, False, 1.0, False, "AT203"),
    ("fp32_causal_fwdbwd/sdpa", "sdpa (efficient)", [4, 16, 2048, 64], 16, 2048, True, True, 1.0, False, "AT203"),
    ("bf16_gqa_fwd/naive", "eager (unfused)", [4, 16, 2048, 64], 2, 2048, True, False, 1.0, True, "AT102"),
    ("bf16_gqa_fwd/sdpa", "sdpa (cudnn)", [4, 16, 2048, 64], 2, 2048, True, False, 1.0, False, None),
    ("bf16_gqa_fwd/sdpa_repeat_kv", "sdpa (cudnn)", [4, 16, 2048, 64], 2, 2048, True, False, 1.0, True, None),
    ("bf16_decode_kvcache/naive", "eager (unfused)", [8, 32, 1, 128], 8, 8192, False, False, 1.0, True, None),
    ("bf16_decode_kvcache/sdpa_math", "sdpa (math)", [8, 32, 1, 128], 8, 8192, False, False, 1.0, False, "AT202"),
    ("bf16_decode_kvcache/flex", "flex_attention", [8, 32, 1, 128], 8, 8192, False, False, 1.0, False, None),
    ("bf16_decode_q16/sdpa_flash", "sdpa (flash)", [8, 32, 16, 128], 8, 8192, True, False, 1.0, False, None),
    ("bf16_window_fwd/naive", "eager (unfused)", [1, 16, 8192, 64], 16, 8192, True, False, 1.0, False, "AT102"),
    ("bf16_varlen_fwd/sdpa_efficient", "sdpa (efficient)", [8, 16, 2048, 64], 16, 2048, True, False, 1.0, False,
     None),
    ("workloads/gpt2_eager_train", "eager (unfused)", [8, 8, 511, 64], 8, 511, True, True, 4.0, False, "AT102"),
    ("workloads/gpt2_sdpa_train", "sdpa (cudnn)", [8, 8, 511, 64], 8, 511, True, True, 4.0, False, None),
]


@pytest.mark.parametrize(("name", "implementation", "q", "kv_heads", "kv_len", "causal", "backward", "calls",
                          "repeat_kv", "rule"), SAMPLE_SITES, ids=[s[0] for s in SAMPLE_SITES])
def test_sites_of_every_sample_kind(name: str, implementation: str, q: list[int], kv_heads: int, kv_len: int,
                                    causal: bool, backward: bool, calls: float, repeat_kv: bool, rule: str | None):
    site = only_site(SAMPLES / f"{name}.pt.trace.json.gz")
    assert (site["implementation"], site["q"], site["kv_heads"], site["kv_len"]) == (implementation, q, kv_heads,
                                                                                       kv_len)
    assert (site["causal"], site["backward"], site["calls_per_step"], site["repeat_kv"]) == (causal, backward, calls,
                                                                                           repeat_kv)
    assert site["device"] == "NVIDIA H200" and site["gpu_us_per_step"] > 0
    assert (site["backward_gpu_us_per_step"] > 0) == backward
    if rule == "AT203":  # the fp32 kernels: one finding for forward (and backward), a share of the site
        assert [f["rule"] for f in site["findings"]] == ["AT203"]
        assert 0 < site["findings"][0]["share"] <= 1.0
    else:
        assert [f["rule"] for f in site["findings"]] == ([rule] if rule else [])
        assert all(f["share"] == 1.0 for f in site["findings"])
    assert site["variants"][0] == site["current_variant"]


def test_the_like_for_like_variant_of_each_implementation():
    assert only_site(SAMPLES / "bf16_gqa_fwd/sdpa_repeat_kv.pt.trace.json.gz")["current_variant"] == "sdpa_repeat_kv"
    assert only_site(SAMPLES / "bf16_causal_fwd/sdpa_math.pt.trace.json.gz")["current_variant"] == "sdpa_math"
    assert only_site(SAMPLES / "bf16_gqa_fwd/naive.pt.trace.json.gz")["current_variant"] == "naive"
    sdpa = only_site(SAMPLES / "bf16_gqa_fwd/sdpa.pt.trace.json.gz")
    assert sdpa["enable_gqa"] and sdpa["causal_source"] == "is_causal=True"


@pytest.mark.parametrize("name", ["workloads/launch_bound_tiny_ops", "workloads/low_occupancy_kernel",
                                  "bf16_causal_fwd/compiled", "bf16_causal_fwd/triton"])
def test_traces_without_a_recognisable_attention_call_have_no_site(name: str, tmp_path: Path):
    for extra in (["--plan"], ["--device", "cpu", "--out", str(tmp_path)]):  # nothing to measure: no torch either
        result = CliRunner().invoke(main, ["run", "--from-trace", str(SAMPLES / f"{name}.pt.trace.json.gz"), *extra])
        assert result.exit_code == 0, result.output
        assert "0 attention site(s)" in result.stdout and "no attention calls with recorded shapes" in result.stdout


def test_sites_ordered_by_gpu_time_with_the_findings_they_answer():
    # A real H100 trace of Hugging Face's TimeSformer (TraceLens): two eager attentions per block, space and time.
    doc = plan_of(ROOT / "tests" / "data" / "tracelens_h100_timesformer.json.gz")
    spatial, temporal = doc["sites"]
    assert spatial["gpu_us_per_step"] > temporal["gpu_us_per_step"] > 0
    assert spatial["q"] == [8, 12, 3137, 64] and spatial["calls_per_step"] == 12.0 and not spatial["causal"]
    assert temporal["q"] == [3136, 12, 8, 64]
    assert doc["device"] == "NVIDIA H100 80GB HBM3"


# --- Hugging Face models traced here on the CPU ---------------------------------------------------
def test_hf_llama_gqa_training_eager_and_sdpa():
    eager = only_site(HF / "llama_train_eager.pt.trace.json.gz")
    assert eager["implementation"] == "eager (unfused)" and eager["repeat_kv"]
    assert (eager["q"], eager["kv_heads"], eager["backward"], eager["calls_per_step"]) == ([2, 4, 64, 32], 2, True, 2.0)
    assert eager["causal"] and eager["mask"] == [2, 1, 64, 64] and eager["dtype"] == "fp32"
    sdpa = only_site(HF / "llama_train_sdpa.pt.trace.json.gz")
    assert sdpa["implementation"] == "sdpa (flash (cpu))" and sdpa["current_variant"] == "sdpa"
    assert (sdpa["kv_heads"], sdpa["enable_gqa"], sdpa["backward"], sdpa["causal"]) == (2, True, True, True)
    assert eager["device"] == sdpa["device"] == "cpu" and eager["cpu_us_per_step"] > 0


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hf_llama_generate_has_a_prefill_and_a_decode_site(impl: str):
    doc = plan_of(HF / f"llama_generate_{impl}.pt.trace.json.gz")
    by_kind = {s["decode"]: s for s in doc["sites"]}
    assert len(doc["sites"]) == 2 and set(by_kind) == {True, False}
    decode, prefill = by_kind[True], by_kind[False]
    # 8 new tokens: the first comes from the prefill, 7 decode calls in each of 2 layers; KV length 33 to 39.
    assert decode["calls_per_step"] == 14.0 and decode["kv_len_range"] == [33, 39] and decode["kv_len"] == 36
    assert decode["q"] == [2, 4, 1, 32] and decode["kv_heads"] == 2 and not decode["causal"]
    assert prefill["q"] == [2, 4, 32, 32] and prefill["calls_per_step"] == 2.0 and prefill["causal"]
    assert not decode["backward"] and not prefill["backward"]


def test_hf_gpt2_and_bert():
    gpt2 = only_site(HF / "gpt2_train_eager.pt.trace.json.gz")
    assert gpt2["causal"] and gpt2["backward"] and gpt2["kv_heads"] == 4
    bert = only_site(HF / "bert_infer_eager.pt.trace.json.gz")
    assert not bert["causal"] and bert["causal_source"] == "no mask" and not bert["backward"]
    assert only_site(HF / "bert_infer_sdpa.pt.trace.json.gz")["implementation"] == "sdpa (flash (cpu))"
    forced = plan_of(HF / "gpt2_train_eager.pt.trace.json.gz", "--no-causal")["sites"][0]
    assert not forced["causal"] and forced["causal_source"] == "set by --causal/--no-causal"


# --- the contract ---------------------------------------------------------------------------------
SITE_FIELDS = {"id": int, "kind": str, "implementation": str, "current_variant": str, "q": list, "kv_heads": int,
               "kv_len": int, "decode": bool, "dtype": str, "causal": bool, "causal_source": str, "dropout": float,
               "enable_gqa": bool, "repeat_kv": bool, "backward": bool, "calls_per_step": float,
               "gpu_us_per_step": float, "backward_gpu_us_per_step": float, "cpu_us_per_step": float,
               "op_chain": str, "kernels": list, "device": str, "variants": list, "findings": list}


def test_plan_json_contract():
    doc = plan_of(SAMPLES / "bf16_gqa_fwd/naive.pt.trace.json.gz", "--variants", "naive,sdpa,sdpa_flash")
    assert set(doc) == {"schema_version", "trace", "device", "steps", "has_shapes", "sites", "command"}
    assert doc["schema_version"] == 1 and doc["steps"] == 3 and doc["has_shapes"] is True
    assert doc["command"] == "attntrace run --from-trace " + str(SAMPLES / "bf16_gqa_fwd/naive.pt.trace.json.gz")
    (site,) = doc["sites"]
    for name, kind in SITE_FIELDS.items():
        assert isinstance(site[name], kind), (name, site[name])
    assert site["mask"] == [1, 1, 2048, 2048] and site["kv_len_range"] is None and site["not_measured"] is None
    assert site["variants"] == ["naive", "sdpa", "sdpa_flash"]
    (finding,) = site["findings"]
    assert set(finding) == {"rule", "fingerprint", "share"} and finding["rule"] == "AT102"
    # The fingerprint is lint's own, so `lint --measured` can find the finding.
    lint = CliRunner().invoke(main, ["lint", str(SAMPLES / "bf16_gqa_fwd/naive.pt.trace.json.gz"), "--format", "json",
                                     "--select", "AT102", "--fail-on", "never"])
    assert orjson.loads(lint.stdout)["findings"][0]["fingerprint"] == finding["fingerprint"]


def test_plan_is_deterministic_and_text_names_the_command():
    path = str(SAMPLES / "workloads/gpt2_eager_train.pt.trace.json.gz")
    first = CliRunner().invoke(main, ["run", "--from-trace", path, "--plan"])
    second = CliRunner().invoke(main, ["run", "--from-trace", path, "--plan"])
    assert first.exit_code == 0 and first.stdout == second.stdout
    assert "site 1: eager (unfused), 4 call(s) per step" in first.stdout
    assert "B=8 H=8 S=511 D=64 | bf16 | causal | mask [1, 1, 511, 511] | fwd+bwd" in first.stdout
    assert f"measure them: attntrace run --from-trace {path}" in first.stdout


def test_plan_does_not_import_torch(tmp_path: Path):
    import subprocess
    import sys

    code = ("import sys; from attntrace.cli import main; sys.argv = ['attntrace', 'run', '--from-trace', "
            f"{str(SAMPLES / 'bf16_gqa_fwd/naive.pt.trace.json.gz')!r}, '--plan']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr


def _without_shapes(tmp_path: Path, name: str) -> str:
    doc = read_json(SAMPLES / name)
    doc.pop("record_shapes", None)
    for event in doc["traceEvents"]:
        for key in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs"):
            event.get("args", {}).pop(key, None)
    return write_json(doc, tmp_path / "no_shapes.json")


def test_no_shapes_is_one_line_naming_record_shapes_and_exit_2(tmp_path: Path):
    path = _without_shapes(tmp_path, "bf16_causal_fwd/naive.pt.trace.json.gz")
    for extra in (["--plan"], ["--plan", "--format", "json"], ["--device", "cpu"]):
        result = CliRunner().invoke(main, ["run", "--from-trace", path, *extra])
        assert result.exit_code == 2, result.output
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1 and "record_shapes=True" in result.stderr and path in result.stderr


def test_bad_usage_with_from_trace(tmp_path: Path):
    path = str(SAMPLES / "bf16_gqa_fwd/naive.pt.trace.json.gz")
    sized = CliRunner().invoke(main, ["run", "--from-trace", path, "--seq", "64"])
    assert sized.exit_code == 2 and "--seq cannot be used with --from-trace" in sized.stderr
    alone = CliRunner().invoke(main, ["run", "--plan"])
    assert alone.exit_code == 2 and "--from-trace" in alone.stderr
    unknown = CliRunner().invoke(main, ["run", "--from-trace", path, "--plan", "--variants", "nosuch"])
    assert unknown.exit_code == 2 and "nosuch" in unknown.stderr
    missing = CliRunner().invoke(main, ["run", "--from-trace", str(tmp_path / "none.json"), "--plan"])
    assert missing.exit_code == 2 and "none.json" in missing.stderr and "Traceback" not in missing.output


# --- lint points to it ----------------------------------------------------------------------------
def _lint(path: str | Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["lint", str(path), "--format", "json", "--fail-on", "never", *args])
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout)


@pytest.mark.parametrize(("name", "rule"), [("bf16_causal_fwd/naive", "AT102"), ("bf16_causal_fwd/sdpa_math", "AT202"),
                                            ("fp32_causal_fwd/sdpa", "AT203")])
def test_attention_fixes_end_with_the_command_that_measures_them(name: str, rule: str):
    path = SAMPLES / f"{name}.pt.trace.json.gz"
    (finding,) = [f for f in _lint(path)["findings"] if f["rule"] == rule]
    assert f"`attntrace run --from-trace {path}`" in finding["fix"]
    others = [f for f in _lint(path)["findings"] if f["rule"] not in fromtrace.MEASURED_RULES]
    assert all("--from-trace" not in f["fix"] for f in others)


def test_no_command_without_shapes(tmp_path: Path):
    path = _without_shapes(tmp_path, "fp32_causal_fwd/sdpa.pt.trace.json.gz")
    (finding,) = [f for f in _lint(path)["findings"] if f["rule"] == "AT203"]  # AT203 needs no shapes
    assert "--from-trace" not in finding["fix"]


def _measured_doc(trace: str, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """What `run --from-trace` writes for `trace` (its real plan), with a saving measured for its one site."""
    doc = fromtrace.plan(load(trace), "naive,sdpa")
    (site,) = doc["sites"]
    report = {"environment": {"gpu": "NVIDIA H200"}, "table": [
        {"variant": "naive", "status": "ok", "event_ms": site["gpu_us_per_step"] / 1e3},
        {"variant": "sdpa", "status": "ok", "event_ms": 0.1}]}
    return doc, fromtrace.summarize_measurement(doc, [{"site": site, "report": report}], tmp_path)


def test_measurement_summary_verdicts_and_findings(tmp_path: Path):
    trace = str(SAMPLES / "bf16_causal_fwd/naive.pt.trace.json.gz")
    doc, measured = _measured_doc(trace, tmp_path)
    (site,) = measured["sites"]
    assert site["yours_basis"] == "in the trace" and site["best"] == "sdpa" and measured["notes"] == []
    assert site["saving_ms_per_step"] == pytest.approx(site["yours_ms_per_step"] - 0.1, abs=1e-3)
    assert site["verdict"].startswith("site 1: your eager (unfused): ") and "sdpa measured here: 0.100 ms" in site[
        "verdict"]
    (fingerprint,) = measured["findings"]
    assert fingerprint == doc["sites"][0]["findings"][0]["fingerprint"]
    assert measured["findings"][fingerprint]["saved_us_per_step"] == pytest.approx(site["saving_ms_per_step"] * 1e3,
                                                                                   abs=0.5)
    # From another GPU the measurement says so, and the user's time is the like-for-like variant's here.
    elsewhere = copy.deepcopy(doc)
    elsewhere["device"] = "NVIDIA A100-SXM4-80GB"
    other = fromtrace.summarize_measurement(elsewhere, [{"site": elsewhere["sites"][0], "report": {
        "environment": {"gpu": "NVIDIA H200"}, "table": [{"variant": "naive", "status": "ok", "event_ms": 3.0},
                                                        {"variant": "sdpa", "status": "ok", "event_ms": 0.5}]}}],
                                            tmp_path)
    assert other["notes"] == ["the trace ran on NVIDIA A100-SXM4-80GB; these measurements are for NVIDIA H200"]
    assert other["sites"][0]["yours_basis"] == "naive measured here" and other["sites"][0]["saving_ms_per_step"] == 2.5


def test_fastest_is_what_you_run(tmp_path: Path):
    doc = fromtrace.plan(load(str(SAMPLES / "bf16_causal_fwd/sdpa_cudnn.pt.trace.json.gz")), "sdpa_cudnn,naive")
    (site,) = doc["sites"]
    report = {"environment": {"gpu": "NVIDIA H200"}, "table": [
        {"variant": "sdpa_cudnn", "status": "ok", "event_ms": 0.09}, {"variant": "naive", "status": "ok",
                                                                       "event_ms": 2.2}]}
    result = fromtrace.summarize_measurement(doc, [{"site": site, "report": report}], tmp_path)
    assert result["sites"][0]["saving_ms_per_step"] == 0.0
    assert result["sites"][0]["verdict"].endswith("the fastest measured here is sdpa_cudnn at 0.090 ms, which is what "
                                                  "you run")


def test_lint_measured_uses_the_measured_saving_and_says_so(tmp_path: Path):
    trace = str(SAMPLES / "bf16_causal_fwd/naive.pt.trace.json.gz")
    _, measured = _measured_doc(trace, tmp_path)
    run_json = tmp_path / "run.json"
    run_json.write_bytes(orjson.dumps(measured))
    before = {f["rule"]: f for f in _lint(trace)["findings"]}
    after = _lint(trace, "--measured", str(run_json))
    finding = next(f for f in after["findings"] if f["rule"] == "AT102")
    saved = measured["findings"][finding["fingerprint"]]["saved_us_per_step"]
    assert finding["impact"]["gpu_us_per_step"] == pytest.approx(saved)
    assert finding["impact"]["basis"] == "measured"
    assert finding["impact"]["assumed_gpu_us_per_step"] == before["AT102"]["impact"]["gpu_us_per_step"]
    ratio = before["AT102"]["impact"]["share_of_step"] / before["AT102"]["impact"]["gpu_us_per_step"]
    assert finding["impact"]["share_of_step"] == pytest.approx(saved * ratio, rel=1e-3)
    assert "measured by `attntrace run --from-trace` on NVIDIA H200" in finding["message"]
    assert finding["evidence"]["measured"]["best_variant"] == "sdpa"
    # The copy inside the attention is a consequence of it: its own impact is left as it was.
    assert before["AT102"]["consequences"][0]["rule"] == "AT101"
    assert before["AT102"]["consequences"][0]["impact"] == finding["consequences"][0]["impact"]
    # A wide terminal: a long checkout path must not fold the message out of the first line.
    text = CliRunner().invoke(main, ["lint", trace, "--measured", str(run_json), "--fail-on", "never"],
                              env={"COLUMNS": "400"})
    assert "impact measured by" in text.stdout


def test_lint_measured_matches_a_finding_whose_fingerprint_changed_since_the_run_and_warns_of_the_rest():
    # The committed GPT-2 run.json names AT102 by the key it had when it was measured; AT102's key changed when it
    # began counting the backward, and --measured then did nothing, silently.
    folder = SAMPLES / "from_trace"
    run_json = folder / "fromtrace/gpt2_train_eager/run.json"
    measured = orjson.loads(run_json.read_bytes())
    result = CliRunner().invoke(main, ["lint", str(folder / "gpt2_train_eager.pt.trace.json.gz"), "--measured",
                                       str(run_json), "--format", "json", "--fail-on", "never"])
    finding = next(f for f in orjson.loads(result.stdout)["findings"] if f["rule"] == "AT102")
    assert finding["fingerprint"] not in measured["findings"]
    (saved,) = [entry["saved_us_per_step"] for entry in measured["findings"].values()]
    assert finding["impact"]["basis"] == "measured" and finding["impact"]["gpu_us_per_step"] == pytest.approx(saved)
    assert result.stderr == ""
    # Another trace's run: nothing applies, and lint says so in one line; the exit code is the findings'.
    other = CliRunner().invoke(main, ["lint", str(folder / "llama_train_eager.pt.trace.json.gz"), "--measured",
                                      str(run_json), "--format", "json", "--fail-on", "never"])
    assert other.exit_code == 0
    assert all(f["impact"].get("basis") != "measured" for f in orjson.loads(other.stdout)["findings"])
    assert other.stderr.count("\n") == 1 and "1 measured finding(s) (AT102) match no finding" in other.stderr


def test_lint_measured_refuses_another_file(tmp_path: Path):
    other = tmp_path / "run.json"
    other.write_bytes(b'{"config": {}}')
    result = CliRunner().invoke(main, ["lint", str(SAMPLES / "bf16_causal_fwd/naive.pt.trace.json.gz"),
                                       "--measured", str(other)])
    assert result.exit_code == 2 and "not the run.json of `attntrace run --from-trace`" in result.stderr


# --- measuring on the CPU -------------------------------------------------------------------------
def test_measure_a_cpu_trace_at_its_shapes(tmp_path: Path):
    pytest.importorskip("torch")
    source = tmp_path / "source"
    made = CliRunner().invoke(main, ["run", "--device", "cpu", "--dtype", "fp32", "--seq", "48", "--batch", "1",
                                     "--heads", "4", "--kv-heads", "2", "--backward", "--variants", "naive",
                                     "--steps", "2", "--warmup", "0", "--no-lint", "--out", str(source)])
    assert made.exit_code == 0, made.output
    trace = source / "naive.pt.trace.json.gz"
    out = tmp_path / "measured"
    result = CliRunner().invoke(main, ["run", "--from-trace", str(trace), "--device", "cpu", "--variants",
                                       "naive,sdpa,sdpa_flash", "--steps", "1", "--warmup", "0", "--no-lint",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = orjson.loads((out / "run.json").read_bytes())
    assert doc["kind"] == fromtrace.MEASURED_KIND and doc["device"] == doc["trace_device"] == "cpu"
    (site,) = doc["sites"]
    assert site["run"] == "site-1/run.json" and site["best"] in ("naive", "sdpa")
    run = orjson.loads((out / site["run"]).read_bytes())
    assert run["config"]["shape"] == {"batch": 1, "heads": 4, "seq": 48, "head_dim": 64, "kv_heads": 2,
                                      "query_len": None, "window": None, "lengths": None}
    assert run["config"]["backward"] and run["config"]["dtype"] == "fp32" and run["config"]["causal"]
    status = {v["name"]: v for v in run["variants"]}
    assert status["naive"]["status"] == status["sdpa"]["status"] == "ok"
    assert status["naive"]["rel_error"] < 2e-3 and status["sdpa_flash"]["status"] == "skipped"
    assert (out / "site-1" / "sdpa.pt.trace.json.gz").is_file()
    assert "site 1: your eager (unfused): " in result.stdout and "whole step: attention takes" in result.stdout
    assert "variant" in result.stdout and "timed ms/fwd+bwd" in result.stdout
    # Minutes of CPU work at a real model's shapes said nothing: each site and variant is announced on stderr,
    # and the CPU's timings are called what they are.
    assert result.stderr.splitlines() == [
        "measuring site 1 of 1: B=1 H=4 KV heads=2 S=48 D=64 | fp32 | causal | mask [1, 1, 48, 48] | repeat_kv "
        "copies | fwd+bwd, 3 variant(s) on cpu",
        "  [1/3] naive", "  [2/3] sdpa", "  [3/3] sdpa_flash"]
    assert "note: CPU timings at these sizes are noise (profiler x " in result.stdout


def test_a_shape_too_large_for_float64_is_checked_on_a_reduced_copy():
    pytest.importorskip("torch")
    from attntrace.capture.options import Shape
    from attntrace.capture.runner import reduced_for_check

    small = Shape(1, 4, 64, 64, 2)
    assert reduced_for_check(small, "cpu") == small
    big = Shape(8, 32, 8192, 128, 8)
    reduced = reduced_for_check(big, "cuda")
    assert (reduced.batch, reduced.heads, reduced.n_kv_heads, reduced.head_dim) == (1, 4, 1, 128)
    assert reduced.heads * reduced.q_len * reduced.kv_len <= 2**27 and reduced.q_len == reduced.kv_len
    decode = reduced_for_check(Shape(64, 32, 65536, 128, 8, query_len=1), "cpu")
    # One query per sequence: one batch and one KV group already fit, so the cache keeps its length.
    assert (decode.batch, decode.heads, decode.q_len, decode.kv_len, decode.n_kv_heads) == (1, 4, 1, 65536, 1)


def test_autocast_reports_the_dtype_the_backend_ran():
    """Under bf16 autocast with q and k upcast to fp32 (as Hugging Face's rotary embeddings do), the SDPA call
    records fp32 inputs and its backend op the bf16 ones it ran (tests/data/cpu_training/, a real CPU capture by
    tools/capture_training_cpu.py)."""
    site = only_site(ROOT / "tests" / "data" / "cpu_training" / "autocast_sdpa_train.pt.trace.json.gz")
    assert (site["dtype"], site["backward"]) == ("bf16", True)


def test_compiled_training_counts_the_backward_of_its_attention():
    """torch.compile's backward is one autograd node for the graph: no flow leads from the cuDNN forward to its
    backward op, which is paired by name. The site's GPU time is then that of the eager ViT's same training
    step (heldout/vit_small_train), not the forward alone."""
    compiled = only_site(SAMPLES / "compiled" / "vit_small_train_compiled.shapes_stack.pt.trace.json.gz")
    eager = only_site(SAMPLES / "heldout" / "vit_small_train.shapes.pt.trace.json.gz")
    assert compiled["backward"] and compiled["backward_gpu_us_per_step"] > 0
    assert compiled["gpu_us_per_step"] == pytest.approx(eager["gpu_us_per_step"], rel=0.05)


def test_flex_attention_training_counts_its_backward_kernel(tmp_path: Path):
    """A FlexAttention training step: the flex sample with, after each forward, the template's backward kernel
    launched as compiled code launches it (a launch op of the kernel's name, no autograd flow)."""
    doc = read_json(SAMPLES / "bf16_causal_fwd" / "flex.pt.trace.json.gz")
    forward = [e for e in doc["traceEvents"] if e.get("name") == "triton_tem_fused_flex_attention_0"]
    added = []
    for event in forward:
        back = copy.deepcopy(event)
        back["name"] = back["args"]["kernel_name"] = "triton_tem_fused_flex_attention_backward_1"
        own = event["args"]["External id"]  # launch op, launch and kernel of one forward share it
        back["args"]["External id"] = 90000 + own
        if event.get("cat") == "cpu_op":  # just after the forward's launch op, in the same step
            back["ts"], back["dur"] = event["ts"] + event["dur"] + 0.5, 2.0
            launch = next(e for e in doc["traceEvents"] if e.get("cat") == "cuda_driver"
                          and e["args"].get("External id") == event["args"]["External id"])
            launch = copy.deepcopy(launch)
            launch["ts"], launch["dur"] = back["ts"] + 0.2, 1.0
            launch["args"].update({"External id": 90000 + own, "correlation": 990000 + own})
            added.append(launch)
        else:  # the kernel, after the forward's
            back["ts"] = event["ts"] + event["dur"] + 1.0
            back["args"]["correlation"] = 990000 + own
        added.append(back)
    doc["traceEvents"].extend(added)
    site = only_site(write_json(doc, tmp_path / "flex_train.json"))
    assert site["backward"] and site["backward_gpu_us_per_step"] > 0
