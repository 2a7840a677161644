"""Each rule on real traces: where it must fire (with the right evidence) and where it must stay silent."""

from __future__ import annotations

from functools import cache

import pytest
from conftest import DATA, sample

from attntrace.model.loading import load
from attntrace.model.summary import summarize
from attntrace.report.engine import lint_trace


@cache
def report(name: str):
    return lint_trace(load(sample(name)))


def found(name: str, rule: str) -> list[dict]:
    return [f for f in report(name).findings if f["rule"] == rule]


# --- AT101 hidden-copy ------------------------------------------------------------------------------
def test_at101_naive_masked_fill_clone():
    (f,) = found("bf16_causal_fwd/naive", "AT101")
    assert f["where"]["op_chain"] == "aten::masked_fill > aten::clone > aten::copy_"
    assert f["evidence"]["bytes_per_copy"] == 4 * 16 * 2048 * 2048 * 2  # the bf16 score tensor
    assert f["evidence"]["copies_per_step"] == 1
    assert f["where"]["steps"] == [1, 2, 3]
    assert "masked_fill_" in f["fix"]
    assert f["impact"]["gpu_us_per_step"] > 200


def test_at101_backward_also_clones():
    chains = sorted(f["where"]["op_chain"] for f in found("bf16_causal_fwdbwd/naive", "AT101"))
    assert chains[0] == "aten::masked_fill > aten::clone > aten::copy_"
    assert "MaskedFillBackward0" in chains[1]
    # Both copies are the unfused chain's (the backward one by MaskedFillBackward0 cloning a tensor of the
    # scores' size): fusing the chain removes them, so both are AT102's consequences. The backward one was a
    # second top-level warning with a fix of its own.
    copies = found("bf16_causal_fwdbwd/naive", "AT101")
    assert all(f["evidence"]["in_unfused_attention"] for f in copies)
    assert all(f.get("subsumed_by") == "AT102" for f in copies)


@pytest.mark.parametrize("name", ["bf16_gqa_fwd/naive_inplace", "bf16_gqa_fwd/sdpa_repeat_kv",
                                  "bf16_decode_kvcache/naive"])
def test_at101_repeated_kv_heads_get_the_gqa_fix(name):
    # Hugging Face's repeat_kv (expand, then reshape to the query's heads) copies K and V every call.
    (f,) = [f for f in found(name, "AT101") if f["where"]["op_chain"].startswith("aten::reshape")]
    assert "enable_gqa=True" in f["fix"] and f["evidence"]["copies_per_step"] == 2
    assert all("enable_gqa" not in g["fix"] for g in found("bf16_causal_fwd/naive", "AT101"))


@pytest.mark.parametrize("name", ["bf16_causal_fwd/naive_inplace", "bf16_causal_fwd/sdpa_math",
                                  "bf16_causal_fwd/sdpa_flash"])
def test_at101_silent(name):
    # sdpa_math casts q/k/v with aten::to: casts are not hidden copies.
    assert found(name, "AT101") == []


# --- AT201 fp32-gemm -------------------------------------------------------------------------------
def test_at201_sdpa_math_upcast():
    (f,) = found("bf16_causal_fwd/sdpa_math", "AT201")
    assert f["evidence"]["cause"] == "sdpa-math-upcast"
    assert "upcast BFloat16" in f["message"] and "fp32" in f["message"]
    assert "allow_fp16_bf16_reduction_math_sdp" in f["fix"]
    assert f["evidence"]["gemms_per_step"] == 2
    assert all("_ffma_" in k for k in f["evidence"]["kernels"])


def test_at201_naive_fp32_suggests_tf32_or_bf16():
    (f,) = found("fp32_causal_fwd/naive", "AT201")
    assert f["evidence"]["cause"] == "fp32-inputs"
    assert "set_float32_matmul_precision" in f["fix"] and "bfloat16" in f["fix"]


