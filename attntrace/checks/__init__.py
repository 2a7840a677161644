"""Detection logic, one module per rule; each `check(ctx)` returns findings or raises Skip."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attntrace.checks import (
    at101_hidden_copy,
    at201_fp32_gemm,
    at301_mask_rebuilt,
    at401_low_occupancy,
    at501_launch_overhead,
)
from attntrace.checks.base import Context, Skip

Check = Callable[[Context], list[dict[str, Any]]]

CHECKS: dict[str, Check] = {
    "AT101": at101_hidden_copy.check,
    "AT201": at201_fp32_gemm.check,
    "AT301": at301_mask_rebuilt.check,
    "AT401": at401_low_occupancy.check,
    "AT501": at501_launch_overhead.check,
}

__all__ = ["CHECKS", "Context", "Skip"]
