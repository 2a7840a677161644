"""`attntrace lint` for a terminal: findings grouped per trace, colour only when stdout is a TTY."""

from __future__ import annotations

import shutil
import textwrap
from typing import Any

import click

from attntrace.checks.base import fmt_ms

COLOURS = {"error": "red", "warning": "yellow", "info": "cyan"}
INDENT = " " * 6


def width() -> int:
    """The terminal's width, or 100 columns when the output is not a terminal (a file, a pipe, CI's log)."""
    return max(60, shutil.get_terminal_size((100, 24)).columns)


def _wrapped(label: str, text: str) -> list[str]:
    return textwrap.wrap(f"{label}{text}", width(), initial_indent=INDENT, subsequent_indent=INDENT + "  ",
                         break_long_words=False, break_on_hyphens=False) or [INDENT + label]


def attention_text(summary: dict[str, Any], findings: list[dict[str, Any]]) -> str:
    """The trace's attention: its SDPA backends or fused kernels, else "unfused (AT102)" where AT102 found a chain
    ("none found" beside AT102's unfused-attention finding contradicted it)."""
    backends = summary.get("attention_backends") or (
        ["unfused (AT102)"] if any(f["rule"] == "AT102" for f in findings) else [])
    return ", ".join(backends) or "no SDPA op or fused kernel"


def impact_text(impact: dict[str, Any], stepped: bool = True) -> str:
    """"~1.8 ms gpu time per step (36% of step)": what the fix saves first, in the step's own terms."""
    per, of = ("per step", "of step") if stepped else ("in the trace", "of the trace")
    saving = impact.get("saving") or "gpu time"
    text = f"~{fmt_ms(impact['gpu_us_per_step'])} {saving} {per} ({100 * impact['share_of_step']:.1f}% {of})"
    if impact.get("wall_us_per_step") is not None:  # what the step itself loses: what leaves its critical path
        text += f", wall ~{fmt_ms(impact['wall_us_per_step'])} ({100 * impact.get('wall_share_of_step', 0.0):.1f}%)"
    return text


def _finding(f: dict[str, Any], style: Any, stepped: bool = True) -> list[str]:
    """A cause's lines: one headline (known/new, rule, severity, impact, name), then the message, where it is,
    the assumption and the fix on the lines under it, then the consequences its fix also removes."""
    impact = f["impact"]
    sev = style(f"{f['severity']:<7}", fg=COLOURS[f["severity"]], bold=True)
    known = {"known": "known ", "new": "new "}.get(f.get("baseline", ""), "")
    saves = impact_text(impact, stepped) if impact["gpu_us_per_step"] else "no saving estimated"
    lines = [f"  {known}{style(f['rule'], bold=True)} {sev} {saves}  {f['name']}"]
    lines += _wrapped("", f["message"])
    where = f["where"]
    if where.get("op_chain") and where["op_chain"] not in f["message"]:
        lines += _wrapped("where: ", where["op_chain"])
    if where.get("kernel"):
        kernel = where["kernel"]
        cut = width() - len(INDENT) - len("kernel: ")
        lines.append(f"{INDENT}kernel: {kernel if len(kernel) <= cut else kernel[:cut - 3] + '...'}")
    if where.get("source"):
        source = where["source"]
        lines.append(f"{INDENT}source: {source['file']}:{source['line']} ({source.get('function') or '?'})")
    spread = f.get("ranks", {}).get("gpu_us_per_step")
    if spread:
        lines.append(f"{INDENT}across ranks: min {fmt_ms(spread['min'])}, median {fmt_ms(spread['median'])}, "
                     f"max {fmt_ms(spread['max'])}")
    if impact.get("assumption"):
        lines += _wrapped("assumes: ", impact["assumption"])
    lines += _wrapped("fix: ", f["fix"])
    for c in f.get("consequences", ()):
        # Two lines at most: what it is and its own size; the cause's fix removes it, its impact is counted above.
        saves = f" ~{fmt_ms(c['impact']['gpu_us_per_step'])}" if c["impact"]["gpu_us_per_step"] else ""
        lines += textwrap.wrap(f"includes {c['rule']} {c['name']}{saves}: {c['message']}", width(),
                               initial_indent=INDENT, subsequent_indent=INDENT + "  ", max_lines=2,
                               placeholder=" ...", break_long_words=False, break_on_hyphens=False)
    return lines


