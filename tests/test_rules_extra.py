"""The second group of rules (AT102, AT202, AT203, AT302, AT402) on real H200 traces: fire and silent."""

from __future__ import annotations

from functools import cache

import pytest
from conftest import DATA, sample
from tracebuild import read_json, write_json

from attntrace.model.loading import load
from attntrace.report.engine import lint_trace


@cache
def findings(name: str, rule: str) -> list[dict]:
    return [f for f in lint_trace(load(sample(name))).findings if f["rule"] == rule]


# --- AT102 materialized-scores ---------------------------------------------------------------------
def test_at102_eager_gpt2_names_the_chain_and_bytes():
    (f,) = findings("workloads/gpt2_eager_train", "AT102")
    assert f["where"]["op_chain"].startswith("aten::matmul > aten::div")
    assert f["where"]["op_chain"].endswith("aten::where > aten::softmax > aten::matmul")
    ev = f["evidence"]
    assert ev["seq_len"] == 511 and ev["score_shape"] == [8, 8, 511, 511]
    assert ev["calls_per_step"] == 4  # one per layer
    assert ev["score_bytes"] == 8 * 8 * 511 * 511 * 2
    assert ev["bytes_per_step"] == ev["memory_passes"] * ev["score_bytes"] * 4
    assert "scaled_dot_product_attention" in f["fix"]


def test_at102_naive_microbenchmark():
    (f,) = findings("bf16_causal_fwd/naive", "AT102")
    assert f["where"]["op_chain"] == "aten::matmul > aten::mul > aten::masked_fill > aten::softmax > aten::matmul"
    assert f["evidence"]["score_bytes"] == 512 * 2**20


def test_at102_counts_the_backward_of_the_chain_in_training():
    # SDPA's backward replaces the chain's backward nodes too (SoftmaxBackward0, MaskedFillBackward0,
    # MulBackward0): a training step's AT102 claimed 1.96 ms, the forward's alone, as a forward-only trace did.
    (fwd,) = findings("bf16_causal_fwd/naive", "AT102")
    (train,) = findings("bf16_causal_fwdbwd/naive", "AT102")
    assert fwd["evidence"]["backward_gpu_us_per_step"] == 0
    back = train["evidence"]["backward_gpu_us_per_step"]
    assert back > 1000 and train["evidence"]["gpu_us_per_step"] == pytest.approx(fwd["evidence"]["gpu_us_per_step"]
                                                                                + back, rel=0.02)
    assert "their backward" in train["message"] and "their backward" not in fwd["message"]
    # Hugging Face GPT-2 trained eagerly (its gradients in another dtype than the bf16 scores: counted by shape).
    (hf,) = findings("workloads/gpt2_eager_train", "AT102")
    assert hf["evidence"]["backward_gpu_us_per_step"] > 0.3 * (hf["evidence"]["gpu_us_per_step"]
                                                              - hf["evidence"]["backward_gpu_us_per_step"])


@pytest.mark.parametrize("name", ["workloads/gpt2_sdpa_train", "bf16_causal_fwd/sdpa_math", "bf16_causal_fwd/sdpa",
                                  "bf16_causal_fwd/sdpa_flash", "bf16_causal_fwd/flex", "bf16_causal_fwd/compiled"])
def test_at102_silent_on_sdpa_and_fused(name):
    assert findings(name, "AT102") == []


# --- AT202 sdpa-math-fallback ----------------------------------------------------------------------
def test_at202_eligible_inputs_list_possible_reasons_without_claiming_one():
    (f,) = findings("bf16_causal_fwd/sdpa_math", "AT202")
    assert f["evidence"]["reason"] == "not-shown" and "Possible causes" in f["message"]
    assert "was pinned" not in f["message"] and "SDPBackend.MATH" in f["message"]
    assert f["evidence"]["kernels_per_call"] == 20


def test_at202_head_dim_512_names_the_only_fused_kernel():
    (f,) = findings("bf16_causal_fwd_d512/sdpa_math", "AT202")
    assert "head dim 512" in f["message"] and "memory-efficient" in f["message"]


@pytest.mark.parametrize("name", ["bf16_causal_fwd/sdpa", "bf16_causal_fwd_d512/sdpa", "workloads/gpt2_sdpa_train",
                                  "fp32_causal_fwd/sdpa", "bf16_causal_fwd/naive"])
def test_at202_silent_when_a_fused_backend_ran(name):
    assert findings(name, "AT202") == []


