"""A finding is a cause (issue 23) on real H200 traces: what each rule names as the cause, and the fix that
fits it; each with a trace where it must say so and one where it must not."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest
from conftest import sample

from attntrace.checks import Context
from attntrace.checks import at401_low_occupancy as at401
from attntrace.checks.catalog import load_rules
from attntrace.model.loading import load
from attntrace.report.engine import lint_trace


def _findings(name: str, rule: str) -> list[dict[str, Any]]:
    return [f for f in lint_trace(load(sample(name))).findings if f["rule"] == rule]


def test_at202_names_grouped_query_heads_from_the_inputs():
    (f,) = _findings("bf16_gqa_fwd/sdpa_math", "AT202")
    assert "grouped-query heads (q 16 heads, k/v 2)" in f["message"]
    (plain,) = _findings("bf16_causal_fwd/sdpa_math", "AT202")
    assert "grouped-query" not in plain["message"]


def test_at202_message_and_fix_agree_on_the_head_dim_limit():
    (f,) = _findings("bf16_causal_fwd_d512/sdpa_math", "AT202")
    assert f["evidence"]["reason"] == "head-dim-large"
    assert "head dim 512 is above flash's and cuDNN's limit of 256" in f["message"]
    assert f["fix"].startswith("Keep the head dim at 256 or less") and "could take it" not in f["message"][:80]
    assert f["impact"]["assumption"] == "if a fused backend runs these calls 10x faster than math"


def test_at101_in_backward_names_the_forward_op_not_masked_fill_():
    found = _findings("bf16_causal_fwdbwd/naive", "AT101")
    backward = [f for f in found if "MaskedFillBackward0" in f["where"]["op_chain"]]
    forward = [f for f in found if "Backward" not in f["where"]["op_chain"]]
    assert backward and "`MaskedFillBackward0`" in backward[0]["fix"] and "do not remove it" in backward[0]["fix"]
    assert forward and forward[0]["fix"].startswith("Use the in-place `masked_fill_`")


def test_at302_gives_each_kind_of_sync_its_own_fix():
    (copy,) = _findings("calibration/llama_train_eager.shapes", "AT302")
    assert "pageable" in copy["message"] and "non_blocking=True" in copy["fix"] and ".item()" not in copy["fix"]
    (item,) = _findings("calibration/mlp_item_sync.shapes", "AT302")
    assert "loss.detach()" in item["fix"] and "pin_memory" not in item["fix"]


def test_at201_is_one_finding_per_cause_over_compute_time():
    (f,) = _findings("fp32_causal_fwd/naive", "AT201")
    assert f["evidence"]["cause"] == "fp32-inputs" and f["evidence"]["op_chain_count"] >= 1
    assert "% of compute" in f["message"] and f["impact"]["assumption"].startswith("if tensor cores run")
    assert _findings("bf16_causal_fwd/naive", "AT201") == []


def test_at401_leaves_kernels_another_rule_owns():
    # The math backend's FP32 GEMMs run at 13% and 25% occupancy: AT201 and AT202 name their cause.
    assert _findings("bf16_causal_fwd/sdpa_math", "AT401") == []
    assert [f["severity"] for f in _findings("workloads/low_occupancy_kernel", "AT401")] == ["warning"]


def test_at401_knows_a_kernel_that_already_runs_near_the_memory_bandwidth():
    # Llama generate() on the H200: the LM-head GEMV moves its weights at ~73% of HBM bandwidth, the small
    # per-layer ones at a few percent (launch-bound decode).
    trace = load(sample("calibration/llama_generate.shapes"))
    rule = load_rules()["AT401"]
    ctx = Context(trace, rule, {p.name: p.default for p in rule.parameters.values()}, rule.severity)
    kernels = (ctx.gpu.filter((pl.col("kind") == "kernel") & pl.col("op").is_not_null())
               .group_by("name", "device").agg(pl.col("dur").sum().alias("us"), pl.len().alias("count"),
                                               pl.col("op").unique().sort().alias("ops")))
    shares = {row["name"]: at401._near_peak(ctx, row)["bandwidth_share"] for row in kernels.iter_rows(named=True)
              if row["name"].startswith("nvjet") and at401._near_peak(ctx, row)}
    busy = [n for n, s in shares.items() if s >= rule.parameters["max_peak_share"].default]
    assert busy and any(s < 0.1 for s in shares.values())
    assert all(s <= 1.2 for s in shares.values())  # no estimate faster than the memory


def test_an_at402_of_the_profilers_cost_alone_does_not_hold_the_syncs():
    # AT402 finds the recorded idle to be the profiler's own cost (info, saving nothing): the host syncs are
    # causes of their own, not consequences inside it, or a sync's warning would leave the verdict and the exit
    # code (`--fail-on warning` passed on a real .item() warning).
    report = lint_trace(load(sample("from_trace/llama_generate_eager")))
    (idle,) = [f for f in report.findings if f["rule"] == "AT402"]
    assert idle["evidence"]["profiler_only"] and idle["severity"] == "info"
    syncs = [f for f in report.findings if f["rule"] == "AT302"]
    assert syncs and not any("cause" in f or "subsumed_by" in f for f in syncs)


@pytest.mark.parametrize("setting", ["plain", "shapes"])
def test_a_copy_inside_the_unfused_chain_is_its_consequence_with_or_without_shapes(setting: str):
    # Without record_shapes the copy of masked_fill was a second warning beside AT102's, its 255 us counted twice
    # (97.6% of the step between them); with shapes it was inside AT102. One cause, one finding, either way.
    report = lint_trace(load(sample(f"calibration/attention_naive.{setting}")))
    causes = [f for f in report.findings if "cause" not in f]
    assert [f["rule"] for f in causes] == ["AT102"]
    copies = [f for f in report.findings if f["rule"] == "AT101"]
    assert copies and all(f["subsumed_by"] == "AT102" for f in copies)
