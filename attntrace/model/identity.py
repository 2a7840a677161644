"""A trace's identity across runs, which its findings' fingerprints are made of (baselines and `diff` use one).

A trace found under a directory given on the command line (or a URL prefix, or a quoted pattern's folder) is
known by that directory's name and its path below it; a trace named on its own by its folder's name and its
file name. So `lint traces/` names each trace the same wherever `traces/` lies (a local folder, its copy in a
bucket, another checkout) and however often its traces are re-captured, two traces of one run never share a
name (`bf16/naive.pt.trace.json` and `fp32/naive.pt.trace.json` are two traces), and `lint traces/x.json`
names x as `lint traces/` does. A file name's digit runs are folded, and a folder's runs of 4 digits or more
(`host_4242.1733071234567.pt.trace.json` in `run_20261201/` is `run_#/host_#.#`: tensorboard_trace_handler's
pid and timestamp, and dated folders, change with every capture; `site-2/` and `bf16/` stay), except a rank's
number (`rank3`), and trace extensions are dropped. A trace that knows its
rank (Kineto's distributedInfo) and has none in its name gets `@rank{N}`. `diff` gives the two traces of a
pair one name, so that it and a baseline agree on what is the same finding."""

from __future__ import annotations

import os
import re
from pathlib import PurePosixPath

RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)", re.IGNORECASE)
_DIGITS_OR_RANK = re.compile(r"(rank[_\-.]?)(\d+)|\d+", re.IGNORECASE)
_LONG_DIGITS_OR_RANK = re.compile(r"(rank[_\-.]?)(\d+)|\d{4,}", re.IGNORECASE)
_SUFFIXES = (".gz", ".json", ".trace", ".pt")


def fold_name(name: str, suffixes: bool = True) -> str:
    """A file name (`suffixes`: its trace extensions dropped) with every digit run folded to #, or a folder's
    name with runs of 4 digits or more folded (dates, timestamps; `site-2` and `bf16` stay); a rank's number
    stays in both."""
    if not suffixes:
        return _LONG_DIGITS_OR_RANK.sub(lambda m: m.group(0) if m.group(1) else "#", name)
    for suffix in _SUFFIXES:
        name = name.removesuffix(suffix)
    return _DIGITS_OR_RANK.sub(lambda m: m.group(0) if m.group(1) else "#", name)


def _parts(path: str) -> tuple[str, ...]:
    return PurePosixPath(path.split("://", 1)[1] if "://" in path else os.path.abspath(path)).parts


def trace_label(path: str, roots: tuple[str, ...] = (), rank: int | None = None) -> str:
    """The trace's identity: see the module's docstring."""
    if path == "-":
        return "-"
    parts = _parts(path)
    kept = parts[-2:]  # its folder and its name
    for root in sorted(roots, key=len, reverse=True):
        top = _parts(root.rstrip("/"))
        if len(parts) > len(top) and parts[:len(top)] == top:
            kept = parts[len(top) - 1:]  # the root's own name and the path below it
            break
    if kept and kept[0] == "/":
        kept = kept[1:]
    label = "/".join([*(fold_name(p, suffixes=False) for p in kept[:-1]), fold_name(kept[-1])])
    if rank is not None and not RANK_IN_NAME.search(kept[-1]):
        label += f"@rank{rank}"
    return label


def job_label(path: str) -> str:
    """The file name with every digit run folded, rank numbers too: the traces of one job's ranks share it."""
    return re.sub(r"\d+", "#", fold_name(PurePosixPath(path).name))
