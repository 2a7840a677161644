"""Traces other people wrote are read right before any rule runs: every layout the reader meets, steps in every
Kineto generation, several devices and ranks, communication, modern and other vendors' kernels, CUDA graphs,
traces without step markers, Chrome's B/E events, and JSON that is not a trace."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import sample
from tracebuild import data, read_json, write_json

from attntrace import read
from attntrace.cli import main
from attntrace.model import taxonomy
from attntrace.model.loading import load
from attntrace.model.summary import summarize
from attntrace.report.engine import lint_trace

NAIVE = sample("bf16_causal_fwd/naive")


def _big(doc: dict[str, Any], minimum: int = read.CHUNK_BYTES + (1 << 20)) -> dict[str, Any]:
    """The document with its events repeated (ids and times shifted) until it is larger than one decode piece."""
    events = doc["traceEvents"]
    out, shift = [], 0
    size = len(orjson.dumps(events))
    for _ in range(minimum // size + 1):
        for e in events:
            e = dict(e)
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = e["ts"] + shift
            out.append(e)
        shift += 1e7
    return {**doc, "traceEvents": out}


# --- 1. no valid trace is refused ---------------------------------------------------------------------
def test_lists_after_the_event_list_do_not_end_it(tmp_path: Path):
    doc = read_json(NAIVE)
    props = doc.pop("deviceProperties")
    big = _big(doc)
    ordered = {k: v for k, v in big.items() if k != "traceEvents"}
    ordered = {**ordered, "traceEvents": big["traceEvents"], "deviceProperties": props,
               "INFO": ["one", "two"], "ERROR": [], "traceName": "x"}
    path = write_json(ordered, tmp_path / "after.json")
    trace = load(path)
    assert trace.meta.devices and trace.meta.devices[0]["name"] == "NVIDIA H200"
    assert trace.gpu.height == len([e for e in big["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy",
                                                                                        "gpu_memset")])


def test_real_trace_with_device_properties_after_events_is_read():
    summary = summarize(load(data("tracelens_h100_timesformer.json.gz")))
    assert summary["device"] == "NVIDIA H100 80GB HBM3" and summary["kernels"] > 400


def test_nan_in_a_large_trace_is_read_as_missing(tmp_path: Path):
    big = _big(read_json(NAIVE))
    text = orjson.dumps(big).replace(b'"dur":', b'"dur":NaN,"x":', 3)
    path = tmp_path / "nan.json"
    path.write_bytes(text)
    assert len(text) > read.CHUNK_BYTES
    trace = load(str(path))
    assert any("NaN" in note for note in trace.meta.notes)
    assert trace.gpu.height > 0


def test_json_error_offset_counts_from_the_file_start(tmp_path: Path):
    text = orjson.dumps(_big(read_json(NAIVE)))
    broken = text.index(b"},{", len(text) - 5000) + 1  # a comma between two events
    path = tmp_path / "broken.json"
    path.write_bytes(text[:broken] + b"@" + text[broken + 1:])
    with pytest.raises(read.TraceError) as err:
        load(str(path))
    offset = int(re.search(r"byte (\d+)", err.value.message).group(1))
    assert abs(offset - broken) < 64


# --- 2. steps in every Kineto generation --------------------------------------------------------------
def test_pytorch_1_8_operator_step_markers_are_steps():
    trace = load(data("kineto_tb_plugin_resnet50_v100.json.gz"))
    assert trace.has_step_markers and trace.step_info.source == "markers"
    assert sorted(trace.steps["step"].to_list()) == [5, 6, 7, 8, 9, 10]


def test_nested_overlapping_and_huge_step_markers_do_not_break_the_model(tmp_path: Path):
    doc = read_json(NAIVE)
    marks = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") == "user_annotation"]
    first = marks[0]
    nested = {**first, "name": "ProfilerStep#" + first["name"].split("#")[1], "ts": first["ts"] + 1,
              "dur": first["dur"] / 2}
    overlapping = {**first, "name": "ProfilerStep#77", "ts": first["ts"] + first["dur"] / 2, "dur": first["dur"]}
    huge = {**first, "name": "ProfilerStep#99999999999999999999", "ts": first["ts"] + 2}
    doc["traceEvents"] += [nested, overlapping, huge]
    trace = load(write_json(doc, tmp_path / "nested.json"))
    report = lint_trace(trace)
    assert report.info["steps"] >= 3
    assert any("64-bit" in n for n in report.info["summary"]["notes"])


# --- 3. ranks, devices and streams ------------------------------------------------------------------
def _as_second_rank(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The same run as another process driving device 1: CPU pids shifted, GPU pid/device 1."""
    gpu_cats = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
    out = []
    for e in doc["traceEvents"]:
        e = copy.deepcopy(e)
        if e.get("cat") in gpu_cats or (e.get("cat") == "ac2g" and e.get("ph") == "f"):
            e["pid"] = 1
            if isinstance(e.get("args"), dict) and "device" in e["args"]:
                e["args"]["device"] = 1
        elif isinstance(e.get("pid"), int):
            e["pid"] = e["pid"] + 100000
        out.append(e)
    return out


