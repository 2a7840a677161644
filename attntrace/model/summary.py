"""Per-trace and per-step numbers: GPU busy time, CPU time, kernels, copies, launches, top kernels,
tensor-core share of GEMM time, and the attention backends found."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.model import Trace, busy_us, occupancy, taxonomy
from attntrace.model.critical_path import summarize as summarize_paths
from attntrace.model.measured import calibration_json
from attntrace.model.replay import RECORDED_STEP, Change
from attntrace.model.whatif import as_json, describe

SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused (overrideable)",
    "aten::_flash_attention_forward": "flash",
    "aten::_efficient_attention_forward": "efficient",
}
TOP_KERNELS = 5


def _r(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)


def top_kernels(trace: Trace, limit: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """The kernels that take the most GPU time, with their occupancy (reported by the trace when valid, else
    computed from the launch configuration; none on vendors whose limits differ from NVIDIA's)."""
    kernels = trace.gpu.filter(pl.col("kind") == "kernel")
    total = kernels["dur"].sum() or 0.0
    top = (kernels.group_by("name", "cls").agg(
        pl.len().alias("count"), pl.col("dur").sum().alias("us"), pl.col("occupancy").max(),
        pl.col("device", "block_threads", "registers", "shared_memory").first())
        .sort(["us", "name", "cls"], descending=[True, False, False]).head(limit))
    out = []
    for k in top.iter_rows(named=True):
        occupancy_pct, source = _occupancy(trace, k)
        out.append({"name": k["name"], "class": k["cls"], "count": k["count"], "us": _r(k["us"]),
                    "share": _r(k["us"] / total if total else 0.0), "occupancy_pct": occupancy_pct,
                    "occupancy_source": source})
    return out


def _occupancy(trace: Trace, kernel: dict[str, Any]) -> tuple[float | None, str | None]:
    if kernel["occupancy"] is not None and kernel["occupancy"] > 0:
        return _r(kernel["occupancy"]), "reported by the trace"
    if trace.meta.vendor(kernel["device"]) == "amd":
        return None, "not computed for this vendor"
    if not kernel["block_threads"]:
        return None, None
    computed = occupancy.theoretical(trace.meta.device(kernel["device"]), kernel["block_threads"],
                                     kernel["registers"] or 0, kernel["shared_memory"] or 0)
    return (computed.percent, "computed from the launch configuration") if computed else (None, None)


def gemm_split(trace: Trace) -> dict[str, float]:
    """GPU microseconds of GEMM kernels by unit: tensor cores, TF32 tensor cores, FP32 CUDA cores, unknown."""
    tax = taxonomy.load()
    unit_of = {}
    for cls in tax.gemm_classes:
        core = tax.by_id(cls).tensor_core  # type: ignore[union-attr]
        unit_of[cls] = {True: "tensor_core", "tf32": "tf32", False: "fp32_cuda_core"}.get(core, "unknown")
    gemms = trace.gpu.filter(pl.col("cls").is_in(list(unit_of)))
    split = dict.fromkeys(("tensor_core", "tf32", "fp32_cuda_core", "unknown"), 0.0)
    for cls, us in gemms.group_by("cls").agg(pl.col("dur").sum()).iter_rows():
        split[unit_of[cls]] += us
    return split


def attention_backends(trace: Trace) -> list[str]:
    tax = taxonomy.load()
    found = {SDPA_OPS[name] for name in trace.ops["name"].unique().to_list() if name in SDPA_OPS}
    for cls in trace.gpu["cls"].unique().to_list():
        backend = tax.attention_backend(cls) if cls else None
        if backend:
            found.add(backend)
    return sorted(found)


def device_summary(trace: Trace) -> list[dict[str, Any]]:
    """Per device: its name and vendor, and busy time (union of its streams) split into compute,
    communication and their overlap, over the whole trace. Each figure for all devices at once (a query per
    device took minutes on a trace that names thousands of devices)."""
    gpu = trace.gpu_linked
    comm = pl.col("group") == taxonomy.COMMUNICATION
    total, compute, communication = (_busy_by_device(gpu), _busy_by_device(gpu.filter(~comm)),
                                     _busy_by_device(gpu.filter(comm)))
    streams = dict(gpu.group_by("device").agg(pl.col("stream").drop_nulls().n_unique()).iter_rows())
    out = []
    for device in trace.devices:
        busy, on_compute, on_comm = total.get(device, 0.0), compute.get(device, 0.0), communication.get(device, 0.0)
        out.append({"device": device, "name": trace.device_name(device), "vendor": trace.meta.vendor(device),
                    "streams": streams.get(device, 0), "gpu_busy_us": _r(busy), "compute_us": _r(on_compute),
                    "comm_us": _r(on_comm), "overlap_us": _r(max(0.0, on_compute + on_comm - busy))})
    return out


def _busy_by_device(frame: pl.DataFrame) -> dict[Any, float]:
    return dict(busy_us(frame, []).select("device", "busy_us").iter_rows())


def profiler_cost(trace: Trace) -> dict[str, Any]:
    """How the trace was recorded and what recording cost: the profiler's settings, its estimated CPU time per
    step, and the step as recorded and as replayed without it (medians over steady steps, busiest device)."""
    result = trace.estimate
    out: dict[str, Any] = {
        "settings": result.settings,
        "events_per_step": {k: _r(v) for k, v in result.events_per_step.items()},
        "costs_from": trace.profiler_costs_from,
        "cpu_us_per_step": None, "recorded_step_us": None, "est_step_us": None, "gpu_busy_us": None,
        "est_idle_us": None, "reason": result.reason,
        # The costs' scale for this trace's host: its median launch call over the measuring host's.
        "host_factor": result.host_factor,
    }
    per_device = result.per_device()
    if per_device.height:
        busiest = per_device.sort(["gpu_busy_us", "device"], descending=[True, False]).row(0, named=True)
        out.update({"device": busiest["device"], "cpu_us_per_step": _r(busiest["profiler_cpu_us"]),
                    "recorded_step_us": _r(busiest["recorded_us"]), "est_step_us": _r(busiest["est_step_us"]),
                    "gpu_busy_us": _r(busiest["gpu_busy_us"]), "est_idle_us": _r(busiest["est_idle_us"])})
    out.update(measured_fields(trace, out))
    return out


# Every fix a replay can make at once: savings do not add, so "all fixes" is one replay of its own.
ALL_FIXES = Change(drop_syncs=None, pin_copies=None, graph=True)


def critical_path(trace: Trace) -> dict[str, Any] | None:
    """The steady steps' critical path per device (model/critical_path.py), and the step with every replayable fix
    at once (`all_fixes`); None where no replay can be made. A contract: summary's JSON `critical_path`."""
    replayed = trace.replay
    if replayed.reason or not replayed.table.height:
        return None
    paths = trace.judged_paths(trace.critical_path)
    devices = []
    for device in summarize_paths(paths):
        devices.append({**device, "step_us": _r(device["step_us"]),
                        "parts": [{"on": p["on"], "us": _r(p["us"]), "share": round(p["share"], 4)}
                                  for p in device["parts"]]})
    fixed = as_json(trace.whatif(ALL_FIXES))
    return {"devices": devices, "all_fixes": {"change": describe(ALL_FIXES), "devices": fixed}}


def measured_fields(trace: Trace, estimate: dict[str, Any]) -> dict[str, Any]:
    """The step without the profiler as the rules take it, beside the estimate (profiler_cost's est_step_us): the
    step measured in the capturing run where the trace carries one (attntrace.profile), the estimate's error
    against it, and the replay calibrated to it (model/measured.py)."""
    measured = trace.meta.measured
    calibration = trace.calibration
    step, idle, profiler_us = estimate["est_step_us"], estimate["est_idle_us"], estimate["cpu_us_per_step"]
    if calibration is not None:
        per_device = calibration.replay.per_device().filter(pl.col("device") == calibration.device)
        row = per_device.row(0, named=True)
        step, idle, profiler_us = (_r(row["est_step_us"]), _r(row["est_idle_us"]), _r(row["profiler_cpu_us"]))
    measured_us = measured.step_us if measured is not None else None
    est = estimate["est_step_us"]
    # Where nothing was measured: the range the estimate lies in, from the calibration's spread for traces recorded
    # like this one (attntrace/profiler_spread.toml).
    spread = trace.estimate_spread if measured_us is None and est is not None else None
    est_range = (spread.step_range(est, estimate["cpu_us_per_step"] or 0.0, estimate["gpu_busy_us"] or 0.0)
                 if spread is not None else None)
    return {
        "est_step_range_us": [_r(v) for v in est_range] if est_range else None,
        "est_spread": {"group": spread.group, "label": spread.label,
                       "cost_ratio": [spread.cost_ratio_low, spread.cost_ratio_high],
                       "captures": spread.captures} if spread is not None else None,
        "step_basis": "measured" if measured_us is not None else "estimated" if est is not None else None,
        # The program's step without the profiler: measured where the trace has it, else the estimate.
        "step_us": _r(measured_us) if measured_us is not None else est,
        "measured_step_us": _r(measured_us),
        "est_error": round((est - measured_us) / measured_us, 4) if measured_us and est is not None else None,
        # The replay the rules judge (calibrated where a step was measured): its step, idle and profiler cost.
        "replay_step_us": step, "replay_idle_us": idle, "replay_profiler_cpu_us": profiler_us,
        "measured": measured.as_json() if measured is not None else None,
        "calibration": calibration_json(calibration),
    }


def summarize(trace: Trace, with_path: bool = False) -> dict[str, Any]:
    """The summary of one trace; with_path: its critical path too (a second replay: `summary` asks, lint does not)."""
    steps = trace.step_table.drop("step_us")
    # Each step's own figures, and whether it is one of the steady steps whose medians the profiler line gives.
    steady = trace.estimate.steady.select("step", "device", pl.lit(True).alias("steady"))
    # Each step's estimate, and the calibrated replay's step where a step was measured (null otherwise).
    calibrated = (trace.calibration.replay.table if trace.calibration is not None else trace.estimate.table.clear()
                  ).select("step", "device", pl.col("est_step_us").alias("calibrated_step_us"))
    replayed = (trace.estimate.table
                .select("step", "device", RECORDED_STEP.alias("recorded_step_us"), "est_step_us", "profiler_cpu_us")
                .join(calibrated, on=["step", "device"], how="left", nulls_equal=True)
                .join(steady, on=["step", "device"], how="left", nulls_equal=True)
                .with_columns(pl.col("steady").fill_null(False)))
    steps = steps.join(replayed, on=["step", "device"], how="left", nulls_equal=True)
    split = gemm_split(trace)
    gemm_total = sum(split.values())
    known = gemm_total - split["unknown"]
    gpu = trace.gpu_linked
    devices = device_summary(trace)
    info = trace.step_info
    return {
        # A CPU-only trace still carries the machine's GPU in its metadata: name it only when GPU work ran.
        "device": (trace.device_name(trace.devices[0] if trace.devices else None) or "unknown GPU")
        if trace.has_gpu else None,
        "rank": trace.meta.rank,
        "steps": steps["step"].n_unique() if trace.has_step_markers else 0,
        "steps_source": info.source,
        "steps_from": info.label,
        # The busiest device's busy time: devices run side by side, so their times are never added.
        "gpu_busy_us": max((d["gpu_busy_us"] for d in devices), default=0.0),
        "kernels": int((gpu["kind"] == "kernel").sum()),
        "memcpy": int((gpu["kind"] == "memcpy").sum()),
        "memset": int((gpu["kind"] == "memset").sum()),
        "launches": int(trace.launches["is_launch"].sum()),
        "launch_cpu_us": _r(trace.launches.filter(pl.col("is_launch"))["dur"].sum()),
        "tensor_core_share_of_gemm": _r((split["tensor_core"] + split["tf32"]) / known) if known else None,
        "gemm_us": {k: _r(v) for k, v in split.items()},
        "attention_backends": attention_backends(trace),
        "devices": devices,
        "top_kernels": top_kernels(trace),
        "per_step": [{k: _r(v) if isinstance(v, float) else v for k, v in row.items()}
                     for row in steps.iter_rows(named=True)],
        "notes": [*trace.meta.notes, *info.notes, *trace.clock_notes],
        "incomplete": trace.meta.incomplete,
        "profiler": profiler_cost(trace),
        **({"critical_path": critical_path(trace)} if with_path else {}),
    }


PER_STEP_NUMBERS = ("cpu_us", "gpu_busy_us", "compute_us", "comm_us", "overlap_us", "kernels", "memcpy", "memset",
                    "kernel_us", "launches", "launch_cpu_us")


def step_means(summary: dict[str, Any]) -> dict[str, float]:
    """Mean per step of the per-step numbers (the whole trace when it has no steps)."""
    rows = summary["per_step"]
    if not rows:
        return {}
    return {k: sum(row[k] for row in rows) / len(rows) for k in PER_STEP_NUMBERS if k in rows[0]}
