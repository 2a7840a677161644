"""Every sample trace's findings match the reviewed golden file (sample_traces/golden_findings.json).
A change in any rule's output on real traces shows up here; regenerate with tests/update_golden.py."""

from __future__ import annotations

import orjson
import pytest
from update_golden import GOLDEN, ROOT, current


def test_findings_match_golden_file(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(ROOT)  # the golden file names traces relative to the repository
    assert current() == orjson.loads(GOLDEN.read_bytes())