def test_merged_ranks_give_per_device_numbers_not_sums(tmp_path: Path):
    doc = read_json(NAIVE)
    single = summarize(load(NAIVE))
    doc["traceEvents"] = doc["traceEvents"] + _as_second_rank(doc)
    doc["deviceProperties"] = doc["deviceProperties"] + [{**doc["deviceProperties"][0], "id": 1}]
    trace = load(write_json(doc, tmp_path / "two_ranks.json"))
    merged = summarize(trace)
    assert [d["device"] for d in merged["devices"]] == [0, 1]
    assert merged["gpu_busy_us"] == pytest.approx(single["gpu_busy_us"])
    assert merged["steps"] == single["steps"]
    per_device = pl.DataFrame(merged["per_step"]).group_by("device").agg(pl.col("kernels").sum()).sort("device")
    assert per_device["kernels"].to_list() == [sum(r["kernels"] for r in single["per_step"])] * 2
    for row in merged["per_step"]:
        assert row["gpu_busy_us"] <= max(row["cpu_us"], 1e12)
    one = {(f["rule"], f["message"]) for f in lint_trace(load(NAIVE)).findings}
    two = {(f["rule"], f["message"]) for f in lint_trace(trace).findings}
    assert one == two  # "per step" counts are per step of one rank, not doubled


def test_rank_from_distributed_info_and_communication_beside_compute():
    trace = load(data("hta_nccl_a100.json.gz"))
    summary = summarize(trace)
    assert summary["rank"] == trace.meta.rank == 0
    (device,) = summary["devices"]
    assert device["streams"] >= 2 and device["comm_us"] > 0 and device["overlap_us"] > 0
    assert device["gpu_busy_us"] < device["compute_us"] + device["comm_us"]
    assert all(r["comm_us"] > 0 for r in summary["per_step"])
    findings = lint_trace(trace).findings
    assert all(f["where"]["rank"] == 0 and f["where"]["device"] == 0 for f in findings)


# --- 4-5, 7. kernel classes from real names ----------------------------------------------------------
REAL_NAMES = {
    # communication
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)": "communication",
    "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)": "communication",
    "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)": "communication",
    "void multimem_all_reduce_kernel<float>(float*, unsigned long)": "communication",
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, "
    "vllm::Signal*, __nv_bfloat16*, int, int)": "communication",
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*)": "communication",
    # attention backends
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
    "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, true, false, false, "
    "false, true, true, false, false>(Flash_fwd_params)": "attention_flash",
    "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
    "Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true>(Flash_fwd_params)": "attention_flash",
    "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128>>(Flash_bwd_params)":
        "attention_flash",
    "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::"
    "CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>>>>>>(flash::FlashAttnFwdSm90::Params)": "attention_flash3",
    "attn_fwd": "attention_amd",
    "_ZN5aiter26fmha_fwd_hd128_bf16_causalE": "attention_amd",
    "void ck_tile::kentry<256, 1, ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSAsync<>>>(...)":
        "attention_amd",
    "void vllm::paged_attention_v2_kernel<__nv_bfloat16, __nv_bfloat16, 128, 16, 128>(float*, float*)":
        "attention_paged",
    "kernel_unified_attention_2d": "attention_paged",
    "triton_tem_fused_flex_attention_0": "attention_flex",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0":
        "attention_cudnn",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
    "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)": "attention_efficient",
    # GEMMs
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "gemm_tensor_core",
    "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1_execute_segment_k_off_"
    "kernel__5x_cublas": "gemm_tensor_core",
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>(Params)":
        "gemm_tensor_core",
    "Cijk_Ailk_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT128x256x32_MI16x16x1_SN_LDSB1_AFC1": "gemm_tensor_core",
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_"
    "kernel__5x_cublas": "gemm_fp32_simt",
    "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1": "gemm_tf32",
    "triton_tem_fused_addmm_0": "gemm_triton_template",
    # Inductor kernels by what they do
    "triton_poi_fused__unsafe_view_add_3": "triton_pointwise",
    "triton_red_fused__unsafe_view_add_mean_mul_pow_rsqrt_1": "triton_reduction",
    "triton_per_fused__softmax_0": "triton_reduction",
    # not GEMMs though they mention fp8
    "void fp8_quantize_kernel<__nv_bfloat16>(float*)": "other",
}


