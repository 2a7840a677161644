"""A trace that holds several processes (ranks merged into one file): a finding's "per step" is per step of the
processes its rows ran in, not over every process's steps."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from conftest import sample
from tracebuild import read_json, write_json

from attntrace.model.loading import load
from attntrace.report.engine import lint_trace

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
ID_ARGS = ("correlation", "External id", "Ev Idx", "Python id", "Python parent id")
OFFSET = 10**8


def _first_step(events: list[dict[str, Any]]) -> float:
    return min(e["ts"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))


def _merged(rank0: str, rank1: str, out: Path) -> str:
    """rank1's events as a second process driving GPU 1 (pids, device, ids moved; time aligned to rank0's first
    step), as a tool that merges per-rank traces into one file writes them."""
    first, second = read_json(sample(rank0)), read_json(sample(rank1))
    shift = _first_step(first["traceEvents"]) - _first_step(second["traceEvents"])
    moved = []
    for event in second["traceEvents"]:
        event = copy.deepcopy(event)
        if event.get("ph") == "M" and isinstance(event.get("pid"), int) and event["pid"] < 100:
            continue  # rank 1's GPU rows are named again by its moved device
        if isinstance(event.get("ts"), (int, float)):
            event["ts"] += shift
        gpu = event.get("cat") in GPU_CATS or (event.get("cat") == "ac2g" and event.get("ph") == "f")
        if isinstance(event.get("pid"), int):
            event["pid"] += 1 if gpu else 100000
        args = event.get("args")
        if isinstance(args, dict):
            if gpu and "device" in args:
                args["device"] += 1
            for key in ID_ARGS:
                if isinstance(args.get(key), int):
                    args[key] += OFFSET
        if event.get("cat") in ("ac2g", "fwdbwd") and "id" in event:
            event["id"] += OFFSET
        moved.append(event)
    first["traceEvents"] += moved
    first["deviceProperties"].append({**first["deviceProperties"][0], "id": 1})
    return write_json(first, out / "merged.json")


def _rule(findings: list[dict[str, Any]], rule: str) -> dict[str, Any]:
    (found,) = [f for f in findings if f["rule"] == rule]
    return found


def test_a_cause_on_one_rank_is_per_step_of_that_rank(tmp_path: Path):
    # Rank 0 runs the unfused chain, rank 1 flash attention. Over both ranks' 6 steps, AT102 said "3 times in 6
    # steps", 980 us per step (alone: 1 per step, 1960 us), and its copy (AT101) half its time.
    alone = lint_trace(load(sample("bf16_causal_fwd/naive"))).findings
    merged = lint_trace(load(_merged("bf16_causal_fwd/naive", "bf16_causal_fwd/sdpa_flash", tmp_path))).findings
    for rule in ("AT102", "AT101"):
        one, both = _rule(alone, rule), _rule(merged, rule)
        assert both["evidence"]["gpu_us_per_step"] == pytest.approx(one["evidence"]["gpu_us_per_step"])
    assert _rule(merged, "AT102")["evidence"]["calls_per_step"] == 1
    assert "1 time per step" in _rule(merged, "AT102")["message"]


def test_a_cause_on_both_ranks_is_per_step_of_a_rank(tmp_path: Path):
    # Both ranks launch-bound: AT402 per device, AT501's launch cost per step of one rank, each device quoting
    # its own process's events.
    alone = lint_trace(load(sample("workloads/launch_bound_tiny_ops"))).findings
    merged = lint_trace(load(_merged("workloads/launch_bound_tiny_ops", "workloads/launch_bound_tiny_ops",
                                     tmp_path))).findings
    one = _rule(alone, "AT501")["evidence"]
    launch_bound = [f for f in merged if f["rule"] == "AT501"]
    assert sorted(f["where"]["device"] for f in launch_bound) == [0, 1]  # one finding per device, as AT402's
    for both in (f["evidence"] for f in launch_bound):
        assert both["launches_per_step"] == one["launches_per_step"]
        assert both["recorded_launch_cpu_us_per_step"] == pytest.approx(one["recorded_launch_cpu_us_per_step"])
        assert both["launch_bound_steps"] == both["steps"] == one["steps"]
    idle = [f for f in merged if f["rule"] == "AT402"]
    assert sorted(f["where"]["device"] for f in idle) == [0, 1]


def test_a_share_of_the_steps_gpu_time_is_of_one_device(tmp_path: Path):
    # fp32 SDPA training on rank 0, bf16 flash on rank 1: AT203's 3.9 ms per step were 166% of the step's GPU
    # time pooled over both devices (rank 0 alone: 95%).
    alone = _rule(lint_trace(load(sample("fp32_causal_fwdbwd/sdpa"))).findings, "AT203")
    merged = _rule(lint_trace(load(_merged("fp32_causal_fwdbwd/sdpa", "bf16_causal_fwdbwd/sdpa_flash",
                                           tmp_path))).findings, "AT203")
    assert merged["evidence"]["share_of_step_gpu"] == pytest.approx(alone["evidence"]["share_of_step_gpu"])
    assert merged["evidence"]["share_of_step_gpu"] <= 1


def test_each_rank_is_judged_against_its_own_device_and_host(tmp_path: Path):
    # GPT-2 training (1 .item() per step) on rank 0, a launch-bound MLP loop with 4 host syncs per step and fp32
    # GEMMs on rank 1 (both record_shapes H200 captures, their hosts 1.12x and 1.54x the calibration host's).
    # Merged, rank 1's GEMMs were 8% of rank 0's compute (65% of its own), its launch-bound steps were outvoted
    # ("5 of 8 steady steps", or silent), its syncs and rank 0's were one finding under rank 0's idle, and both
    # ranks' costs were scaled by one factor over both processes' launches.
    rank1 = lint_trace(load(sample("calibration/mlp_item_sync.shapes"))).findings
    merged_trace = load(_merged("workloads/gpt2_eager_train", "calibration/mlp_item_sync.shapes", tmp_path))
    merged = lint_trace(merged_trace).findings
    gemms = [f for f in merged if f["rule"] == "AT201" and f["where"]["device"] == 1]
    assert len(gemms) == 1
    assert gemms[0]["evidence"]["share_of_compute"] == pytest.approx(
        _rule(rank1, "AT201")["evidence"]["share_of_compute"], rel=0.01)
    (launch_bound,) = [f for f in merged if f["rule"] == "AT501" and f["where"]["device"] == 1]
    alone = _rule(rank1, "AT501")["evidence"]
    assert launch_bound["evidence"]["launch_bound_steps"] == alone["launch_bound_steps"] == 5
    assert launch_bound["evidence"]["steps"] == alone["steps"]
    assert launch_bound["evidence"]["launch_cpu_us_per_step"] == pytest.approx(alone["launch_cpu_us_per_step"])
    syncs = [f for f in merged if f["rule"] == "AT302" and f["where"]["device"] == 1]
    assert syncs and not [f for f in merged if f["rule"] == "AT302" and f["where"]["device"] is None]
    assert sum(f["evidence"]["syncs_per_step"] for f in syncs) == pytest.approx(
        sum(f["evidence"]["syncs_per_step"] for f in rank1 if f["rule"] == "AT302"))
    idle = {f["where"]["device"]: f["fingerprint"] for f in merged if f["rule"] == "AT402"}
    assert all(f.get("cause") in (None, idle.get(1)) for f in syncs)
    alone_factor = load(sample("calibration/mlp_item_sync.shapes")).replay.host_factor
    assert merged_trace.replay.costs_by_device[1].runtime_call_us == pytest.approx(
        merged_trace.replay.costs.runtime_call_us / merged_trace.replay.host_factor * alone_factor, rel=0.01)
