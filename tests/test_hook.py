"""attntrace.on_trace_ready as torch.profiler calls it: the trace is written and linted at once, findings go
to stderr, and fail_on raises FindingsError naming them."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import sample

import attntrace

NAIVE = sample("bf16_causal_fwd/naive")


def test_hook_module_does_not_import_torch():
    code = "import sys, attntrace; attntrace.on_trace_ready('x'); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_profiler_of_a_tiny_model_writes_and_lints_its_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    hook = attntrace.on_trace_ready(tmp_path / "traces", fail_on="warning", worker_name="w0", use_gzip=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1),
                                on_trace_ready=hook) as prof:
        for _ in range(3):
            model(torch.randn(8, 16)).sum().backward()
            prof.step()
    written = sorted((tmp_path / "traces").iterdir())
    assert len(written) == 1 and written[0].name.startswith("w0.") and written[0].name.endswith(".pt.trace.json.gz")
    assert gzip.decompress(written[0].read_bytes()).lstrip().startswith(b"{")
    (report,) = hook.reports
    (trace,) = report.traces
    assert trace.ok and trace.path == str(written[0]) and trace.steps == 2
    assert {s["reason"] for s in report.skipped} >= {"no GPU events (kernels, memcpy, memset) in the trace"}
    assert str(written[0]) in capsys.readouterr().err  # the findings text went to stderr


class ExportsATraceWithAHiddenCopy:
    """Stands in for a CUDA profile (CI has no GPU): exports a real GPU trace whose forward makes a copy."""

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_bytes(gzip.decompress(Path(NAIVE).read_bytes()))


def test_fail_on_raises_naming_the_findings(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    hook = attntrace.on_trace_ready(tmp_path, fail_on="warning")
    with pytest.raises(attntrace.FindingsError) as caught:
        hook(ExportsATraceWithAHiddenCopy())
    assert "AT102" in str(caught.value) and "masked_fill" in str(caught.value)
    # One cause: the unfused attention; the copy its masked_fill makes is inside it.
    assert {f.rule for f in caught.value.findings} == {"AT102"}
    assert [c.rule for f in caught.value.findings for c in f.consequences] == ["AT101"]
    assert "AT101" in capsys.readouterr().err
    # Below the threshold, or selected away, it only prints.
    attntrace.on_trace_ready(tmp_path, fail_on="error")(ExportsATraceWithAHiddenCopy())
    attntrace.on_trace_ready(tmp_path, fail_on="warning", ignore=["AT101", "AT102"])(ExportsATraceWithAHiddenCopy())
    assert len(list(tmp_path.iterdir())) == 3


def test_fail_on_is_checked_when_the_hook_is_made():
    with pytest.raises(ValueError, match="fail_on"):
        attntrace.on_trace_ready("traces", fail_on="warnings")
