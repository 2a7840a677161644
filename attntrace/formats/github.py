"""GitHub Actions workflow commands: one annotation per cause (and per unreadable trace), its consequences in its
text. With a baseline, causes it already holds are notices marked known, so that a pull request's warnings and
errors are its own. GitHub shows at most 10 annotations of each level per step, so past 9 the rest of a level
are folded into one annotation that lists them."""

from __future__ import annotations

from typing import Any

COMMAND = {"error": "error", "warning": "warning", "info": "notice"}
SHOWN_PER_LEVEL = 9  # GitHub keeps 10 annotations per level and step: the 10th tells what was folded


def _data(text: str) -> str:
    # Control characters other than CR/LF (which are encoded) shown escaped: an ESC or a right-to-left mark in a
    # name or file name from the trace must not reach the log as it is.
    shown = "".join(c if c.isprintable() or c in "\r\n" else repr(c)[1:-1] for c in text)
    return shown.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def render(report: dict[str, Any]) -> str:
    lines = []
    for trace in report["traces"]:
        if trace["error"]:
            lines.append(f"::error file={_prop(trace['path'])},title=attntrace::{_data(trace['error']['message'])}")
    by_level: dict[str, list[dict[str, Any]]] = {}
    for f in report["findings"]:
        known = f.get("baseline") == "known"
        by_level.setdefault("notice" if known else COMMAND[f["severity"]], []).append(f)
    for level in ("error", "warning", "notice"):
        found = by_level.get(level, [])
        shown = found if len(found) <= SHOWN_PER_LEVEL + 1 else found[:SHOWN_PER_LEVEL]
        for f in shown:
            lines.append(_annotation(level, f))
        rest = found[len(shown):]
        if rest:
            listed = "\n".join(f"{f['rule']} {f['name']}: {f['message']} [{f['trace']}]" for f in rest)
            lines.append(f"::{level} title={_prop(f'attntrace: {len(rest)} more {level}s')}::"
                         f"{_data(listed)}")
    return "\n".join(lines) + ("\n" if lines else "")


def _annotation(level: str, f: dict[str, Any]) -> str:
    source = f["where"].get("source")
    place = f"file={_prop(source['file'])},line={source['line']}" if source else f"file={_prop(f['trace'])}"
    known = f.get("baseline") == "known"
    title = _prop(f"{f['rule']} {f['name']}" + (" (known: in the baseline)" if known else ""))
    text = f"{f['message']} [{f['trace']}]\nFix: {f['fix']}"
    for c in f.get("consequences", ()):
        text += f"\nIncludes {c['rule']} {c['name']} (counted in this cause): {c['message']}"
    return f"::{level} {place},title={title}::{_data(text)}"
