"""A compact Markdown report for a pull-request comment: a summary table per trace, then the findings."""

from __future__ import annotations

import re
from typing import Any

from tabulate import tabulate

ICON = {"error": "🔴", "warning": "🟡", "info": "🔵"}


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.3f}"


def render(report: dict[str, Any]) -> str:
    counts = report["summary"]["findings"]
    out = [f"## attntrace: {counts['error']} error, {counts['warning']} warning, {counts['info']} info "
           f"in {report['summary']['traces']} trace(s)", ""]
    rows = []
    for t in report["traces"]:
        if t["error"]:
            rows.append([_code(t["path"]), "unreadable: " + _cell(t["error"]["message"]), "", "", "", "", ""])
            continue
        s = t["summary"]
        steps = s["per_step"] or [{}]
        busy = sum(r.get("gpu_busy_us", 0.0) for r in steps) / len(steps)
        share = s["tensor_core_share_of_gemm"]
        found = [f for f in report["findings"] if f["trace"] == t["path"]]
        rows.append([_code(t["path"]), t["device"] or "CPU", t["steps"] or "-", _ms(busy),
                     s["kernels"], s["memcpy"], "-" if share is None else f"{100 * share:.0f}%",
                     " ".join(f"{ICON[sev]}{sum(f['severity'] == sev for f in found)}" for sev in ICON)])
    out.append(tabulate(rows, headers=["trace", "device", "steps", "GPU ms/step", "kernels", "memcpy",
                                       "tensor-core GEMM", "findings"], tablefmt="github"))
    if report["findings"]:
        out += ["", "| | rule | finding | saves/step | fix |", "|---|---|---|---|---|"]
        for f in report["findings"]:
            status = " (new)" if f.get("baseline") == "new" else ""
            where = f["where"].get("op_chain") or f["where"].get("kernel") or ""
            source = f["where"].get("source")
            at = " at " + _code(f"{source['file']}:{source['line']}") if source else ""
            out.append(f"| {ICON[f['severity']]} | {f['rule']} {f['name']}{status} | {_cell(f['message'])}"
                       f"<br>{_code(where)}{at} in {_code(f['trace'])} | {f['impact']['gpu_us_per_step']:.0f} us "
                       f"| {_cell(f['fix'])} |")
    baseline = report.get("baseline")
    if baseline and baseline["fixed"]:
        out += ["", f"Fixed since the baseline: {len(baseline['fixed'])}"]
        out += [f"- {e['rule']} in {_code(e['trace'])}: {_cell(e['message'])}" for e in baseline["fixed"]]
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """A code span that holds any name: fenced with one more backtick than the longest run in it (CommonMark),
    its pipes escaped so that a table cell stays one cell."""
    if not text:
        return ""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{_cell(text)}{pad}{fence}"