@pytest.mark.parametrize("name", ["bf16_causal_fwd/naive", "bf16_causal_fwd/compiled", "workloads/gpt2_sdpa_train"])
def test_at201_silent_on_tensor_core_gemms(name):
    assert found(name, "AT201") == []


def test_at201_never_fires_on_tf32():
    # The A100 alexnet trace runs its convolutions as TF32 implicit GEMMs next to FP32 sgemms.
    # With the share threshold at 0 every FP32 GEMM is reported; the TF32 ones must still not be.
    from attntrace.checks import config
    from attntrace.checks.catalog import load_rules

    settings = config.build(load_rules(), {}, "test", ["AT201"], [], ["AT201.min_share=0"], None)
    trace = load(str(DATA / "hta_alexnet_a100.json.gz"))
    assert trace.gpu["name"].str.contains("tf32").any()
    findings = lint_trace(trace, settings).findings
    assert findings, "the ampere_sgemm kernels of this trace should fire"
    for f in findings:
        assert not any("tf32" in k for k in f["evidence"]["kernels"])


# --- AT301 mask-rebuilt ----------------------------------------------------------------------------
def test_at301_sdpa_math_rebuilds_mask():
    (f,) = found("bf16_causal_fwd/sdpa_math", "AT301")
    assert f["evidence"]["mask_shape"] == [2048, 2048]
    assert {"aten::ones", "aten::tril", "aten::where"} <= set(f["evidence"]["ops"])
    assert f["evidence"]["builds_per_step"] == 1 and f["evidence"]["sdpa_math_backend"] is True


@pytest.mark.parametrize("name", ["bf16_causal_fwd/naive", "bf16_causal_fwd/naive_inplace",
                                  "workloads/gpt2_eager_train"])
def test_at301_silent_when_mask_built_once(name):
    assert found(name, "AT301") == []


# --- AT401 low-occupancy ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["bf16_causal_fwd/sdpa_flash", "bf16_causal_fwd/sdpa_cudnn",
                                  "bf16_causal_fwd/sdpa_efficient", "bf16_causal_fwd/compiled"])
def test_at401_silent_on_kernels_that_run_low_occupancy_by_design(name):
    assert not found(name, "AT401")


@pytest.mark.parametrize(("name", "source"), [("bf16_causal_fwd/sdpa_flash", "reported"),
                                              ("bf16_causal_fwd/sdpa_cudnn", "computed")])
def test_summary_reports_occupancy_of_fused_attention(name, source):
    top = summarize(load(sample(name)))["top_kernels"][0]
    assert top["class"].startswith("attention_")
    assert top["occupancy_pct"] > 0 and top["occupancy_source"].startswith(source)


def test_at401_real_low_occupancy_is_warning():
    (f,) = found("workloads/low_occupancy_kernel", "AT401")
    assert f["severity"] == "warning"
    assert f["where"]["kernel"].startswith("attntrace_lowocc_scale")
    assert f["evidence"]["limited_by"] == "shared memory"
    assert f["evidence"]["occupancy_pct"] == pytest.approx(3.1)
    assert f["evidence"]["occupancy_source"].startswith("computed")
    assert f["evidence"]["share_of_step_gpu"] > 0.5


# --- AT501 launch-overhead -------------------------------------------------------------------------
def test_at501_launch_bound():
    (f,) = found("workloads/launch_bound_tiny_ops", "AT501")
    ev = f["evidence"]
    assert ev["launches_per_step"] == 401
    assert ev["launch_cpu_us_per_step"] > ev["gpu_busy_us_per_step"]
    api = ev["per_api"]["cudaLaunchKernel"]
    assert api["calls_per_step"] == 401 and 0 < api["median_us"] <= api["p95_us"]


@pytest.mark.parametrize("name", ["bf16_causal_fwd/naive", "workloads/gpt2_sdpa_train", "bf16_causal_fwd/sdpa_cudnn"])
def test_at501_silent_on_gpu_heavy_steps(name):
    assert found(name, "AT501") == []