@pytest.mark.parametrize(("name", "expected"), sorted(REAL_NAMES.items()))
def test_kernel_class(name: str, expected: str):
    assert taxonomy.load().classify(name) == expected


def test_nvjet_kernels_in_the_h200_samples_run_bf16_or_fp16_inputs():
    seen = 0
    for name in ("bf16_causal_fwd/naive", "bf16_causal_fwd/compiled", "workloads/gpt2_eager_train"):
        trace = load(sample(name))
        nvjet = trace.gpu_linked.filter(pl.col("name").str.starts_with("nvjet_") & pl.col("op").is_not_null())
        for op in nvjet["op"].unique().to_list():
            for ancestor in reversed(trace.op_ancestors(op)):
                _, types, _ = trace.op_input(ancestor)
                floats = [t for t in types or [] if t in ("float", "c10::BFloat16", "c10::Half")]
                if floats:
                    assert set(floats) <= {"c10::BFloat16", "c10::Half"}, (name, trace.op_names[ancestor])
                    seen += 1
                    break
    assert seen


def test_real_amd_trace_kernels_and_launches():
    trace = load(data("tracelens_mi300_falconsai.json.gz"))
    summary = summarize(trace)
    assert "amd_fmha" in summary["attention_backends"]
    assert summary["launches"] == summary["kernels"] > 0  # hipExtModuleLaunchKernel and friends count
    assert summary["gemm_us"]["tensor_core"] > 0
    assert all(k["occupancy_source"] in (None, "reported by the trace", "not computed for this vendor")
               for k in summary["top_kernels"])


def test_amd_device_gets_no_nvidia_occupancy():
    trace = load(data("hta_mi250_rocm6_2.json.gz"))
    assert trace.meta.vendor(trace.devices[0]) == "amd"
    report = lint_trace(trace)
    assert not [f for f in report.findings if f["rule"] == "AT401"]


def test_inductor_kernels_classed_by_what_they_do():
    trace = load(data("tracelens_mi300_torch_compile.json.gz"))
    groups = set(trace.gpu.filter(pl.col("name").str.starts_with("triton_"))["group"].to_list())
    assert groups <= {"elementwise", "reduction", "gemm", "attention"} and groups


# --- 6. other vendors' launch APIs --------------------------------------------------------------------
@pytest.mark.parametrize("api", ["hipExtModuleLaunchKernel", "hipModuleLaunchKernel", "hipLaunchKernel",
                                 "cuLaunchKernelEx", "cudaLaunchKernelExC"])
def test_launch_apis_of_every_vendor_count(tmp_path: Path, api: str):
    doc = read_json(NAIVE)
    for e in doc["traceEvents"]:
        if e.get("name") == "cudaLaunchKernel":
            e["name"] = api
    summary = summarize(load(write_json(doc, tmp_path / "launches.json")))
    assert summary["launches"] == summarize(load(NAIVE))["launches"]


