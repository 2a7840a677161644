"""Regenerate sample_traces/golden_findings.json from the current rules (review the diff before committing):

    python tests/update_golden.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "sample_traces" / "golden_findings.json"


def sample_paths() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "sample_traces").rglob("*.pt.trace.json.gz"))


def lint_samples() -> dict:
    """The report of every sample trace with the default settings (run from the repository's root)."""
    from attntrace.checks.catalog import load_rules
    from attntrace.report import engine as lint

    return lint.run(sample_paths(), lint.default_settings(load_rules()))


def current(report: dict | None = None) -> dict[str, list[dict]]:
    """Each sample's findings as the golden file pins them, from `report` (lint_samples') or a new lint."""
    from attntrace.report import all_findings

    report = report if report is not None else lint_samples()
    out: dict[str, list[dict]] = {t: [] for t in sample_paths()}
    for f in all_findings(report):
        out[f["trace"]].append({"rule": f["rule"], "severity": f["severity"], "op_chain": f["where"]["op_chain"],
                                "kernel": f["where"]["kernel"], "steps": f["where"]["steps"],
                                "device": f["where"].get("device"), "fingerprint": f["fingerprint"],
                                "subsumed_by": f.get("subsumed_by"),
                                "gpu_us_per_step": f["impact"]["gpu_us_per_step"]})
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    GOLDEN.write_bytes(orjson.dumps(current(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    print(GOLDEN)
