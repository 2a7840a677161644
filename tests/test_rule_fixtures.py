"""Per-rule fixtures in the style of sqlfluff's: small traces built from real H200 event shapes (a sample trace
read as JSON and changed the way another program would have written it), each named for the situation, where
the rule must fire or must stay silent."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import sample
from tracebuild import read_json, write_json

from attntrace.model.loading import load
from attntrace.report.engine import lint_trace

NAIVE = sample("bf16_causal_fwd/naive")


def _findings(path: str, rule: str) -> list[dict[str, Any]]:
    return [f for f in lint_trace(load(path)).findings if f["rule"] == rule]


def _rename_op(doc: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    for e in doc["traceEvents"]:
        if e.get("name") == old and e.get("cat") == "cpu_op":
            e["name"] = new
    return doc


def _wrap_steps(doc: dict[str, Any], label: str) -> dict[str, Any]:
    """A record_function around each step's work, as Lightning, HF Trainer or DDP add."""
    marks = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") == "user_annotation"]
    for m in marks:
        doc["traceEvents"].append({**m, "name": label, "ts": m["ts"] + 0.001, "dur": m["dur"] - 0.002,
                                   "args": {}})
    return doc


def _build(tmp_path: Path, doc: dict[str, Any], name: str) -> str:
    return write_json(doc, tmp_path / f"{name}.json")


# --- AT101 hidden-copy ---------------------------------------------------------------------------------
def test_at101_fires_inside_a_record_function_and_names_the_op(tmp_path: Path):
    path = _build(tmp_path, _wrap_steps(read_json(NAIVE), "execute_context_1(888_788544)"), "wrapped")
    (f,) = _findings(path, "AT101")
    assert f["message"].startswith("aten::masked_fill makes")
    assert "execute_context" not in f["where"]["op_chain"]


@pytest.mark.parametrize("explicit", ["aten::contiguous", "aten::clone"])
def test_at101_silent_on_an_explicit_copy_inside_a_record_function(tmp_path: Path, explicit: str):
    doc = _wrap_steps(_rename_op(read_json(NAIVE), "aten::masked_fill", explicit), "training_step")
    assert _findings(_build(tmp_path, doc, "explicit"), "AT101") == []


@pytest.mark.parametrize("owner", ["aten::constant_pad_nd", "aten::pad", "vllm::all_reduce",
                                   "c10d::allreduce_"])
def test_at101_silent_on_padding_and_collective_staging(tmp_path: Path, owner: str):
    doc = _rename_op(read_json(NAIVE), "aten::masked_fill", owner)
    assert _findings(_build(tmp_path, doc, "owner"), "AT101") == []


def test_at101_ddp_bucket_copy_suggests_gradient_as_bucket_view(tmp_path: Path):
    doc = _rename_op(read_json(NAIVE), "aten::masked_fill", "torch.distributed.ddp.reducer::copy_bucket_to_grad")
    (f,) = _findings(_build(tmp_path, doc, "ddp"), "AT101")
    assert "gradient_as_bucket_view=True" in f["fix"]


def test_at101_is_subsumed_by_the_unfused_chain_it_belongs_to():
    copies = _findings(NAIVE, "AT101")
    assert copies and all(f["subsumed_by"] == "AT102" for f in copies)


def test_at101_copies_outside_the_unfused_chain_stay_counted():
    # gpt2_eager_train has an unfused attention (AT102) and, apart from it, copies in the backward of views.
    report = lint_trace(load(sample("workloads/gpt2_eager_train")))
    assert any(f["rule"] == "AT102" for f in report.findings)
    outside = [f for f in report.findings if f["rule"] == "AT101" and "ViewBackward0" in f["where"]["op_chain"]]
    assert outside and all("subsumed_by" not in f for f in outside)


