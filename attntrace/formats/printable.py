"""Strings of a result made safe to print: undecodable file-name bytes escaped for every format, and control
characters escaped where a value must not start a line of its own (a terminal, a Markdown page)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attntrace.model.loading import display_path


def shown(text: str) -> str:
    """A path or message as one printable line: undecodable bytes and control characters escaped."""
    text = display_path(text)
    if text.isprintable():  # nearly every string: checked in C, not one Python call per character
        return text
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def _strings(value: Any, change: Callable[[str], str]) -> Any:
    """A result with `change` applied to every string in it, keys included."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {_strings(k, change): _strings(v, change) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strings(v, change) for v in value]
    return value


def escaped(value: Any) -> Any:
    """A result with undecodable file-name bytes in its strings escaped, so that every format can encode it."""
    return _strings(value, display_path)


def printable(value: Any) -> Any:
    """A result for a terminal or a Markdown page: control characters in its strings (a file name can hold a
    newline or an escape sequence) escaped, so that no value can start a line of its own."""
    return _strings(value, shown)