# --- 7. CUDA graphs ---------------------------------------------------------------------------------
def test_graph_replayed_kernels_link_to_the_graph_launch(tmp_path: Path):
    doc = read_json(NAIVE)
    events = doc["traceEvents"]
    launches = [e for e in events if e.get("name") == "cudaLaunchKernel"]
    kernel_corr = {e["args"]["correlation"] for e in launches}
    # One graph launch replaces the step's launches; its kernels keep no usable correlation.
    graph = launches[0]
    graph["name"] = "cudaGraphLaunch"
    for e in events:
        if e.get("cat") == "kernel" and e["args"].get("correlation") in kernel_corr - {graph["args"]["correlation"]}:
            e["args"]["correlation"] = 0
    trace = load(write_json(doc, tmp_path / "graph.json"))
    kernels = trace.gpu_linked.filter(pl.col("kind") == "kernel")
    before = load(NAIVE).gpu_linked.filter(pl.col("kind") == "kernel")
    # Kernels queued before profiling began (no launch in the trace) stay unlinked; the replayed ones link.
    assert kernels["launch"].null_count() == before["launch"].null_count()
    assert "cudaGraphLaunch" in kernels["launch_api"].to_list()


def test_graph_capture_steps_are_not_judged_as_steady_steps(tmp_path: Path):
    doc = read_json(NAIVE)
    events = doc["traceEvents"]
    step = min((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
                and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    thread = {"pid": step["pid"], "tid": step["tid"], "cat": "cuda_runtime", "ph": "X", "dur": 1, "args": {}}
    events += [{**thread, "name": "cudaStreamBeginCapture", "ts": step["ts"] + 0.5},
               {**thread, "name": "cudaStreamEndCapture", "ts": step["ts"] + step["dur"] - 2}]
    trace = load(write_json(doc, tmp_path / "capture.json"))
    assert trace.steps.filter(pl.col("capture")).height == 1
    assert trace.step_count == 2
    assert any("graph capture" in n for n in summarize(trace)["notes"])


# --- 8. traces without step markers ------------------------------------------------------------------
def test_steps_inferred_from_a_recurring_top_level_annotation(tmp_path: Path):
    doc = read_json(sample("workloads/gpt2_eager_train"))
    for e in doc["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["name"] = "train_step"
    trace = load(write_json(doc, tmp_path / "no_markers.json"))
    assert trace.step_info.source == "inferred" and trace.has_step_markers
    report = lint_trace(trace)
    assert report.info["steps"] >= 2
    assert "AT402" not in {s["rule"] for s in report.skipped}
    assert any("inferred" in n for n in report.info["summary"]["notes"])


def test_steps_inferred_from_optimizer_steps_on_a_real_trace():
    corpus = Path(__file__).resolve().parents[2] / "shared/corpus/wild/AMD-AGI__TraceLens/tests/traces/mi300"
    path = corpus / "ddp_resnet18_no_pool/train_resnet18.json.gz"
    if not path.exists():
        pytest.skip("../shared/corpus is absent")
    trace = load(str(path))
    assert trace.step_info.source == "inferred" and "Optimizer.step" in trace.step_info.label
    assert trace.steps.height == 4


def test_without_steps_the_first_call_is_warm_up(tmp_path: Path):
    doc = read_json(NAIVE)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    trace = load(write_json(doc, tmp_path / "loop.json"))
    assert trace.step_info.source == "trace" and not trace.has_step_markers
    window = trace.steps.row(0, named=True)
    first_call = trace.ops.filter(pl.col("name") == "aten::matmul").sort("ts").row(0, named=True)
    assert window["ts"] >= first_call["end"]
    assert any("warm-up" in n for n in trace.step_info.notes)


# --- 9. Chrome B/E duration events -----------------------------------------------------------------
def test_begin_end_pairs_are_complete_events(tmp_path: Path):
    doc = read_json(NAIVE)
    events = []
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"):
            begin = {k: v for k, v in e.items() if k != "dur"}
            events += [{**begin, "ph": "B"}, {"ph": "E", "pid": e["pid"], "tid": e["tid"], "ts": e["ts"] + e["dur"]}]
        else:
            events.append(e)
    doc["traceEvents"] = events
    paired = load(write_json(doc, tmp_path / "be.json"))
    original = load(NAIVE)
    assert paired.ops.height == original.ops.height
    assert paired.steps.height == original.steps.height
    assert {f["message"] for f in lint_trace(paired).findings} == {f["message"] for f in lint_trace(original).findings}


# --- 10. non-traces are named ------------------------------------------------------------------------
def test_a_json_list_of_non_events_is_refused_in_one_line(tmp_path: Path):
    path = write_json([{"step": 1, "allocated": 10}, {"step": 2, "allocated": 12}], tmp_path / "memory.json")
    result = CliRunner().invoke(main, ["lint", path, NAIVE])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "no \"ph\" field" in result.stderr