# --- AT102 materialized-scores -------------------------------------------------------------------------
def test_at102_fires_on_a_chain_split_across_helper_functions(tmp_path: Path):
    doc = read_json(NAIVE)
    ops = sorted((e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    first_mul = next(e for e in ops if e["name"] == "aten::mul")
    softmax = next(e for e in ops if e["name"] == "aten::softmax" and e["ts"] > first_mul["ts"])
    helper = {k: first_mul[k] for k in ("ph", "pid", "tid")}
    doc["traceEvents"] += [
        {**helper, "cat": "user_annotation", "name": "scores()", "ts": first_mul["ts"] - 0.0005,
         "dur": softmax["ts"] - first_mul["ts"], "args": {}},
        {**helper, "cat": "user_annotation", "name": "attend()", "ts": softmax["ts"] - 0.0005,
         "dur": softmax["dur"] + 0.001, "args": {}}]
    (f,) = _findings(_build(tmp_path, doc, "helpers"), "AT102")
    assert "aten::softmax" in f["where"]["op_chain"]


def test_at102_fix_says_attn_mask_when_the_trace_does_not_show_a_causal_mask():
    (f,) = _findings(NAIVE, "AT102")
    assert "attn_mask=mask" in f["fix"] and f["evidence"]["causal_mask_in_trace"] is False


@pytest.mark.parametrize("name", ["bf16_causal_fwd/sdpa", "bf16_causal_fwd/sdpa_flash", "bf16_decode_kvcache/naive"])
def test_at102_silent_on_fused_attention_and_decode(name: str):
    assert _findings(sample(name), "AT102") == []


# --- AT201 / AT202 / AT301 on the math backend: one fix, counted once -------------------------------------
def test_math_backend_findings_are_subsumed_by_at202():
    report = lint_trace(load(sample("bf16_causal_fwd/sdpa_math")))
    rules = {f["rule"]: f for f in report.findings}
    assert "AT202" in rules and "subsumed_by" not in rules["AT202"]
    assert rules["AT201"]["subsumed_by"] == "AT202"
    counted = sum(f["impact"]["gpu_us_per_step"] for f in report.findings if "subsumed_by" not in f)
    assert report.info["impact_gpu_us_per_step"] == pytest.approx(counted)
    assert counted <= report.info["summary"]["per_step"][0]["gpu_busy_us"]


# --- AT302 host-sync ----------------------------------------------------------------------------------
def test_at302_cheap_item_sync_is_info_not_warning():
    # One loss.item() per GPT-2 training step: its idle is under the 2% of the step a warning promises.
    (f,) = _findings(sample("workloads/gpt2_eager_train"), "AT302")
    assert f["severity"] == "info" and f["message"].startswith("1 host sync per step")
    assert f["impact"]["share_of_step"] < 0.02


def test_at302_item_sync_gets_the_idle_not_the_copy_before_it():
    # .item() is a device-to-host copy, then a cudaStreamSynchronize: the GPU's wait after them is the sync's
    # (it once went to the copy, which no rule names, and the sync was silent).
    (f,) = _findings(sample("workloads/gpt2_eager_train"), "AT302")
    assert f["evidence"]["apis"] == ["cudaStreamSynchronize"]
    each = [i for i in f["evidence"]["gpu_idle_us_after_each"] if i is not None]
    # As recorded `_local_scalar_dense` held the CPU ~50 us per .item() (its blocking copy, its sync, its own
    # work), ~41-43 us less the profiler's costs: the saving is that, not the 100+ us of the next step's set-up
    # that the GPU would wait for anyway.
    assert each and all(30 < i < 50 for i in each)
    assert f["evidence"]["recorded_gpu_idle_us_per_step"] >= f["evidence"]["gpu_idle_us_per_step"]


def test_at302_saves_no_more_than_the_sync_held_the_cpu():
    # A sync that found the GPU all but done: the idle after it is the CPU's own work before the next launch,
    # which removing the sync does not shorten (in this decode loop the replayed GPU idles after each .item()
    # well beyond the time the ops the syncs ran in held the CPU).
    trace = load(sample("calibration/llama_generate.plain"))
    calls = trace.launches_on_devices
    (f,) = [f for f in _findings(sample("calibration/llama_generate.plain"), "AT302")
            if f["impact"]["gpu_us_per_step"] > 100]
    syncs = calls.filter(pl.col("name").is_in(f["evidence"]["apis"]) & pl.col("step").is_in(f["where"]["steps"]))
    # The ops the syncs ran in, whole: what they held the CPU as recorded, an upper bound of the saving.
    held = trace.ops.filter(pl.col("idx").cast(pl.Int64).is_in(syncs["op"].implode()))["dur"].sum()
    assert f["impact"]["gpu_us_per_step"] <= 1.05 * held / trace.step_count  # (the claim has two figures)
    # The replay's idle after those syncs (the claim before the bound) is well above it.
    after = sum(trace.replay.idle_after_sync.get(i, 0.0) for i in syncs["idx"].to_list()) / trace.step_count
    assert after > 1.5 * f["impact"]["gpu_us_per_step"]


def test_at302_on_two_ranks_counts_per_step_of_one_rank(tmp_path: Path):
    doc = read_json(sample("calibration/mlp_item_sync.shapes"))
    second = copy.deepcopy(doc["traceEvents"])
    for e in second:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"):
            e["pid"] = 1
            if "device" in e.get("args", {}):
                e["args"]["device"] = 1
        elif isinstance(e.get("pid"), int):
            e["pid"] += 100000
    doc["traceEvents"] += second
    findings = _findings(_build(tmp_path, doc, "ranks"), "AT302")
    assert findings and all(f["message"].startswith("4 host syncs per step") for f in findings)


# --- AT401 low-occupancy -------------------------------------------------------------------------------
def test_at401_fires_on_a_real_low_occupancy_kernel():
    (f,) = _findings(sample("workloads/low_occupancy_kernel"), "AT401")
    assert f["severity"] == "warning"


def test_at401_silent_on_communication_kernels(tmp_path: Path):
    doc = read_json(sample("workloads/low_occupancy_kernel"))
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"].startswith("attntrace_lowocc_scale"):
            e["name"] = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    assert _findings(_build(tmp_path, doc, "nccl"), "AT401") == []


@pytest.mark.parametrize("name", ["bf16_causal_fwd/compiled", "bf16_causal_fwd/flex", "bf16_causal_fwd/sdpa_cudnn"])
def test_at401_silent_on_inductor_and_fused_kernels(name: str):
    assert _findings(sample(name), "AT401") == []


# --- AT501 launch-overhead -------------------------------------------------------------------------------
TINY = sample("workloads/launch_bound_tiny_ops")


def test_at501_fires_with_rocm_launch_names(tmp_path: Path):
    doc = read_json(TINY)
    for e in doc["traceEvents"]:
        if e.get("name") == "cudaLaunchKernel":
            e["name"] = "hipLaunchKernel"
    assert _findings(_build(tmp_path, doc, "rocm"), "AT501")


def test_at501_silent_when_the_steps_are_graph_captures(tmp_path: Path):
    doc = read_json(TINY)
    steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") == "user_annotation"]
    for s in steps:
        thread = {"pid": s["pid"], "tid": s["tid"], "cat": "cuda_runtime", "ph": "X", "dur": 1, "args": {}}
        doc["traceEvents"] += [{**thread, "name": "cudaStreamBeginCapture", "ts": s["ts"] + 0.5},
                               {**thread, "name": "cudaStreamEndCapture", "ts": s["ts"] + s["dur"] - 2}]
    assert _findings(TINY, "AT501")
    assert _findings(_build(tmp_path, doc, "captured"), "AT501") == []


def test_at202_with_a_mask_does_not_offer_flash_and_names_the_mask_first():
    # Flash takes no attn_mask: "flash, memory-efficient and cuDNN could take it" was wrong for a masked call, and
    # a pinned backend came first among the causes where only the masked calls ran math.
    (f,) = _findings(sample("bf16_window_fwd/sdpa_math"), "AT202")
    assert "memory-efficient and cuDNN (flash takes no attn_mask) could take it" in f["message"]
    assert f["message"].index("a mask layout or strides") < f["message"].index("the math backend pinned")
    (unmasked,) = _findings(sample("bf16_causal_fwd/sdpa_math"), "AT202")
    assert "flash, memory-efficient and cuDNN could take it" in unmasked["message"]
