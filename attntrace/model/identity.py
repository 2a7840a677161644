"""A trace's identity across runs, which its findings' fingerprints are made of (baselines and `diff` use one).

A trace is known by its path as given (relative to the working directory when it lies under it), so that
`lint traces/` run again after a re-capture names each trace the same, and two traces never share a name:
`bf16/naive.pt.trace.json` and `fp32/naive.pt.trace.json` are two traces. In the file name, digit runs are
folded (`host_4242.1733071234567.pt.trace.json` -> `host_#.#`: tensorboard_trace_handler's pid and
timestamp change with every capture), except a rank's number (`rank3`), and extensions are dropped. A trace
that knows its rank (Kineto's distributedInfo) and has none in its name gets `@rank{N}`. `diff` pairs two
traces by their names under the two directories it compares and gives both one name, so that it and a
baseline agree on what is the same finding."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import PurePosixPath

RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)", re.IGNORECASE)
_DIGITS_OR_RANK = re.compile(r"(rank[_\-.]?)(\d+)|\d+", re.IGNORECASE)
_SUFFIXES = (".gz", ".json", ".trace", ".pt")


def _fold(name: str) -> str:
    for suffix in _SUFFIXES:
        name = name.removesuffix(suffix)
    return _DIGITS_OR_RANK.sub(lambda m: m.group(0) if m.group(1) else "#", name)


def trace_label(path: str, rank: int | None = None) -> str:
    """The trace's identity: see the module's docstring."""
    shown = path
    if os.path.isabs(path):
        with contextlib.suppress(ValueError):
            relative = os.path.relpath(path)
            shown = path if relative.startswith("..") else relative
    parts = PurePosixPath(shown.removeprefix("./")).parts or ("",)
    label = "/".join([*parts[:-1], _fold(parts[-1])])
    if rank is not None and not RANK_IN_NAME.search(parts[-1]):
        label += f"@rank{rank}"
    return label


def job_label(path: str) -> str:
    """The file name with every digit run folded, rank numbers too: the traces of one job's ranks share it."""
    return re.sub(r"\d+", "#", _fold(PurePosixPath(path).name))
