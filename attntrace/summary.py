"""Per-trace and per-step numbers: GPU busy time, CPU time, kernels, copies, launches, top kernels,
tensor-core share of GEMM time, and the attention backends found."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace import taxonomy
from attntrace.model import Trace, busy_us

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
    kernels = trace.gpu.filter(pl.col("kind") == "kernel")
    total = kernels["dur"].sum() or 0.0
    top = (kernels.group_by("name", "cls").agg(pl.len().alias("count"), pl.col("dur").sum().alias("us"))
           .sort(["us", "name"], descending=[True, False]).head(limit))
    return [{"name": name, "class": cls, "count": count, "us": _r(us), "share": _r(us / total if total else 0.0)}
            for name, cls, count, us in top.iter_rows()]


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


def summarize(trace: Trace) -> dict[str, Any]:
    steps = trace.step_table.drop("step_us")
    split = gemm_split(trace)
    gemm_total = sum(split.values())
    known = gemm_total - split["unknown"]
    gpu = trace.gpu_linked
    return {
        # A CPU-only trace still carries the machine's GPU in its metadata: name it only when GPU work ran.
        "device": (trace.meta.device(None).get("name") or "unknown GPU") if trace.has_gpu else None,
        "steps": steps.height if trace.has_step_markers else 0,
        "gpu_busy_us": _r(busy_us(gpu, [])["busy_us"][0]) if gpu.height else 0.0,
        "kernels": int((gpu["kind"] == "kernel").sum()),
        "memcpy": int((gpu["kind"] == "memcpy").sum()),
        "memset": int((gpu["kind"] == "memset").sum()),
        "launches": int(trace.launches["is_launch"].sum()),
        "launch_cpu_us": _r(trace.launches.filter(pl.col("is_launch"))["dur"].sum()),
        "tensor_core_share_of_gemm": _r((split["tensor_core"] + split["tf32"]) / known) if known else None,
        "gemm_us": {k: _r(v) for k, v in split.items()},
        "attention_backends": attention_backends(trace),
        "top_kernels": top_kernels(trace),
        "per_step": [{k: _r(v) if isinstance(v, float) else v for k, v in row.items()}
                     for row in steps.iter_rows(named=True)],
        "notes": trace.meta.notes,
        "incomplete": trace.meta.incomplete,
    }


def step_means(summary: dict[str, Any]) -> dict[str, float]:
    """Mean per step of the per-step numbers (the whole trace when it has no steps)."""
    rows = summary["per_step"]
    if not rows:
        return {}
    keys = [k for k in rows[0] if k != "step"]
    return {k: sum(row[k] for row in rows) / len(rows) for k in keys}
