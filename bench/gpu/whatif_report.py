"""The predicted wall saving of each cause beside the timed one, for the cases of bench/gpu/whatif_cases.py.

    python bench/gpu/whatif_report.py OUT_DIR [--markdown]

For each case it reads OUT_DIR/CASE.json (the step timed without the profiler before and after the fix) and
OUT_DIR/CASE.shapes.pt.trace.json.gz (the step before the fix, captured with record_shapes), and predicts the
saving two ways: `attntrace whatif` with the change that the fix makes, and the wall saving of the finding that
names the cause (the rule in RULES). A prediction is within the bar when it is within 25% of the timed saving, or
within 1% of the step where the timed saving is under 4% of it.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from tabulate import tabulate

from attntrace.api import lint, whatif

# case -> the change `attntrace whatif` makes for its fix, and the rule whose finding names the cause.
CHANGES: dict[str, tuple[dict[str, Any], str | None]] = {
    "resnet_pageable_item": ({"drop_syncs": True, "pin_copies": True}, "AT302"),
    "resnet_pageable": ({"pin_copies": True}, "AT302"),
    "resnet_item": ({"drop_syncs": True}, "AT302"),
    "mlp_micro_item": ({"drop_syncs": True}, "AT302"),
    "finite_check": ({"drop_syncs": True}, "AT302"),
    "masked_nonzero": ({"drop_syncs": True}, "AT302"),
    "decode_graph": ({"graph": True}, "AT501"),
    "tiny_ops_graph": ({"graph": True}, "AT501"),
    "loader_on_path": ({"offload_loader": True, "pin_copies": True}, "AT402"),
    "moe_routing": ({"drop_syncs": True}, "AT302"),
    "compiled_item": ({"drop_syncs": True}, "AT302"),
    "fp32_vs_tf32": ({"speedup": {"gemm_fp32_simt": 4.0}}, "AT201"),
    "unfused_vs_sdpa": ({}, "AT102"),
    "big_gemm_item": ({"drop_syncs": True}, "AT302"),
    "gpt2_item": ({"drop_syncs": True}, "AT302"),
}


def within(predicted: float, timed: float, step: float) -> bool:
    if timed < 0.04 * step:
        return abs(predicted - timed) <= 0.01 * step
    return abs(predicted - timed) <= 0.25 * timed


def finding_saving(trace: str, rule: str | None) -> float | None:
    """The wall saving of the rule's findings on the trace (every cause and consequence of that rule summed: one
    program, one fix), ms per step; None when the rule found nothing."""
    if rule is None:
        return None
    report = lint(trace, select=[rule]).to_json()
    report = json.loads(report) if isinstance(report, str | bytes) else report
    walls = []
    for finding in report["findings"]:
        for f in [finding, *finding.get("consequences", [])]:
            if f["rule"] == rule and f["impact"].get("wall_us_per_step") is not None:
                walls.append(f["impact"]["wall_us_per_step"])
    return max(walls) / 1e3 if walls else None


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    rows = []
    hits = total = 0
    for case, (change, rule) in CHANGES.items():
        timing = out / f"{case}.json"
        trace = out / f"{case}.shapes.pt.trace.json.gz"
        if not timing.exists() or not trace.exists():
            rows.append([case, "-", "-", "-", "-", "-", "not captured"])
            continue
        timed = json.loads(timing.read_text())
        before, after = statistics.median(timed["before_ms"]), statistics.median(timed["after_ms"])
        saved = before - after
        replayed = whatif(str(trace), **change)["devices"][0] if change else None
        predicted = replayed["saved_us"] / 1e3 if replayed else None
        by_finding = finding_saving(str(trace), rule)
        best = by_finding if by_finding is not None else predicted
        ok = best is not None and within(best, saved, before)
        hits += ok
        total += 1
        spread = f"{min(timed['before_ms']):.2f}-{max(timed['before_ms']):.2f} / " \
                 f"{min(timed['after_ms']):.2f}-{max(timed['after_ms']):.2f}"
        rows.append([case, f"{before:.2f} -> {after:.2f}", spread, f"{saved:.2f}",
                     "-" if predicted is None else f"{predicted:.2f}",
                     "-" if by_finding is None else f"{by_finding:.2f} ({rule})", "yes" if ok else "no"])
    headers = ["case", "timed step ms (before -> after)", "spread ms", "timed saving ms", "whatif ms",
               "finding's wall saving ms", "within bar"]
    print(tabulate(rows, headers=headers, tablefmt="github" if "--markdown" in argv else "simple",
                   disable_numparse=True))
    print(f"\n{hits} of {total} within the bar")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
