"""Each device's peak throughput per precision and its memory bandwidth (attntrace/peaks.toml), for `run`'s
% peak columns and for the rules that ask whether a kernel already runs near what the GPU can do."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

from attntrace.model.data import load_toml

PEAKS_FILE = Path(__file__).resolve().parent.parent / "peaks.toml"  # attntrace/peaks.toml


@cache
def _devices() -> list[dict[str, Any]]:
    return list(load_toml(PEAKS_FILE)["device"])


def device_peaks(gpu_name: str | None) -> dict[str, Any] | None:
    """The peaks.toml entry whose `match` is the longest whole-word part of the device's name."""
    if not gpu_name:
        return None
    found = [d for d in _devices() if re.search(rf"(?<![\w]){re.escape(d['match'])}(?![\w])", gpu_name)]
    return max(found, key=lambda d: len(d["match"])) if found else None
