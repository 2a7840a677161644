"""`lint --format parquet`: one row per finding per trace with the documented, stable columns; the same
report gives the same bytes."""

from __future__ import annotations

from pathlib import Path

import orjson
import polars as pl
from click.testing import CliRunner
from conftest import SAMPLES

from attntrace.cli import main
from attntrace.formats.parquet import COLUMNS

TRACES = str(SAMPLES / "bf16_causal_fwd")


def _lint(*args: str) -> bytes:
    result = CliRunner().invoke(main, ["lint", TRACES, "--fail-on", "never", *args])
    assert result.exit_code == 0, result.stderr
    return result.stdout_bytes


def test_one_row_per_finding_with_the_documented_columns(tmp_path: Path):
    out = tmp_path / "findings.parquet"
    _lint("--format", "parquet", "--output", str(out))
    table = pl.read_parquet(out)
    assert dict(table.schema) == COLUMNS
    report = orjson.loads(_lint("--format", "json"))
    every = [g for f in report["findings"] for g in (f, *f.get("consequences", ()))]
    assert table.height == len(every) > len(report["findings"]) > 0
    assert table["fingerprint"].to_list() == [f["fingerprint"] for f in every]
    first = report["findings"][0]
    assert orjson.loads(table["evidence"][0]) == orjson.loads(orjson.dumps(first["evidence"]))
    assert set(table["job"].to_list()) >= {"naive", "sdpa_math"}


def test_the_same_report_gives_the_same_bytes(tmp_path: Path):
    paths = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    for path in paths:
        _lint("--format", "parquet", "--output", str(path))
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_no_findings_is_an_empty_table_with_the_columns(tmp_path: Path):
    out = tmp_path / "none.parquet"
    result = CliRunner().invoke(main, ["lint", str(SAMPLES / "bf16_causal_fwd" / "sdpa.pt.trace.json.gz"),
                                       "--format", "parquet", "--output", str(out), "--fail-on", "never"])
    assert result.exit_code == 0
    table = pl.read_parquet(out)
    assert table.height == 0 and dict(table.schema) == COLUMNS
