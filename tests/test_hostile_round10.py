"""Hostile inputs, round 10 (issue 43, reliability): what the lint path answered in one line but the commands of
one trace (summary's API, whatif) did not, and environments that polars refuses. Each test failed before its
fix."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, sample

from attntrace import api


def _naive_doc() -> dict:
    return json.loads(gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes()))


def _attntrace(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attntrace", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _deeply_nested(tmp_path: Path) -> Path:
    """A trace one of whose args holds arrays 10,000 deep: msgspec stops with RecursionError."""
    doc = _naive_doc()
    text = json.dumps(doc).replace('"Record function id": 0', '"Record function id": ' + "[" * 10000 + "]" * 10000, 1)
    path = tmp_path / "deep.json"
    path.write_text(text)
    return path


def test_whatif_of_a_trace_nested_too_deeply_is_one_line(tmp_path: Path):
    # It was a RecursionError traceback with exit 1; lint, summary and diff said it in one line.
    path = _deeply_nested(tmp_path)
    result = _attntrace("whatif", str(path))
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"error: {path}: JSON nested too deeply for this reader\n"


def test_the_api_of_one_trace_raises_one_line_for_a_trace_nested_too_deeply(tmp_path: Path):
    path = _deeply_nested(tmp_path)
    for call in (api.summarize, api.whatif):
        with pytest.raises(api.TraceReadError) as raised:
            call(path)
        assert str(raised.value) == f"{path}: JSON nested too deeply for this reader"


@pytest.mark.parametrize("threads", ["0", "100000"])
def test_a_thread_count_polars_cannot_run_is_one_line_before_any_work(threads: str):
    # 0 was a Rust panic and a Python traceback with exit 1; 100000 never finished a 36 KB trace (SIGTERM ignored
    # while polars started its threads).
    result = _attntrace("lint", sample("bf16_causal_fwd/naive"), env={"POLARS_MAX_THREADS": threads}, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: POLARS_MAX_THREADS={threads} is not a number of threads polars can run")
    assert result.stderr.count("\n") == 1 and not result.stdout


@pytest.mark.parametrize("threads", ["1", "3", "auto"])
def test_a_thread_count_polars_runs_or_passes_over_is_left_to_it(threads: str):
    result = _attntrace("lint", sample("bf16_causal_fwd/naive"), "--format", "json",
                        env={"POLARS_MAX_THREADS": threads})
    assert result.returncode in (0, 1), result.stderr
    assert json.loads(result.stdout)["summary"]["traces"] == 1
