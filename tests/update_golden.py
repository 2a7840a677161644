"""Regenerate sample_traces/golden_findings.json from the current rules (review the diff before committing):

    python tests/update_golden.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "sample_traces" / "golden_findings.json"


def current() -> dict[str, list[dict]]:
    from attntrace import engine as lint
    from attntrace.catalog import load_rules
    from attntrace.report import all_findings

    traces = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "sample_traces").rglob("*.pt.trace.json.gz"))
    report = lint.run(traces, lint.default_settings(load_rules()))
    out: dict[str, list[dict]] = {t: [] for t in traces}
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
