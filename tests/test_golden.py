"""Every sample trace's findings match the reviewed golden file (sample_traces/golden_findings.json).
A change in any rule's output on real traces shows up here; regenerate with tests/update_golden.py.
Findings are pinned exactly (rule, severity, where, fingerprint); numbers within a tolerance, so that a change
in rounding does not force a rewrite."""

from __future__ import annotations

import orjson
import pytest
from conftest import impact_problems
from update_golden import GOLDEN, current

from attntrace.report import all_findings

NUMBERS = ("gpu_us_per_step",)


def _pinned(findings: list[dict]) -> list[dict]:
    return [{k: v for k, v in f.items() if k not in NUMBERS} for f in findings]


def test_findings_match_golden_file(samples_report: dict):
    now, golden = current(samples_report), orjson.loads(GOLDEN.read_bytes())
    assert sorted(now) == sorted(golden)
    for trace in golden:
        assert _pinned(now[trace]) == _pinned(golden[trace]), trace
        for new, old in zip(now[trace], golden[trace], strict=True):
            for key in NUMBERS:
                assert new[key] == pytest.approx(old[key], rel=0.01, abs=0.5), (trace, new["rule"], key)


def test_impacts_never_add_up_to_more_than_the_step(samples_report: dict):
    """On every sample trace: no finding saves more than its step, nor all of a trace's findings together (AT402
    with AT302/AT501, SDPA's math backend with what runs inside it), and no copy is faster than memory."""
    report = samples_report
    assert {f["rule"] for f in all_findings(report)} >= {"AT202", "AT302", "AT402", "AT501"}
    assert impact_problems(report) == []
