"""Progress goes to stderr only when stderr is a terminal: CI logs and pipes stay clean."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import SAMPLES

from attntrace.cli import main
from attntrace.formats import progress


def test_lint_prints_no_progress_when_stderr_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(progress, "LARGE_BYTES", 0)  # every run is large enough for progress on a terminal
    result = CliRunner().invoke(main, ["lint", str(SAMPLES / "workloads"), "--format", "json", "--fail-on", "never"])
    assert result.exit_code == 0 and result.stderr == ""


def test_lint_progress_counts_files_and_bytes_on_a_terminal(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]):
    monkeypatch.setattr(progress, "_terminal", lambda: True)
    monkeypatch.setattr(progress, "LARGE_BYTES", 0)
    folder = str(SAMPLES / "workloads")
    with progress.file_progress([folder]) as advance:
        assert advance is not None
        from attntrace import api

        api.lint(folder, timelines=False, progress=advance)
    err = capsys.readouterr().err
    assert "/4 files" in err and "lint:" in err and "B/s" in err


def test_small_inputs_get_no_bar_even_on_a_terminal(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(progress, "_terminal", lambda: True)
    with progress.file_progress([str(SAMPLES / "workloads")]) as advance:
        assert advance is None


def test_run_progress_off_a_terminal_keeps_only_failures(capsys: pytest.CaptureFixture[str]):
    with progress.run_progress(2) as report:
        report("[1/2] naive")
        report("    failed: out of memory")
    assert capsys.readouterr().err == "failed: out of memory\n"
