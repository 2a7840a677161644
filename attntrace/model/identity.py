"""A trace's identity across runs, which its findings' fingerprints are made of (baselines and `diff` use one).

A trace is known by its path relative to the directory (or quoted pattern's directory) it was found under, or
by its file name when it was named on its own, so that `lint traces/` today and `lint traces/` or
`lint new_traces/` tomorrow name each trace the same, and two traces of one run never share a name:
`bf16/naive.pt.trace.json` and `fp32/naive.pt.trace.json` are two traces. In the file name, digit runs are
folded (`host_4242.1733071234567.pt.trace.json` -> `host_#.#`: tensorboard_trace_handler's pid and
timestamp change with every capture), except a rank's number (`rank3`), and extensions are dropped. A trace
that knows its rank (Kineto's distributedInfo) and has none in its name gets `@rank{N}`."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)", re.IGNORECASE)
_DIGITS_OR_RANK = re.compile(r"(rank[_\-.]?)(\d+)|\d+", re.IGNORECASE)
_SUFFIXES = (".gz", ".json", ".trace", ".pt")


def _fold(name: str) -> str:
    for suffix in _SUFFIXES:
        name = name.removesuffix(suffix)
    return _DIGITS_OR_RANK.sub(lambda m: m.group(0) if m.group(1) else "#", name)


def _within(path: str, root: str) -> str | None:
    """`path` relative to the directory `root`, or None when it is not under it."""
    top = root.rstrip("/") + "/"
    if root in ("", ".", "./"):
        return path.removeprefix("./")
    return path[len(top):] if path.startswith(top) else None


def trace_label(path: str, roots: tuple[str, ...] = (), rank: int | None = None) -> str:
    """The trace's identity: see the module's docstring."""
    relative = next((r for r in map(lambda root: _within(path, root), sorted(roots, key=len, reverse=True))
                     if r), None)
    parts = PurePosixPath(relative if relative else PurePosixPath(path).name).parts or ("",)
    label = "/".join([*parts[:-1], _fold(parts[-1])])
    if rank is not None and not RANK_IN_NAME.search(parts[-1]):
        label += f"@rank{rank}"
    return label


def job_label(path: str) -> str:
    """The file name with every digit run folded, rank numbers too: the traces of one job's ranks share it."""
    return re.sub(r"\d+", "#", _fold(PurePosixPath(path).name))
