"""Per-step GPU timeline by kernel class, with the findings' spans: the data behind the HTML report's
timeline chart (plain numbers, no plotting here). Times are milliseconds from the step's start on the GPU:
its CPU start, or later when the GPU was still busy with earlier work."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.model import Trace
from attntrace.model.intervals import merged_runs
from attntrace.report.flagged import resolve

# Chart groups in legend order; "idle" is the rest of the step window.
GROUPS = ("attention", "GEMM tensor-core", "GEMM FP32", "GEMM other", "elementwise", "Triton", "copies",
          "communication", "other", "idle")
MERGE_SHARE = 1 / 2000  # gaps shorter than this share of the step are drawn closed (bounded marks per step)


def group_of(kind: str | None, cls: str | None) -> str:
    """The chart group of a GPU event. Classes the chart does not know (a newer taxonomy) fall in "other"."""
    cls = cls or ""
    if kind in ("memcpy", "memset") or cls == "copy":
        return "copies"
    if cls.startswith("attention"):
        return "attention"
    if cls in ("gemm_tensor_core", "gemm_tf32"):
        return "GEMM tensor-core"
    if cls == "gemm_fp32_simt":
        return "GEMM FP32"
    if cls.startswith("gemm"):
        return "GEMM other"
    if cls in ("elementwise", "cast", "reduction"):
        return "elementwise"
    if cls == "triton":
        return "Triton"
    if any(word in cls for word in ("comm", "nccl", "rccl", "collective")):
        return "communication"
    return "other"


def _gpu_windows(trace: Trace, gpu: pl.DataFrame) -> pl.DataFrame:
    """Per step: its first GPU start, its last GPU end, and when the GPU became free of earlier work
    (kernels queued by the step before, or before profiling). A step's row starts at the later of its CPU
    start and that moment, so that time the GPU spent on earlier steps is not drawn as idle."""
    span = gpu.group_by("step").agg(pl.col("ts").min().alias("gpu_start"), pl.col("end").max().alias("gpu_end"))
    reach = (trace.gpu.select("ts", "end").sort("ts").with_columns(pl.col("end").cum_max().alias("free"))
             .select(pl.col("ts").alias("before"), "free"))
    if not span.height or not reach.height:
        return span.with_columns(pl.lit(None, dtype=pl.Float64).alias("free"))
    return span.sort("gpu_start").join_asof(reach, left_on="gpu_start", right_on="before", strategy="backward",
                                            allow_exact_matches=False).drop("before")


def _by_step(frame: pl.DataFrame) -> dict[Any, list[tuple[Any, ...]]]:
    """The rows of a frame whose first column is the step, without it, grouped by step in their order."""
    grouped: dict[Any, list[tuple[Any, ...]]] = {}
    for step, *rest in frame.iter_rows():
        grouped.setdefault(step, []).append(tuple(rest))
    return grouped


def build(trace: Trace, findings: list[dict[str, Any]]) -> dict[str, Any]:
    """{"steps": [{"step", "ms", "segments": [{"group", "start", "end"}], "flagged": [{"rule", "fingerprint",
    "start", "end"}]}], "groups": [present groups in legend order]}."""
    steps = trace.steps
    if not steps.height:
        return {"steps": [], "groups": []}
    gpu = trace.gpu_linked.filter(pl.col("step").is_not_null()).select("step", "kind", "cls", "ts", "end")
    pairs = gpu.select("kind", "cls").unique()
    pairs = pairs.with_columns(pl.Series("group", [group_of(k, c) for k, c in pairs.iter_rows()], dtype=pl.String))
    gpu = gpu.join(pairs, on=["kind", "cls"], how="left", nulls_equal=True)
    windows = (steps.join(_gpu_windows(trace, gpu), on="step", how="left")
               .with_columns(pl.max_horizontal("end", "gpu_end").alias("stop"),
                             pl.max_horizontal("ts", pl.min_horizontal("free", "gpu_start")).alias("origin"))
               .with_columns(((pl.col("stop") - pl.col("origin")) * MERGE_SHARE).alias("gap"))
               .select("step", "origin", "stop", "gap"))
    gpu = gpu.join(windows, on="step")
    segments = merged_runs(gpu, ["step", "group"], "gap").join(windows, on="step") if gpu.height else gpu
    busy = merged_runs(gpu, ["step"], "gap") if gpu.height else gpu

    spans = resolve(trace, findings)
    # Each step's rows, in their order, from one pass over each table (a filter per step was two queries a step).
    step_segments = _by_step(segments.select("step", "group", "ts", "end")) if segments.height else {}
    step_busy = _by_step(busy.select("step", "ts", "end")) if busy.height else {}
    out = []
    present: set[str] = set()
    for step, origin, stop, _ in windows.sort("step").iter_rows():
        def ms(t: float, origin: float = origin) -> float:
            return round((t - origin) / 1e3, 4)

        seg = [{"group": g, "start": ms(a), "end": ms(b)} for g, a, b in step_segments.get(step, ())]
        cursor = origin
        for a, b in step_busy.get(step, ()):
            if a > cursor:
                seg.append({"group": "idle", "start": ms(cursor), "end": ms(a)})
            cursor = max(cursor, b)
        if stop > cursor:
            seg.append({"group": "idle", "start": ms(cursor), "end": ms(stop)})
        present.update(s["group"] for s in seg)
        flagged = [{"rule": findings[s.finding]["rule"], "fingerprint": findings[s.finding]["fingerprint"],
                    "start": ms(s.ts), "end": ms(s.end)} for s in spans if s.step == step]
        out.append({"step": step, "ms": ms(stop), "segments": seg, "flagged": flagged})
    return {"steps": out, "groups": [g for g in GROUPS if g in present]}
