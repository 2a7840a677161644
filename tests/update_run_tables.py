"""Bring the findings column of every sample run (run.json: each variant's numbers and the table) up to what
`attntrace lint` says of its trace today; everything else stays as `attntrace run` captured it on the GPU:

    python tests/update_run_tables.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent


def runs() -> list[Path]:
    # A run's report has its variants; a from-trace run's top-level report (its sites) has none of its own.
    return sorted(p for p in (ROOT / "sample_traces").rglob("run.json") if "variants" in orjson.loads(p.read_bytes()))


def findings_now(path: Path) -> dict[str, str]:
    """Variant -> its findings column ("2W 1I", "none") from linting its trace now."""
    from attntrace.model.loading import load
    from attntrace.report.compare import finding_counts

    report = orjson.loads(path.read_bytes())
    return {v["name"]: finding_counts(load(str(path.parent / v["trace"]))) for v in report.get("variants", [])
            if v.get("trace") and "findings" in (v.get("numbers") or {})}


def relinted(path: Path) -> dict[str, Any]:
    report = orjson.loads(path.read_bytes())
    now = findings_now(path)
    for variant in report.get("variants", []):
        if variant["name"] in now:
            variant["numbers"]["findings"] = now[variant["name"]]
    for row in report.get("table") or []:
        if row.get("variant") in now:
            row["findings"] = now[row["variant"]]
    return report


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for path in runs():
        path.write_bytes(orjson.dumps(relinted(path), option=orjson.OPT_INDENT_2) + b"\n")
        print(path)