def skipped_line(skips: list[dict[str, Any]], style: Any, suffix: str = "") -> list[str]:
    """Skipped rules on one line, grouped by reason: "skipped: AT101, AT102 (no GPU events); AT302 (...)"."""
    if not skips:
        return []
    reasons: dict[str, list[str]] = {}
    for skip in skips:
        reasons.setdefault(skip["reason"], []).append(skip["rule"])
    text = "; ".join(f"{', '.join(sorted(rules))} ({reason})" for reason, rules in sorted(reasons.items()))
    return [style(f"  skipped{suffix}: {text}", dim=True)]


def render(report: dict[str, Any], colour: bool) -> str:
    def style(text: str, **kw: Any) -> str:
        return click.style(text, **kw) if colour else text

    by_trace: dict[str, list[dict[str, Any]]] = {}
    for finding in report["findings"]:
        by_trace.setdefault(finding["trace"], []).append(finding)
    skipped: dict[str, list[dict[str, Any]]] = {}
    for skip in report["skipped"]:
        skipped.setdefault(skip["trace"], []).append(skip)
    out: list[str] = []
    for trace in report["traces"]:
        path = trace["path"]
        if trace["error"]:
            out.append(f"{style(path, bold=True)}: {style('error', fg='red', bold=True)}: "
                       f"{trace['error']['message']}")
            continue
        found = by_trace.get(path, [])
        summary = trace["summary"] or {}
        if report.get("job"):
            # One job: a line per rank would bury the verdict; its findings follow once, below.
            out += [f"{style(path, bold=True)}: note: {note}" for note in summary.get("notes") or []]
            continue
        steps = _count(trace["steps"], "step") if trace["steps"] else "no steps"
        head = f"{style(path, bold=True)}  ({trace['device'] or 'CPU only'}, {steps}"
        head += f", attention: {attention_text(summary, found)})"
        out.append(head)
        for note in summary.get("notes") or []:
            out.append(f"  note: {note}")
        if not found:
            out.append("  no findings")
        for f in found:
            out += _finding(f, style, stepped=bool(trace["steps"]))
        out += skipped_line(skipped.get(path, []), style)
        out.append("")
    if report.get("job"):
        from attntrace.report.ranks import render_job

        out += render_job(report["job"])
        for f in report["findings"]:
            out += _finding(f, style)
        for ranks_skipped in sorted({s["ranks"] for s in report["skipped"]}):
            out += skipped_line([s for s in report["skipped"] if s["ranks"] == ranks_skipped], style,
                                f" on {ranks_skipped} rank(s)")
        out.append("")
    if report.get("baseline"):
        b = report["baseline"]
        out.append(f"baseline {b['path']}: {b['new']} new, {b['known']} known, {len(b['fixed'])} fixed")
        out += [f"  fixed: {e['rule']} in {e['trace']}: {e['message']}" for e in b["fixed"]]
        out += [f"  not judged (the trace is incomplete): {e['rule']} in {e['trace']}: {e['message']}"
                for e in b.get("not_judged", ())]
    counts = report["summary"]["findings"]
    nested = report["summary"].get("consequences", 0)
    out.append(f"{report['summary']['traces']} trace(s), {report['summary']['errors']} unreadable; causes: "
               f"{counts['error']} error, {counts['warning']} warning, {counts['info']} info"
               + (f" ({_count(nested, 'consequence')} inside them)" if nested else ""))
    return "\n".join(out) + "\n"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
