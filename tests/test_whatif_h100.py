"""What-if savings against the same fixes timed without the profiler on an H100 (tests/data/whatif_h100: the
command, GPU and versions are in its README). A prediction is within the bar when it is within 25% of the timed
saving, or, where the timed fix saves under 4% of the step, within 1% of the step."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from attntrace.api import whatif

DATA = Path(__file__).resolve().parent / "data" / "whatif_h100"

# case -> the change the fix makes
CHANGES: dict[str, dict[str, Any]] = {
    "decode_graph": {"graph": True},
    "tiny_ops_graph": {"graph": True},
    "fp32_vs_tf32": {"speedup": {"gemm_fp32_simt": 4.0}},
    "mlp_micro_item": {"drop_syncs": True},
    "finite_check": {"drop_syncs": True},
    "big_gemm_item": {"drop_syncs": True},
    "compiled_item": {"drop_syncs": True},
    "gpt2_item": {"drop_syncs": True},
    "resnet_item": {"drop_syncs": True},
    "resnet_pageable": {"pin_copies": True},
    "resnet_pageable_item": {"drop_syncs": True, "pin_copies": True},
    "loader_on_path": {"offload_loader": True, "pin_copies": True},
    "masked_nonzero": {"drop_syncs": True},
}
# Known misses, each with its cause: strict, so that a fix of the cause shows as XPASS and the mark goes.
MISSES = {
    "loader_on_path": "predicts 2.7 of 15.9 ms: the host factor (the trace's median launch call, 14 us, over the "
                      "reference's 6 us) scales 3,900 data-loader CPU ops' profiler cost by 2.4x; at 1x it predicts "
                      "17.0 ms",
    "resnet_pageable_item": "predicts 4.9 of 7.6 ms (the timed rounds spread 54-59 ms before, 42-47 after)",
    "resnet_pageable": "predicts 5.5 of 4.4 ms (+27%; the timed rounds spread 38-48 ms before, 36-44 after)",
    "masked_nonzero": "predicts 0 of 0.43 ms: the fix also drops nonzero's index ops, which the change keeps",
}


def timed(case: str) -> tuple[float, float, tuple[float, float]]:
    """The timed saving and the step before the fix, ms (medians of the rounds), and the savings the rounds'
    extremes allow."""
    runs = json.loads((DATA / f"{case}.json").read_text())
    before, after = runs["before_ms"], runs["after_ms"]
    spread = (min(before) - max(after), max(before) - min(after))
    return statistics.median(before) - statistics.median(after), statistics.median(before), spread


def within(predicted: float, saving: float, step: float, spread: tuple[float, float]) -> bool:
    if saving < 0.04 * step:
        # A fix that saves nothing measurable (a sync off the path; a "fix" that adds work of its own): the
        # prediction is within 1% of the step of what it saved, or of nothing, or inside the rounds' spread.
        return (min(abs(predicted - saving), abs(predicted)) <= 0.01 * step
                or spread[0] <= predicted <= spread[1])
    return abs(predicted - saving) <= 0.25 * saving


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.xfail(reason=MISSES[c], strict=True))
                                  if c in MISSES else c for c in CHANGES])
def test_whatif_saving_is_within_the_bar_of_the_timed_fix(case: str) -> None:
    saving, step, spread = timed(case)
    report = whatif(str(DATA / f"{case}.shapes.pt.trace.json.gz"), **CHANGES[case])
    predicted = sum(d["saved_us"] for d in report["devices"]) / 1e3
    assert within(predicted, saving, step, spread), (predicted, saving, step, spread)
