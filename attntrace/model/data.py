"""Where the data files of `rules/` live: inside the wheel as attntrace/_rules, or beside the package in a
source checkout (editable installs and running from the repository)."""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path
from typing import Any

_PACKAGE = Path(__file__).resolve().parent.parent  # attntrace/, two levels up from attntrace/model/data.py


@cache
def rules_dir() -> Path:
    for candidate in (_PACKAGE / "_rules", _PACKAGE.parent / "rules"):
        if (candidate / "taxonomy.toml").is_file():
            return candidate
    raise FileNotFoundError("attntrace's rules/ data files are missing from this installation")


def load_toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        return tomllib.load(fh)
