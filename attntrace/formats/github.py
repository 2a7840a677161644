"""GitHub Actions workflow commands: one annotation per finding (and per unreadable trace). With a baseline,
findings it already holds are notices marked known, so that a pull request's warnings and errors are its own."""

from __future__ import annotations

from typing import Any

COMMAND = {"error": "error", "warning": "warning", "info": "notice"}


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    # Control characters other than CR/LF (which _data encodes) shown escaped: an ESC or a right-to-left mark
    # in a file name must not reach the log as it is.
    shown = "".join(c if c.isprintable() or c in "\r\n" else repr(c)[1:-1] for c in text)
    return _data(shown).replace(":", "%3A").replace(",", "%2C")


def render(report: dict[str, Any]) -> str:
    lines = []
    for trace in report["traces"]:
        if trace["error"]:
            lines.append(f"::error file={_prop(trace['path'])},title=attntrace::{_data(trace['error']['message'])}")
    for f in report["findings"]:
        source = f["where"].get("source")
        place = f"file={_prop(source['file'])},line={source['line']}" if source else f"file={_prop(f['trace'])}"
        known = f.get("baseline") == "known"
        title = _prop(f"{f['rule']} {f['name']}" + (" (known: in the baseline)" if known else ""))
        text = _data(f"{f['message']} [{f['trace']}]\nFix: {f['fix']}")
        lines.append(f"::{'notice' if known else COMMAND[f['severity']]} {place},title={title}::{text}")
    return "\n".join(lines) + ("\n" if lines else "")
