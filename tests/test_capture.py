"""attntrace run end to end on the CPU (CI has no GPU), and the GPU path where CUDA exists."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from attntrace.cli import main  # noqa: E402


def test_run_on_cpu_end_to_end(tmp_path: Path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", "--device", "cpu", "--seq", "64", "--batch", "1", "--heads", "2",
                                       "--steps", "2", "--warmup", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = orjson.loads((out / "run.json").read_bytes())
    status = {v["name"]: v for v in report["variants"]}
    for name in ("naive", "naive_inplace", "sdpa_math", "sdpa"):
        assert status[name]["status"] == "ok", status[name]
        assert (out / f"{name}.pt.trace.json.gz").is_file()
        assert status[name]["rel_error"] < 3e-2
        assert status[name]["numbers"]["findings"]  # each trace it wrote was linted
    for name in ("sdpa_flash", "triton", "compiled", "flash_attn2", "xformers"):
        assert status[name]["status"] == "skipped" and "cuda" in status[name]["reason"]
    assert "naive" in result.stdout and "vs naive" in result.stdout and "verdict: " in result.stdout
    assert "kernels/fwd" not in result.stdout  # no kernels on the CPU: the column is left out
    assert "peak: no peak for a CPU run" in result.stdout
    assert report["peak"]["tflops"] is None
    # Throughput comes from the timed run, not the profiled one, and the profiler's cost is shown.
    naive = next(row for row in report["table"] if row["variant"] == "naive")
    assert naive["tflops"] == pytest.approx(report["flops_per_step"] / status["naive"]["event_ms"] / 1e9)
    assert naive["profiler_x"] > 0
    assert all(isinstance(v["warnings"], list) for v in report["variants"])
    assert "Warning" not in result.stdout  # PyTorch's warnings go to run.json, not over the table


SCENARIOS = [
    (["--heads", "4", "--kv-heads", "1"], ("naive", "sdpa_math", "sdpa", "sdpa_repeat_kv"), "mqa"),
    (["--heads", "4", "--kv-heads", "2", "--query-len", "1", "--seq", "96", "--batch", "2"],
     ("naive", "naive_inplace", "sdpa_math", "sdpa"), "gqa+decode"),
    (["--query-len", "5", "--seq", "40"], ("naive", "sdpa_math", "sdpa"), "decode"),
    (["--window", "8", "--seq", "48"], ("naive", "naive_inplace", "sdpa_math", "sdpa"), "window"),
    (["--varlen", "--batch", "3", "--seq", "48"], ("naive", "sdpa_math", "sdpa"), "varlen"),
    (["--varlen", "--batch", "2", "--seq", "32", "--backward"], ("naive", "sdpa"), "varlen"),
]


@pytest.mark.parametrize(("args", "ok", "scenario"), SCENARIOS)
def test_scenarios_on_cpu_match_float64(tmp_path: Path, args: list[str], ok: tuple[str, ...], scenario: str):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", "--device", "cpu", "--dtype", "fp32", "--steps", "1", "--warmup", "0",
                                       "--no-lint", "--variants", ",".join(ok), "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    report = orjson.loads((out / "run.json").read_bytes())
    assert report["config"]["scenario"] == scenario
    for v in report["variants"]:
        assert v["status"] == "ok", v
        assert v["rel_error"] < 2e-3


def test_nested_jagged_variant_matches_float64_without_causal(tmp_path: Path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", "--device", "cpu", "--dtype", "fp32", "--steps", "1", "--warmup", "0",
                                       "--no-lint", "--no-causal", "--varlen", "--batch", "3", "--seq", "40",
                                       "--variants", "sdpa_nested", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (nested,) = orjson.loads((out / "run.json").read_bytes())["variants"]
    assert nested["status"] == "ok" and nested["rel_error"] < 2e-3


def test_exit_codes_every_variant_skipped_or_one_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    base = ["run", "--device", "cpu", "--seq", "32", "--steps", "1", "--warmup", "0", "--no-lint"]
    skipped = CliRunner().invoke(main, [*base, "--variants", "sdpa_flash,triton", "--out", str(tmp_path / "a")])
    assert skipped.exit_code == 2
    assert "every requested variant was skipped" in skipped.stderr
    from attntrace.capture import runner

    monkeypatch.setitem(runner.TOLERANCE, torch.bfloat16, 0.0)  # no bf16 result is exact
    failed = CliRunner().invoke(main, [*base, "--variants", "naive,sdpa_flash", "--out", str(tmp_path / "b")])
    assert failed.exit_code == 1
    assert "failed: relative error" in failed.output


def test_warnings_during_a_variant_are_kept_not_printed(tmp_path: Path):
    import warnings

    from attntrace.capture import runner
    from attntrace.capture.variants import Variant

    def build(shape, causal, device):
        def attend(q, k, v):
            warnings.warn("attntrace test warning", UserWarning, stacklevel=1)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return attend

    config = runner.RunConfig(("noisy",), runner.Shape(1, 2, 16, 8), "fp32", True, False, 1, 1, "cpu", tmp_path)
    result = runner.run_variant(Variant("noisy", "warns on every call", build), config, torch.device("cpu"))
    assert result.status == "ok"
    noisy = [w for w in result.warnings if "attntrace test warning" in w]
    assert len(noisy) == 1 and noisy[0].startswith("UserWarning: attntrace test warning (x")


def test_summary_does_not_name_a_gpu_for_a_cpu_only_trace(tmp_path: Path):
    import gzip

    from attntrace.model.loading import load
    from attntrace.model.summary import summarize

    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", "--device", "cpu", "--seq", "16", "--steps", "1", "--warmup", "0",
                                       "--no-lint", "--variants", "sdpa", "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(gzip.decompress((out / "sdpa.pt.trace.json.gz").read_bytes()))
    # As Kineto writes it on a CUDA machine profiling CPU work only: the GPU's properties, no GPU events.
    doc["deviceProperties"] = [{"id": 0, "name": "NVIDIA H200", "computeMajor": 9, "computeMinor": 0}]
    path = tmp_path / "cpu_only.json"
    path.write_bytes(orjson.dumps(doc))
    assert summarize(load(str(path)))["device"] is None


def test_unsupported_combinations_are_skipped_with_reason():
    from attntrace.capture.variants import VARIANTS, Shape, unsupported_reason

    shape = Shape(1, 1, 64, 64)
    cpu = torch.device("cpu")
    assert "cuda" in unsupported_reason(VARIANTS["sdpa_flash"], cpu, torch.bfloat16, shape, False)
    assert unsupported_reason(VARIANTS["naive"], cpu, torch.float32, shape, True) is None
    nested = unsupported_reason(VARIANTS["sdpa_nested"], cpu, torch.float32, shape, True)
    assert nested == "forward only; no backward here"
    gqa = Shape(1, 4, 64, 64, kv_heads=2)
    assert unsupported_reason(VARIANTS["xformers"], cpu, torch.float32, gqa, False) == "needs cuda, not cpu"


@pytest.mark.parametrize("module", ["flash_attn", "xformers", "transformer_engine"])
def test_third_party_variant_skipped_when_its_package_is_missing(module: str, monkeypatch: pytest.MonkeyPatch):
    import importlib.util

    from attntrace.capture.variants import VARIANTS, Shape, unsupported_reason

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    variant = next(v for v in VARIANTS.values() if module in v.needs)
    gpu = torch.device("cuda")  # the package check comes before any CUDA call
    assert unsupported_reason(variant, gpu, torch.bfloat16, Shape(1, 1, 64, 64), False) == f"{module} not installed"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_run_all_variants_on_gpu(tmp_path: Path):
    result = CliRunner().invoke(main, ["run", "--seq", "512", "--steps", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = orjson.loads((tmp_path / "run.json").read_bytes())
    assert all(v["status"] != "failed" for v in report["variants"])


def test_run_on_cpu_prints_the_table_and_keeps_torchs_import_warnings(tmp_path: Path):
    # In a process of its own: torch's warnings at import (no NumPy) only show on a first import.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "attntrace", "run", "--device", "cpu", "--variants",
                           "naive,sdpa_flash", "--steps", "1", "--warmup", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "skipped:" not in done.stderr and "Warning" not in done.stderr  # the table says why sdpa_flash skipped
    assert "skipped: needs cuda" in done.stdout
    report = orjson.loads((tmp_path / "run.json").read_bytes())
    assert isinstance(report["import_warnings"], list)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a CUDA device")
def test_run_without_cuda_says_what_to_do_in_one_line(tmp_path: Path):
    result = CliRunner().invoke(main, ["run", "--steps", "1", "--out", str(tmp_path)])
    assert result.exit_code == 2 and result.stderr.strip().count("\n") == 0
    assert "--device cpu" in result.stderr and "Traceback" not in result.output
