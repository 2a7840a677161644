"""Every trace written by other people (AMD, A100, V100, 2020-era, CPU-only) is linted or refused in one line."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import impact_problems

from attntrace.cli import main


def test_corpus_lints_without_crash(corpus_files):
    for path in corpus_files:
        for command in (["lint", "--format", "json"], ["summary", "--format", "json"]):
            result = CliRunner().invoke(main, [*command, str(path)])
            assert result.exception is None or isinstance(result.exception, SystemExit), (path, result.exception)
            assert result.exit_code in (0, 1, 2), path
            if result.exit_code == 2:
                assert result.stderr.strip().count("\n") == 0
            else:
                orjson.loads(result.stdout)


WILD = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "wild"


def _wild_files() -> list[tuple[str, str]]:
    sources = WILD / "SOURCES.tsv"
    if not sources.exists():
        return []
    rows = [line.split("\t") for line in sources.read_text().splitlines()[1:] if line.strip()]
    return [(row[0], row[5]) for row in rows]


@pytest.mark.parametrize(("name", "kind"), _wild_files() or [pytest.param("", "", marks=pytest.mark.skip(
    reason="../shared/corpus/wild is absent"))])
def test_wild_corpus_file_is_analysed_or_refused_in_one_line(name: str, kind: str):
    result = CliRunner().invoke(main, ["lint", "--format", "json", str(WILD / name)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    if kind.startswith("Kineto"):
        assert result.exit_code in (0, 1), result.stderr
        report = orjson.loads(result.stdout)
        assert report["traces"][0]["summary"]["per_step"] is not None
        assert impact_problems(report) == []
    else:
        assert result.exit_code in (0, 1, 2)
        if result.exit_code == 2:
            assert result.stderr.strip().count("\n") == 0 and name.split("/")[-1] in result.stderr
