"""The report's pieces that every layer above the rules shares: one trace's findings (TraceReport), the order of
severities and findings, and the walk over causes and their consequences."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}


@dataclass
class TraceReport:
    path: str
    info: dict[str, Any]
    findings: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    job: dict[str, Any] = field(default_factory=dict)  # rank and step times for --group ranks (ranks.identity)


def promises_nothing(finding: dict[str, Any]) -> bool:
    """An AT402 whose idle is under its threshold without the profiler, or that cannot tell (info): no saving
    a trace's total counts."""
    return bool(finding["evidence"].get("profiler_only") or finding["evidence"].get("undetermined"))


def total_impact(findings: list[dict[str, Any]]) -> float:
    """A trace's saving per step, each GPU microsecond counted once: what fixing every finding that no other fix
    includes would save, leaving out an idle that promises nothing."""
    return round(sum(f["impact"]["gpu_us_per_step"] for f in findings
                     if "subsumed_by" not in f and not promises_nothing(f)), 3)


def sort_key(finding: dict[str, Any]) -> tuple[Any, ...]:
    return (SEVERITY_RANK[finding["severity"]], -finding["impact"]["gpu_us_per_step"], finding["trace"],
            finding["rule"], finding["fingerprint"])


def all_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every finding of a report: its causes and, after each, the consequences nested in it."""
    return [g for f in report["findings"] for g in (f, *f.get("consequences", ()))]


def severity_counts(findings: list[dict[str, Any]]) -> dict[str, int]:
    return {s: sum(1 for f in findings if f["severity"] == s) for s in SEVERITY_RANK}