# --- AT203 fp32-attention --------------------------------------------------------------------------
def test_at203_fp32_efficient_kernels():
    (fwd,) = findings("fp32_causal_fwd/sdpa", "AT203")
    assert fwd["where"]["kernel"].startswith("fmha_cutlassF_f32")
    assert fwd["impact"]["gpu_us_per_step"] == pytest.approx(fwd["evidence"]["gpu_us_per_step"] * (1 - 1 / 3))
    # Forward and backward are one cause (fp32 q/k/v given to SDPA) with one fix: one finding, not a warning each.
    (both,) = findings("fp32_causal_fwdbwd/sdpa", "AT203")
    assert both["where"]["kernel"].startswith("fmha_cutlassF_f32")
    assert sorted(k[:14] for k in both["evidence"]["kernels_us_per_step"]) == ["fmha_cutlassB_", "fmha_cutlassF_"]
    ev = both["evidence"]
    assert ev["backward_us_per_step"] > ev["forward_us_per_step"] > 0
    assert ev["gpu_us_per_step"] == pytest.approx(ev["forward_us_per_step"] + ev["backward_us_per_step"])
    assert "forward" in both["message"] and "backward" in both["message"]


@pytest.mark.parametrize("name", ["bf16_causal_fwd/sdpa_efficient", "bf16_causal_fwd/sdpa_flash"])
def test_at203_silent_on_half_precision(name):
    assert findings(name, "AT203") == []


# --- AT302 host-sync -------------------------------------------------------------------------------
def test_at302_item_every_step():
    # A loop that reads .item() after each of 4 MLP calls per step (bench/gpu/profiler_calibration.py).
    (f,) = findings("calibration/mlp_item_sync.shapes", "AT302")
    assert f["where"]["op_chain"] == "aten::item > aten::_local_scalar_dense"
    assert f["evidence"]["syncs_per_step"] == 4 and f["evidence"]["apis"] == ["cudaStreamSynchronize"]
    idle = f["evidence"]["gpu_idle_us_after_each"]
    assert all(i > 0 for i in idle[:-1])
    assert idle[-1] is None  # the trace ends before the GPU runs again
    assert ".item()" in f["message"] and "loss.detach()" in f["fix"]


def test_at302_sync_inside_an_annotation_claims_no_more_than_it_waited():
    # HTA's DDP trace (A100): 8 cudaEventSynchronize per step directly inside DistributedDataParallel.forward, a
    # record_function block of ~100 ms. The block was taken for the op the sync ran in: 4.2 ms "per step without
    # the profiler" from syncs that held the CPU 26 us per step in all.
    trace = load(str(DATA / "hta_nccl_a100.json.gz"))
    syncs = [f for f in lint_trace(trace).findings if f["rule"] == "AT302"]
    assert syncs
    for f in syncs:
        assert f["impact"]["gpu_us_per_step"] <= f["evidence"]["cpu_wait_us_per_step"]
        assert f["evidence"]["recorded_gpu_idle_us_per_step"] <= f["evidence"]["cpu_wait_us_per_step"]


def test_at302_an_annotation_written_as_an_operator_is_no_op_either(tmp_path):
    # PyTorch 1.8-1.10 write record_function blocks with cat "Operator", as they write aten ops: the same DDP trace
    # with its annotations so written claimed the blocks' time again.
    doc = read_json(DATA / "hta_nccl_a100.json.gz")
    for event in doc["traceEvents"]:
        if event.get("cat") == "user_annotation":
            event["cat"] = "Operator"
    trace = load(write_json(doc, tmp_path / "operator_annotations.json"))
    syncs = [f for f in lint_trace(trace).findings if f["rule"] == "AT302"]
    assert syncs and all(f["impact"]["gpu_us_per_step"] <= f["evidence"]["cpu_wait_us_per_step"] for f in syncs)


@pytest.mark.parametrize("name", ["workloads/gpt2_sdpa_train", "bf16_causal_fwd/naive",
                                  "workloads/launch_bound_tiny_ops"])
def test_at302_silent_without_syncs(name):
    assert findings(name, "AT302") == []


# --- AT402 gpu-idle --------------------------------------------------------------------------------
def test_at402_launch_bound_step_idles():
    (f,) = findings("workloads/launch_bound_tiny_ops", "AT402")
    assert f["evidence"]["est_idle_share"] > 0.8 and f["evidence"]["recorded_idle_share"] > 0.8
    # It names what the step's critical path waits on (the CPU launching tiny ops), not the largest gap, and the
    # fix that takes it off the path, replayed: a CUDA graph saves most of the step.
    assert "critical path waits on launch-bound CPU" in f["message"]
    assert f["impact"]["whatif"] == "launches captured as CUDA graphs"
    assert 0.5 * f["evidence"]["est_step_us"] < f["impact"]["wall_us_per_step"] <= f["evidence"]["est_step_us"]
    gaps = [op for gap in f["evidence"]["largest_recorded_gaps"] for op in gap["cpu_ops"]]
    assert "aten::add" in gaps or "aten::mul" in gaps


