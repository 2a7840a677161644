"""`attntrace run` without a GPU: argument checks before torch's import, the peaks table, the FLOP and byte
counts, the columns, the verdict and the skip reasons, on numbers and messages captured on the H200."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
from conftest import ROOT, SAMPLES, sample

from attntrace.capture.options import Shape, check_shape, variant_names, varlen_lengths
from attntrace.report import compare

BAD_ARGS = [
    (["--variants", "nosuch"], "unknown variant(s) nosuch"),
    (["--heads", "4", "--kv-heads", "3"], "--kv-heads 3 must divide --heads 4"),
    (["--query-len", "9", "--seq", "8"], "--query-len 9 must be between 1"),
    (["--query-len", "1", "--backward"], "decode has no backward"),
    (["--window", "16", "--no-causal"], "causal sliding window"),
    (["--varlen", "--query-len", "1"], "--varlen needs queries as long as keys"),
    (["--steps", "0"], "must be positive"),
]


@pytest.mark.parametrize(("args", "message"), BAD_ARGS)
def test_bad_arguments_exit_2_before_torch_is_imported(args: list[str], message: str):
    # A fresh interpreter, so that no other test has imported torch already.
    code = ("import sys; from click.testing import CliRunner; from attntrace.cli import main; "
            f"r = CliRunner().invoke(main, ['run', *{args!r}]); "
            "print(r.exit_code); print('torch' in sys.modules); print(r.output)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    exit_code, torch_imported, output = out.split("\n", 2)
    assert exit_code == "2"
    assert torch_imported == "False"
    assert message in output
    assert "Traceback" not in output


def test_variant_lists_follow_the_scenario():
    dense = Shape(1, 4, 64, 16)
    gqa = Shape(1, 4, 64, 16, kv_heads=1)
    varlen = Shape(2, 4, 64, 16, lengths=(64, 16))
    assert "sdpa_repeat_kv" not in variant_names("all", dense) and "sdpa_nested" not in variant_names("all", dense)
    assert "sdpa_repeat_kv" in variant_names("all", gqa)
    assert "sdpa_nested" in variant_names("all", varlen)
    assert variant_names("sdpa, naive,sdpa", dense) == ("sdpa", "naive")
    assert gqa.scenario() == "mqa" and Shape(1, 4, 64, 16, kv_heads=2, query_len=1).scenario() == "gqa+decode"
    assert check_shape(Shape(1, 4, 64, 16, kv_heads=2, query_len=1, window=8), True, False, 1, 0) is None
    assert varlen_lengths(4, 64) == (64, 48, 32, 16) and varlen_lengths(1, 64) == (64,)


@pytest.mark.parametrize(("name", "expected"), [
    ("NVIDIA H200", "NVIDIA H200 SXM"), ("NVIDIA H200 NVL", "NVIDIA H200 NVL"),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"), ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM 80GB"), ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB"),
    ("NVIDIA L4", "NVIDIA L4"), ("NVIDIA L40S", "NVIDIA L40S"), ("NVIDIA B200", "NVIDIA B200 (HGX, 1000 W)"),
    ("AMD Instinct MI300X", "AMD Instinct MI300X"), ("NVIDIA L40", None), ("NVIDIA GeForce GTX 1080", None),
])
def test_peaks_match_whole_words_and_longest_name(name: str, expected: str | None):
    found = compare.device_peaks(name)
    assert (found["name"] if found else None) == expected


def test_peak_follows_device_and_precision():
    h200 = {"gpu": "NVIDIA H200", "tf32_matmul": False}
    assert compare.peak_for(h200, "bf16")["tflops"] == 989.4
    assert compare.peak_for(h200, "fp32")["tflops"] == 66.9
    assert compare.peak_for({**h200, "tf32_matmul": True}, "fp32")["precision"] == "tf32"
    assert compare.peak_for({"gpu": "NVIDIA A100-SXM4-80GB"}, "fp16")["tflops"] == 312.0
    unknown = compare.peak_for({"gpu": "Some New GPU"}, "bf16")
    assert unknown["tflops"] is None and "unknown device 'Some New GPU'" in unknown["reason"]
    assert compare.peak_for({"gpu": None, "cpu": "x86_64"}, "bf16")["tflops"] is None


def test_attended_pairs_and_flops():
    def shape(**kw):
        return {"batch": 1, "heads": 1, "seq": 4, "head_dim": 1, **kw}

    assert compare.attended_pairs(shape(), causal=True) == 10
    assert compare.attended_pairs(shape(), causal=False) == 16
    assert compare.attended_pairs(shape(seq=8, query_len=1), causal=True) == 8  # decode sees the whole cache
    assert compare.attended_pairs(shape(seq=8, query_len=2), causal=True) == 15
    assert compare.attended_pairs(shape(window=2), causal=True) == 7
    assert compare.attended_pairs(shape(batch=2, lengths=[4, 2]), causal=True) == 13
    assert compare.attention_flops(shape(heads=2, head_dim=8), causal=True, backward=False) == 4 * 8 * 2 * 10
    assert compare.attention_flops(shape(), causal=True, backward=True) == 4 * 10 * 3.5


def test_op_bytes():
    bf16 = "c10::BFloat16"
    assert compare.op_bytes("aten::bmm", [[2, 3, 4], [2, 4, 5]], [bf16, bf16]) == 2 * (24 + 40 + 30)
    assert compare.op_bytes("aten::bmm", [[2, 3, 4], [2, 4, 5], [2, 3, 5]], [bf16] * 3) == 2 * (24 + 40 + 30)
    assert compare.op_bytes("aten::addmm", [[5], [3, 4], [4, 5]], [bf16] * 3) == 2 * (5 + 12 + 20 + 15)
    assert compare.op_bytes("aten::copy_", [[10], [10], []], [bf16, bf16, "Scalar"]) == 40
    assert compare.op_bytes("aten::masked_fill_", [[4, 4], [4, 4], []], [bf16, "bool", "Scalar"]) == 32 + 16 + 32
    assert compare.op_bytes("aten::mul", [[8], []], [bf16, "double"]) == 32
    assert compare.op_bytes("triton_poi_fused_clone_0", [[8], [8]], [bf16, bf16]) == 32
    assert compare.op_bytes("aten::mul", [[], []], ["Scalar", "Scalar"]) is None


def test_bytes_per_step_on_h200_traces():
    from attntrace.model.loading import load

    # cuDNN's fused kernel reads q, k, v and writes o: 4 x [4, 16, 2048, 64] bf16.
    assert compare.bytes_per_step(load(sample("bf16_causal_fwd/sdpa"))) == 4 * 4 * 16 * 2048 * 64 * 2
    naive = compare.bytes_per_step(load(sample("bf16_causal_fwd/naive")))
    scores = 4 * 16 * 2048 * 2048 * 2
    assert 8 * scores < naive < 12 * scores  # the score tensor is written and read again about ten times


def _result(name: str, ms: float | None, status: str = "ok", **numbers: float) -> dict:
    return {"name": name, "status": status, "reason": None if status == "ok" else "why", "event_ms": ms,
            "numbers": {"gpu_ms": ms, **numbers} if status == "ok" else {}}


def test_table_columns_bandwidth_and_verdict():
    peak = compare.peak_for({"gpu": "NVIDIA H200"}, "bf16")
    flops = 1e9
    results = [_result("naive", 2.0, bytes=4e9, kernels=5.0, cpu_ms=0.3),
               _result("sdpa", 0.1, bytes=1e6, kernels=1.0, cpu_ms=0.2),
               _result("sdpa_flash", None, status="skipped")]
    rows = compare.table_rows(results, flops, peak)
    naive, sdpa, skipped = rows
    assert naive["tbs"] == pytest.approx(2.0) and naive["hbm_pct"] == pytest.approx(100 * 2.0 / 4.8)
    assert sdpa["tbs"] is None  # 1000 FLOP per byte: above the H200's ridge (206), so not memory-bound
    assert naive["peak_pct"] == pytest.approx(100 * 0.5 / 989.4)
    text = compare.render(rows, backward=True)
    assert "kernels/fwd+bwd" in text and "GPU ms/fwd+bwd" in text and "CPU ms/fwd+bwd" in text
    assert "/fwd " not in text
    assert skipped["status"] == "skipped: why"
    report = {"config": {"device": "cuda", "backward": True}, "table": rows}
    assert compare.verdict(report) == "verdict: sdpa is fastest at 0.100 ms per fwd+bwd, 20.00x faster than naive"


def test_cpu_table_drops_gpu_columns_and_uses_the_timed_run():
    peak = compare.peak_for({"gpu": None}, "bf16")
    results = [{"name": "naive", "status": "ok", "event_ms": 2.0, "numbers": {"cpu_ms": 160.0, "kernels": 0}}]
    rows = compare.table_rows(results, 2e9, peak, on_gpu=False)
    assert rows[0]["tflops"] == pytest.approx(1.0)  # from the 2 ms timed run, not the profiled 160 ms
    assert rows[0]["profiler_x"] == pytest.approx(80.0)
    text = compare.render(rows)
    assert "GPU ms" not in text and "kernels" not in text and "profiler x" in text


def _h200_warnings(folder: str, variant: str) -> list[str]:
    run = orjson.loads((SAMPLES / folder / "run.json").read_bytes())
    entry = next(v for v in run["variants"] if v["name"] == variant)
    return [w.split(": ", 1)[1] for w in entry["warnings"]]


def test_skip_reasons_are_short_on_pytorch_messages_from_the_h200():
    pytest.importorskip("torch")
    from attntrace.capture.runner import backend_reasons, short_reason

    kernel = RuntimeError("No available kernel. Aborting execution.")
    window = _h200_warnings("bf16_window_fwd", "sdpa_flash")
    assert short_reason(kernel, window, "sdpa_flash") == "flash: no attn_mask support"
    assert backend_reasons(window, "sdpa_flash") == ["Flash Attention does not support non-null attn_mask."]
    gqa = _h200_warnings("bf16_gqa_fwd", "sdpa_efficient")
    assert short_reason(kernel, gqa, "sdpa_efficient") == "efficient: no grouped-query heads"
    head_dim = ["Flash attention kernel not used because:", "Flash attention requires q,k,v to have the same last "
                "dimension and to be less than or equal to 256. Got Query.size(-1): 1000, Key.size(-1): 1000"]
    assert short_reason(kernel, head_dim, "sdpa_flash") == "flash: head dim 1000 > 256"
    assert short_reason(ValueError("a long first sentence. And more"), [], "compiled") == "a long first sentence"


def test_the_sample_runs_findings_column_is_what_lint_says_now():
    # The column is lint's verdict on each variant's trace at capture time; a rule change must be carried into
    # the committed runs (tests/update_run_tables.py), or the README's table and run.json say something else.
    from update_run_tables import findings_now, runs

    for path in runs():
        report = orjson.loads(path.read_bytes())
        now = findings_now(path)
        assert now, path
        assert {v["name"]: v["numbers"]["findings"] for v in report["variants"] if v["name"] in now} == now, path
        assert {r["variant"]: r["findings"] for r in report["table"] if r["variant"] in now} == now, path
