"""Detection logic, one module per rule (`atNNN_<rule_name>.py`, with `check(ctx)` returning findings or raising
Skip). The registry is found, not written: every module named for a rule is that rule's check, and a test
holds it to the rule files in rules/."""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from typing import Any

from attntrace.checks.base import Context, Skip

Check = Callable[[Context], list[dict[str, Any]]]
MODULE = re.compile(r"^at(\d{3})_[a-z0-9_]+$")


def _discover() -> dict[str, Check]:
    found: dict[str, Check] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        match = MODULE.match(info.name)
        if match:
            found[f"AT{match.group(1)}"] = importlib.import_module(f"{__name__}.{info.name}").check
    return found


CHECKS: dict[str, Check] = _discover()

__all__ = ["CHECKS", "Context", "Skip"]