def test_findings_sorted_and_deterministic():
    from attntrace.report.engine import assemble, sort_key

    first = assemble([report("bf16_causal_fwd/sdpa_math")])
    assert first["findings"] == sorted(first["findings"], key=sort_key)
    again = assemble([lint_trace(load(sample("bf16_causal_fwd/sdpa_math")))])
    assert first == again


def test_at501_one_slow_lazy_load_launch_is_not_launch_bound():
    # A100 alexnet: one cudaLaunchKernel takes 3 s (lazy module load), the other 78 take ~9 us.
    trace = load(str(DATA / "hta_alexnet_a100.json.gz"))
    assert trace.launches["dur"].max() > 1e6
    assert [f for f in lint_trace(trace).findings if f["rule"] == "AT501"] == []


def test_at201_one_finding_for_fp32_gemms_with_and_without_input_types_on_a_gpu_without_tf32():
    # HTA's compiled V100 training step: 219 fp32 GEMMs per step whose ops record float inputs and 74 whose ops
    # record no types came out as two warnings with one fix, the first saying "fp32 inputs with TF32 off" on a
    # GPU that has no TF32.
    trace = load(str(DATA / "hta_trace_diff_v100.json.gz"))
    (f,) = [f for f in lint_trace(trace).findings if f["rule"] == "AT201"]
    # 4 gemv kernels per step are left out (test_at201_silent_on_matrix_vector_products).
    assert f["evidence"]["cause"] == "fp32-inputs" and f["evidence"]["gemms_per_step"] == pytest.approx(289)
    assert "TF32 off" not in f["message"] and "this GPU has no TF32" in f["message"]
    assert "no TF32" in f["fix"] and "float16" in f["fix"]  # fp16 autocast, not TF32, on a GPU before Ampere
    # On an H200 (TF32 there, off by default) the reason names the switch.
    assert "fp32 inputs with TF32 off" in found("fp32_causal_fwd/naive", "AT201")[0]["message"]


def test_at201_silent_on_matrix_vector_products():
    # A batch-1 fp32 decode loop: every product is a cuBLAS gemv kernel, which TF32 left as fast (0.183 ms against
    # 0.181 ms) and bf16 made slower (0.244 ms) on the H200 (sample_traces/gemv/gemv_timings.json). AT201 said
    # tensor cores would save 75% of them.
    trace = load(sample("gemv/fp32_gemv_decode"))
    assert trace.gpu_linked["name"].str.contains("gemv2T").sum() == 40
    assert found("gemv/fp32_gemv_decode", "AT201") == []
    # The GEMMs beside them still count (HTA's V100 trace: its sgemm kernels, not its gemv ones).
    v100 = load(str(DATA / "hta_trace_diff_v100.json.gz"))
    (f,) = [f for f in lint_trace(v100).findings if f["rule"] == "AT201"]
    assert f["evidence"]["kernels"] and not any("gemv" in k for k in f["evidence"]["kernels"])


def test_at201_amd_matrix_core_gemms_are_not_cuda_core():
    trace = load(str(DATA / "hta_mi250_rocm6_2.json.gz"))
    assert [f for f in lint_trace(trace).findings if f["rule"] == "AT201"] == []


def test_at201_knows_a_pre_ampere_gpu_by_its_kernels_without_device_properties():
    # A PyTorch 1.8-era V100 trace has no deviceProperties; its cuDNN kernels are `volta_scudnn_*`. AT201 told it to
    # use bf16 autocast and allow_tf32, neither of which a V100 has.
    trace = load(str(DATA / "kineto_tb_plugin_resnet50_v100.json.gz"))
    assert not trace.meta.device(trace.devices[0] if trace.devices else None)
    findings = [f for f in lint_trace(trace).findings if f["rule"] == "AT201"]
    assert findings and all("no TF32" in f["fix"] and "bfloat16" not in f["fix"] for f in findings)
    # An H200's kernels name sm90 and its properties say 9.0: TF32 is offered there.
    assert "fp32 inputs with TF32 off" in found("fp32_causal_fwd/naive", "AT201")[0]["message"]
