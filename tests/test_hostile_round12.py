"""Hostile inputs, round 12 (issue 43, reliability). Each test failed before its fix."""

from __future__ import annotations

import gzip
import lzma
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import sample

from attntrace.cli import main


def test_the_command_that_unpacks_a_file_never_names_a_file_that_is_there(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    # `xz -dc a.json.xz > a.json` was offered where a.json is the unpacked trace linted beside it: run as given,
    # the shell empties it first.
    monkeypatch.chdir(tmp_path)
    trace = gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes())
    Path("a.json").write_bytes(trace)
    Path("a.json.xz").write_bytes(lzma.compress(trace))
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", "--format", "json", "a.json.xz", "a.json"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == ["error: a.json.xz: xz-compressed data, not a trace (attntrace reads JSON "
                                          "and gzip): xz -dc a.json.xz > a.unpacked.json"]
    Path("a.unpacked.json").write_bytes(b"")
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", "a.json.xz"])
    assert result.stderr.rstrip().endswith("xz -dc a.json.xz > a.unpacked.1.json")
    assert Path("a.json").read_bytes() == trace
