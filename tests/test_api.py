"""The Python API as a notebook or a script calls it: attntrace.lint, attntrace.summarize, typed findings,
Report.to_json/to_polars/_repr_html_, and an `import attntrace` that stays light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import SAMPLES, sample

import attntrace
from attntrace.cli import main

NAIVE = sample("bf16_causal_fwd/naive")


def test_import_is_light_and_never_torch():
    code = ("import sys, attntrace; heavy = {'polars', 'torch', 'plotly', 'tqdm', 'msgspec'} & set(sys.modules); "
            "print(sorted(heavy))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_plain_lint_imports_neither_plotting_nor_torch():
    code = "\n".join([
        "import sys", "from attntrace.cli import main", "try:", f"    main(['lint', {NAIVE!r}, '--format', 'json'])",
        "except SystemExit:", "    pass",
        "sys.stderr.write(str(sorted({'plotly', 'torch', 'tqdm'} & set(sys.modules))))"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stderr.strip() == "[]"


def test_lint_returns_typed_findings_and_the_cli_json_byte_for_byte():
    report = attntrace.lint(SAMPLES / "bf16_causal_fwd")
    assert isinstance(report, attntrace.Report)
    assert all(isinstance(f, attntrace.Finding) for f in report.findings)
    # The hidden copy is a consequence of the unfused attention: inside that cause, typed too.
    assert "AT101" not in {f.rule for f in report.findings}
    hidden = next(c for f in report.findings for c in f.consequences if c.rule == "AT101")
    assert hidden.severity == "warning" and hidden.op_chain == "aten::masked_fill > aten::clone > aten::copy_"
    assert hidden.steps == [1, 2, 3] and hidden.gpu_us_per_step > 0 and "masked_fill_" in hidden.fix
    cli = CliRunner().invoke(main, ["lint", str(SAMPLES / "bf16_causal_fwd"), "--format", "json"])
    assert report.to_json().encode() == cli.stdout_bytes
    assert report.exit_code() == cli.exit_code == 1


def test_select_ignore_and_settings():
    only = attntrace.lint(NAIVE, select=["AT101"])
    assert {f.rule for f in only.findings} == {"AT101"}
    assert "AT101" not in {f.rule for f in attntrace.lint(NAIVE, ignore="hidden-copy").findings}
    # The copy is 256 MiB: a 1 GiB threshold silences it, given either way.
    for settings in ({"AT101.min_bytes": 1 << 30}, {"AT101": {"min_bytes": 1 << 30}}):
        assert "AT101" not in {f.rule for f in attntrace.lint(NAIVE, settings=settings).findings}
    with pytest.raises(Exception, match="nope"):
        attntrace.lint(NAIVE, settings={"AT101.nope": 1})


def test_to_polars_has_one_row_per_finding():
    report = attntrace.lint([NAIVE, sample("bf16_causal_fwd/sdpa_math")])
    frame = report.to_polars()
    every = [g for f in report.findings for g in f.and_consequences()]  # causes, each followed by its consequences
    assert frame.height == len(every) > len(report.findings) >= 2
    assert frame["rule"].to_list() == [f.rule for f in every]
    assert frame.filter(pl.col("cause").is_not_null())["cause"].to_list() == [
        f.fingerprint for f in report.findings for _ in f.consequences]
    assert frame.schema["gpu_us_per_step"] == pl.Float64 and frame.schema["steps"] == pl.List(pl.Int64)
    assert orjson.loads(frame["evidence"][0]) == report.findings[0].evidence
    empty = attntrace.lint(NAIVE, select=["AT203"]).to_polars()
    assert empty.height == 0 and empty.columns == frame.columns


def test_unreadable_input_is_reported_not_raised(tmp_path: Path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"traceEvents": [')
    report = attntrace.lint([bad, NAIVE])
    assert [t.ok for t in report.traces] == [False, True]
    assert report.errors[0].path == str(bad) and report.exit_code() == 2
    assert report.findings  # the readable one is still analysed
    with pytest.raises(attntrace.TraceReadError, match=r"broken\.json"):
        attntrace.summarize(bad)


def test_summarize_matches_the_summary_command():
    summary = attntrace.summarize(NAIVE)
    cli = orjson.loads(CliRunner().invoke(main, ["summary", NAIVE, "--format", "json"]).stdout)["traces"][0]
    assert summary.data == cli
    assert (summary.device, summary.steps, summary.kernels) == ("NVIDIA H200", 3, cli["kernels"])
    per_step = summary.to_polars()
    assert per_step["step"].to_list() == [1, 2, 3] and per_step["gpu_busy_us"].min() > 0


def test_report_renders_in_jupyter_as_the_html_page():
    pytest.importorskip("plotly")
    report = attntrace.lint(NAIVE)
    page = report._repr_html_()
    assert page == report.to_html() and "timeline-0" in page and "AT101" in page


def test_lint_is_the_api_even_after_the_engine_module_is_imported():
    import attntrace.report.engine as engine  # the engine has its own name: it never shadows attntrace.lint

    assert callable(attntrace.lint) and engine.exit_code is not None
    assert isinstance(attntrace.lint(NAIVE), attntrace.Report)


def test_html_without_the_extra_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotly" else real(name, *a))
    result = CliRunner().invoke(main, ["lint", NAIVE, "--format", "html"])
    from attntrace.install import pip_install

    assert result.exit_code == 2 and pip_install("html") in result.stderr and result.stderr.count("\n") == 1
