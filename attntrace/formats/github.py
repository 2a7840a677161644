"""GitHub Actions workflow commands: one annotation per finding (and per unreadable trace)."""

from __future__ import annotations

from typing import Any

COMMAND = {"error": "error", "warning": "warning", "info": "notice"}


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def render(report: dict[str, Any]) -> str:
    lines = []
    for trace in report["traces"]:
        if trace["error"]:
            lines.append(f"::error file={_prop(trace['path'])},title=attntrace::{_data(trace['error']['message'])}")
    for f in report["findings"]:
        source = f["where"].get("source")
        place = f"file={_prop(source['file'])},line={source['line']}" if source else f"file={_prop(f['trace'])}"
        title = _prop(f"{f['rule']} {f['name']}")
        text = _data(f"{f['message']} [{f['trace']}]\nFix: {f['fix']}")
        lines.append(f"::{COMMAND[f['severity']]} {place},title={title}::{text}")
    return "\n".join(lines) + ("\n" if lines else "")
