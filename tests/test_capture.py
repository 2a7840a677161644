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
    for name in ("sdpa_flash", "triton", "compiled"):
        assert status[name]["status"] == "skipped" and "cuda" in status[name]["reason"]
    assert "naive" in result.output and "vs naive" in result.output


def test_unsupported_combinations_are_skipped_with_reason():
    from attntrace.capture.variants import VARIANTS, Shape, unsupported_reason

    shape = Shape(1, 1, 64, 64)
    cpu = torch.device("cpu")
    assert "cuda" in unsupported_reason(VARIANTS["sdpa_flash"], cpu, torch.bfloat16, shape, False)
    assert unsupported_reason(VARIANTS["naive"], cpu, torch.float32, shape, True) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_run_all_variants_on_gpu(tmp_path: Path):
    result = CliRunner().invoke(main, ["run", "--seq", "512", "--steps", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = orjson.loads((tmp_path / "run.json").read_bytes())
    assert all(v["status"] != "failed" for v in report["variants"])
