"""Every trace written by other people (AMD, A100, V100, 2020-era, CPU-only) is linted or refused in one line."""

from __future__ import annotations

import orjson
from click.testing import CliRunner

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
