"""Detection logic, one module per rule; each `check(ctx)` returns findings or raises Skip."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attntrace.checks import (
    at101_hidden_copy,
    at102_materialized_scores,
    at201_fp32_gemm,
    at202_sdpa_math_fallback,
    at203_fp32_attention,
    at301_mask_rebuilt,
    at302_host_sync,
    at401_low_occupancy,
    at402_gpu_idle,
    at501_launch_overhead,
)
from attntrace.checks.base import Context, Skip

Check = Callable[[Context], list[dict[str, Any]]]

CHECKS: dict[str, Check] = {
    "AT101": at101_hidden_copy.check,
    "AT102": at102_materialized_scores.check,
    "AT201": at201_fp32_gemm.check,
    "AT202": at202_sdpa_math_fallback.check,
    "AT203": at203_fp32_attention.check,
    "AT301": at301_mask_rebuilt.check,
    "AT302": at302_host_sync.check,
    "AT401": at401_low_occupancy.check,
    "AT402": at402_gpu_idle.check,
    "AT501": at501_launch_overhead.check,
}

__all__ = ["CHECKS", "Context", "Skip"]
