"""`attntrace lint` for a terminal: findings grouped per trace, colour only when stdout is a TTY."""

from __future__ import annotations

from typing import Any

import click

COLOURS = {"error": "red", "warning": "yellow", "info": "cyan"}
KERNEL_WIDTH = 160  # templated kernel names run to thousands of characters: the head tells them apart


def _finding(f: dict[str, Any], style: Any, stepped: bool = True) -> list[str]:
    """A finding's lines; `stepped` False for a trace without steps, whose numbers are for the whole trace."""
    impact = f["impact"]
    sev = style(f"{f['severity']:<7}", fg=COLOURS[f["severity"]], bold=True)
    known = {"known": " (known)", "new": " (new)"}.get(f.get("baseline", ""), "")
    lines = [f"  {style(f['rule'], bold=True)} {sev} {f['message']}{known}"]
    where = f["where"]
    if where.get("op_chain"):
        lines.append(f"      where: {where['op_chain']}")
    if where.get("kernel"):
        kernel = where["kernel"]
        lines.append(f"      kernel: {kernel if len(kernel) <= KERNEL_WIDTH else kernel[:KERNEL_WIDTH - 3] + '...'}")
    if where.get("source"):
        source = where["source"]
        lines.append(f"      source: {source['file']}:{source['line']} ({source.get('function') or '?'})")
    if impact["gpu_us_per_step"]:
        spread = f.get("ranks", {}).get("gpu_us_per_step")
        across = (f"; across ranks min {spread['min']:.1f}, median {spread['median']:.1f}, max {spread['max']:.1f} us"
                  if spread else "")
        also = f"; {f['subsumed_by']}'s fix includes this one" if f.get("subsumed_by") else ""
        per, of = ("per step", "of step") if stepped else ("in the trace", "of the trace")
        lines.append(f"      impact: ~{impact['gpu_us_per_step']:.1f} us GPU {per} "
                     f"({100 * impact['share_of_step']:.1f}% {of}){across}{also}")
    lines.append(f"      fix: {f['fix']}")
    return lines


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
        head = f"{style(path, bold=True)}  ({trace['device'] or 'CPU only'}, {trace['steps'] or 'no'} steps"
        head += f", attention: {', '.join(summary.get('attention_backends') or []) or 'none found'})"
        out.append(head)
        for note in summary.get("notes") or []:
            out.append(f"  note: {note}")
        if not found:
            out.append("  no findings")
        for f in found:
            out += _finding(f, style, stepped=bool(trace["steps"]))
        for skip in skipped.get(path, []):
            out.append(style(f"  {skip['rule']} skipped: {skip['reason']}", dim=True))
        out.append("")
    if report.get("job"):
        from attntrace.ranks import render_job

        out += render_job(report["job"])
        for f in report["findings"]:
            out += _finding(f, style)
        for skip in report["skipped"]:
            out.append(style(f"  {skip['rule']} skipped on {skip['ranks']} rank(s): {skip['reason']}", dim=True))
        out.append("")
    if report.get("baseline"):
        b = report["baseline"]
        out.append(f"baseline {b['path']}: {b['new']} new, {b['known']} known, {len(b['fixed'])} fixed")
        out += [f"  fixed: {e['rule']} in {e['trace']}: {e['message']}" for e in b["fixed"]]
    counts = report["summary"]["findings"]
    out.append(f"{report['summary']['traces']} trace(s), {report['summary']['errors']} unreadable; findings: "
               f"{counts['error']} error, {counts['warning']} warning, {counts['info']} info")
    return "\n".join(out) + "\n"
