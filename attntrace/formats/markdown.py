"""A Markdown report that fits a pull-request comment (GitHub refuses one over 65,536 characters): the summary
table, the top causes with their consequences inside them, the rest folded in <details>, and a note of what
did not fit."""

from __future__ import annotations

import os
import re
from typing import Any

from attntrace.checks.base import fmt_ms
from attntrace.report.ranks import render_job

ICON = {"error": "🔴", "warning": "🟡", "info": "🔵"}
COMMENT_LIMIT = 65_536  # GitHub's limit for a comment body, in characters
TOP_CAUSES = 10  # shown as rows of the table; the rest go in <details>
TOP_TRACES = 20  # rows of the trace table shown; the rest go in <details>
TRACE_SHARE = 0.35  # of the comment, at most, for the trace table: the causes are what a reviewer reads


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.3f}"


def render(report: dict[str, Any]) -> str:
    counts = report["summary"]["findings"]
    nested = report["summary"].get("consequences", 0)
    out = [f"## attntrace: {counts['error']} error, {counts['warning']} warning, {counts['info']} info "
           f"in {report['summary']['traces']} trace(s)"
           + (f" ({nested} consequence{'s' * (nested != 1)} inside)" if nested else "")]
    paths = [t["path"] for t in report["traces"]]
    base = _common_folder(paths)
    if base:  # the folder once, not in every row: a deep checkout path pushed every cause out of the comment
        out += ["", f"Paths are relative to {_code(base)}."]
    name = {p: os.path.relpath(p, base) if base else p for p in paths}
    rows = []
    # the traces with the most severe findings first: the table folds after TOP_TRACES rows
    for t in sorted(report["traces"], key=lambda t: _severity_counts(report, t["path"])):
        if t["error"]:
            rows.append(_cells([_code(name[t["path"]]), "unreadable: " + _cell(t["error"]["message"]),
                                "", "", "", "", "", ""]))
            continue
        s = t["summary"]
        steps = s["per_step"] or [{}]
        busy = sum(r.get("gpu_busy_us", 0.0) for r in steps) / len(steps)
        share = s["tensor_core_share_of_gemm"]
        counts = _severity_counts(report, t["path"])
        rows.append(_cells([_code(name[t["path"]]), _cell(t["device"] or "CPU"), str(t["steps"] or "-"), _ms(busy),
                            str(s["kernels"]), str(s["memcpy"]), "-" if share is None else f"{100 * share:.0f}%",
                            " ".join(f"{ICON[sev]}{-n}" for sev, n in zip(ICON, counts, strict=True))]))
    trace_header = ("| trace | device | steps | GPU ms/step | kernels | memcpy | tensor-core GEMM | findings |\n"
                    "|---|---|---|---|---|---|---|---|")
    out += _folded(rows, trace_header, TOP_TRACES, int(TRACE_SHARE * COMMENT_LIMIT), "trace(s)")
    if report.get("job"):  # one job's ranks: its step times per rank and stragglers, as the text report gives
        out += ["", "```", *render_job(report["job"]), "```"]
    tail: list[str] = []
    baseline = report.get("baseline")
    if baseline and baseline["fixed"]:
        tail += ["", f"Fixed since the baseline: {len(baseline['fixed'])}"]
        tail += [f"- {e['rule']} in {_code(e['trace'])}: {_cell(e['message'])}" for e in baseline["fixed"]]
    if baseline and baseline.get("not_judged"):
        tail += ["", f"Not judged (the trace is incomplete): {len(baseline['not_judged'])}"]
        tail += [f"- {e['rule']} in {_code(e['trace'])}: {_cell(e['message'])}" for e in baseline["not_judged"]]
    header = "| | rule | finding | saves/step | fix |\n|---|---|---|---|---|"
    rows_md = [_row(f, name.get(f["trace"], f["trace"])) for f in report["findings"]]
    budget = COMMENT_LIMIT - len("\n".join(out)) - len("\n".join(tail)) - 600  # room for the notes below
    out += _folded(rows_md, header, TOP_CAUSES, budget, "cause(s)")
    out += tail
    return "\n".join(out) + "\n"


def _folded(rows: list[str], header: str, shown: int, budget: int, what: str) -> list[str]:
    """The first `shown` rows as a table, the rest that fit `budget` characters folded in <details>, and a note of
    how many did not fit."""
    fitting: list[str] = []
    used = 2 * len(header)
    for row in rows:
        if used + len(row) + 1 > budget:
            break
        fitting.append(row)
        used += len(row) + 1
    top, folded = fitting[:shown], fitting[shown:]
    out: list[str] = []
    if top:
        out += ["", header, *top]
    if folded:
        out += ["", f"<details><summary>{len(folded)} more {what}</summary>", "", header, *folded, "", "</details>"]
    cut = len(rows) - len(fitting)
    if cut:
        out += ["", f"_{cut} more {what} did not fit in a comment ({COMMENT_LIMIT:,} characters): run "
                    "`attntrace lint --format json` or `--format html` for all of them._"]
    return out


def _common_folder(paths: list[str]) -> str:
    """The folder that holds every trace, when there are several and they share one ("" otherwise)."""
    if len(paths) < 2:
        return ""
    try:
        base = os.path.commonpath([os.path.dirname(p) for p in paths])
    except ValueError:  # absolute and relative paths mixed: no common folder
        return ""
    return "" if base in ("", ".", os.sep) else base


def _severity_counts(report: dict[str, Any], path: str) -> tuple[int, ...]:
    """Minus the trace's findings by severity, error first: an ascending sort puts the worst first."""
    found = [f["severity"] for f in report["findings"] if f["trace"] == path]
    return tuple(-found.count(sev) for sev in ICON)


def _cells(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _row(f: dict[str, Any], trace: str) -> str:
    status = " (new)" if f.get("baseline") == "new" else " (known)" if f.get("baseline") == "known" else ""
    where = f["where"].get("op_chain") or f["where"].get("kernel") or ""
    source = f["where"].get("source")
    at = " at " + _code(f"{source['file']}:{source['line']}") if source else ""
    inside = "".join(f"<br>↳ includes {c['rule']} {c['name']}: {_cell(c['message'])}"
                     for c in f.get("consequences", ()))
    return (f"| {ICON[f['severity']]} | {f['rule']} {f['name']}{status} | {_cell(f['message'])}"
            f"<br>{_code(where)}{at} in {_code(trace)}{inside} | ~{fmt_ms(f['impact']['gpu_us_per_step'])} "
            f"{f['impact'].get('saving') or ''} | {_cell(f['fix'])} |")


def _cell(text: str) -> str:
    """Text in a table cell, outside code spans: one cell and one line, and no HTML or links of the trace's (a name
    with `<!--` in it hid the rest of the comment; one with `[x](http://...)` or `![x](http://...)` made a live link,
    or an image that loaded where the comment was read). Brackets and backticks are escaped as CommonMark allows."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _one_cell(text.replace("[", "\\[").replace("]", "\\]").replace("`", "\\`"))


def _one_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """A code span that holds any name: fenced with one more backtick than the longest run in it (CommonMark),
    its pipes escaped so that a table cell stays one cell."""
    if not text:
        return ""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{_one_cell(text)}{pad}{fence}"