@pytest.mark.parametrize("name", ["bf16_causal_fwd/naive", "bf16_causal_fwd/sdpa_math",
                                  "workloads/low_occupancy_kernel"])
def test_at402_silent_when_gpu_bound(name):
    assert findings(name, "AT402") == []


def test_at102_finds_the_unfused_chain_without_shapes():
    # Llama training with eager attention recorded without record_shapes (bench/gpu/profiler_calibration.py).
    (f,) = findings("calibration/llama_train_eager.plain", "AT102")
    assert f["evidence"]["shapes"] is False and "size estimated" in f["message"]
    assert "aten::softmax" in f["where"]["op_chain"] and f["impact"]["gpu_us_per_step"] > 0
    (shaped,) = findings("calibration/llama_train_eager.shapes", "AT102")
    assert shaped["where"]["op_chain"] == f["where"]["op_chain"]  # the same chain as with shapes
    # Its softmax's backward counts too (every SoftmaxBackward0 is the chain's: as many as its softmaxes): the
    # forward alone claimed 1.42 ms, with shapes the chain and its backward are 2.33 ms.
    assert f["evidence"]["backward_gpu_us_per_step"] > 700
    assert f["evidence"]["gpu_us_per_step"] == pytest.approx(shaped["evidence"]["gpu_us_per_step"], rel=0.1)


@pytest.mark.parametrize("name", ["calibration/llama_train_sdpa.plain", "calibration/bert_infer_fp16.plain",
                                  "calibration/vit_small_infer.plain"])
def test_at102_without_shapes_is_silent_on_fused_attention(name):
    assert findings(name, "AT102") == []


# --- One step, one figure: the GPU a step behind the CPU ----------------------------------------------------------


def test_at402_steps_do_not_overlap_when_the_gpu_runs_a_step_behind():
    # HTA's DDP rank: each step's kernels start ~160 ms after their launch and end in the next step. A window from
    # a step's start to its GPU work's end overlapped the next one: "235 ms idle of 377 ms" per step, in 5 steps of
    # ~216 ms (5 x 235 ms is more than the trace lasts).
    from attntrace.model.summary import profiler_cost

    trace = load(str(DATA / "hta_deep_queue_rank0_a100.json.gz"))
    (f,) = [f for f in lint_trace(trace).findings if f["rule"] == "AT402"]
    ev = f["evidence"]
    marker_steps = trace.steps["end"] - trace.steps["ts"]
    assert ev["recorded_window_us_per_step"] <= marker_steps.max() * 1.01
    assert ev["recorded_idle_us_per_step"] < ev["recorded_window_us_per_step"]
    # The figure summary gives as the step as recorded is AT402's.
    assert profiler_cost(trace)["recorded_step_us"] == pytest.approx(ev["recorded_window_us_per_step"], abs=1)
    # No steady step runs faster than the CPU needs for it: ~200 ms of CPU per step without the profiler (216 ms
    # recorded, 16 ms of it the profiler's); the drained queue's steps (165, 166 ms) made the median 166 ms.
    replayed = trace.replay.steady
    cpu = float(replayed["cpu_us"].median())
    assert 190e3 < cpu < 205e3
    assert ev["est_step_us"] >= cpu - 1
    # The time it adds is idle (the GPU's work is the same): ~119 ms, not the median's 86 ms.
    assert ev["est_idle_us_per_step"] > 110e3


def test_at402_names_gaps_of_the_steps_it_judged():
    # The first step of this capture (left out: 606 us against 396 us) had a 543 us gap before its kernel; it was
    # quoted as the largest gap of steps whose windows were shorter than it.
    (f,) = findings("bf16_gqa_fwd/flex", "AT402")
    assert f["where"]["steps"] == [2, 3]
    assert all(g["idle_us"] <= f["evidence"]["recorded_window_us_per_step"]
               for g in f["evidence"]["largest_recorded_gaps"])


def test_at501_takes_off_the_profiler_cost_the_replay_charges():
    # One step of 30 launches whose calls ran 2.75x the calibration host's: the replay charges each call 4.1 us,
    # AT501 took off the unscaled 1.5 us and quoted 450 us of launch cost without the profiler.
    trace = load(str(DATA / "kineto_gpu_metrics_input.json.gz"))
    (f,) = [f for f in lint_trace(trace).findings if f["rule"] == "AT501"]
    per_call = trace.replay.costs.runtime_call_us
    assert per_call > 4
    ev = f["evidence"]
    median_launch = ev["recorded_launch_cpu_us_per_step"] / ev["launches_per_step"]
    assert ev["launch_cpu_us_per_step"] == pytest.approx(ev["launches_per_step"] * (median_launch - per_call))


def test_at501_and_at402_give_one_step():
    # GPT-2 generate(): AT402 and summary said 107.873 ms per step (the CPU's median, which no step is shorter
    # than), the AT501 nested in it 107.639 ms (the steps' own median), and an idle 234 us apart.
    from attntrace.model.summary import profiler_cost

    trace = load(sample("heldout/gpt2_generate.plain"))
    findings = lint_trace(trace).findings
    (idle,) = [f for f in findings if f["rule"] == "AT402"]
    (launch,) = [f for f in findings if f["rule"] == "AT501"]
    assert launch.get("cause") == idle["fingerprint"]
    assert launch["evidence"]["est_step_us"] == idle["evidence"]["est_step_us"] == pytest.approx(
        profiler_cost(trace)["est_step_us"], abs=0.01)
    assert launch["evidence"]["est_idle_us_per_step"] == idle["evidence"]["est_idle_us_per_step"]


def test_at101_the_same_copies_with_and_without_shapes():
    # ViT-S training: the backward of `unbind` (q, k, v from one tensor) concatenates its gradients, 12 copies per
    # step on the same op chain in every capture. With shapes, `aten::cat`'s inputs read ['TensorList', 'Scalar'],
    # which the dtype test took for a cast: the copies showed only in the capture without shapes.
    def unbind(name: str) -> list[dict]:
        return [f for f in findings(name, "AT101") if f["where"]["op_chain"].endswith("UnbindBackward0 > aten::stack"
                                                                                      " > aten::cat")]
    (plain,) = unbind("heldout/vit_small_train.plain")
    (shaped,) = unbind("heldout/vit_small_train.shapes")
    assert shaped["evidence"]["gpu_us_per_step"] == pytest.approx(plain["evidence"]["gpu_us_per_step"], rel=0.01)
    assert shaped["identity"] == plain["identity"]


def test_at102_counts_the_copies_its_matmuls_make():
    # Hugging Face BERT in eager attention: AT101's 12 copies per step under `aten::matmul > aten::reshape >
    # aten::clone` (599.5 us, gone with SDPA) were nested in AT102 as counted in its cause, and AT102 claimed
    # 988.6 us without them (the timed eager -> SDPA saving was 1.93 ms, sample_traces/from_trace/).
    trace = load(sample("from_trace/bert_infer_eager"))
    found_all = lint_trace(trace).findings
    (cause,) = [f for f in found_all if f["rule"] == "AT102"]
    nested = [f for f in found_all if f["rule"] == "AT101" and f.get("cause") == cause["fingerprint"]]
    assert nested and all(f["where"]["op_chain"].startswith("aten::matmul >") for f in nested)
    copies = sum(f["evidence"]["gpu_us_per_step"] for f in nested)
    assert cause["evidence"]["matmul_copy_gpu_us_per_step"] == pytest.approx(copies)
    assert cause["impact"]["gpu_us_per_step"] == pytest.approx(988.6 + copies, abs=1)


def test_at101_fixes_fit_where_the_copy_is_made():
    # The flash backward copies q/k/v made contiguous as [B, H, S, D] back to [B, S, H, D] memory: its fix said to
    # avoid the fused op. Inside SDPA's math backend, the call already passes un-repeated K/V with
    # enable_gqa=True: its fix asked for exactly that.
    (flash,) = findings("bf16_causal_fwdbwd/sdpa_flash", "AT101")
    assert "_flash_attention_backward" in flash["where"]["op_chain"]
    assert "x.view(b, s, h, d).transpose(1, 2)" in flash["fix"] and "avoids" not in flash["fix"]
    repeats = [f for f in findings("bf16_decode_kvcache/sdpa_math", "AT101")
               if "repeat_interleave" in f["where"]["op_chain"]]
    assert repeats and all("math backend repeats the key/value heads itself" in f["fix"] for f in repeats)
    # A model's own repeat_kv keeps the fix that asks for enable_gqa=True.
    (model,) = [f for f in findings("from_trace/llama_generate_eager", "AT101") if "enable_gqa=True" in f["fix"]]
    assert "_scaled_dot_product_attention_math" not in model["where"]["op_chain"]
