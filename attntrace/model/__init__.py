"""The trace as polars tables plus metadata, behind one view (`Trace`): CPU ops and their tree, launch calls,
GPU activity by device and stream, steps, and the links CPU op -> launch -> kernel/memcpy/memset.

Read by concern: `tables` (events by kind), `optree`, `steps`, `links`, `intervals` (busy time per device),
`trace` (the view rules use)."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace import taxonomy
from attntrace.model.intervals import busy_us
from attntrace.model.tables import split_trace
from attntrace.model.trace import Trace, TraceMeta
from attntrace.read.raw import RawTrace

__all__ = ["Trace", "TraceMeta", "build", "busy_us"]


MAX_DUR_US = 1e11  # 28 hours: longer than any profiled span; a larger duration is a broken writer


def _clamp_durations(tables: Any) -> int:
    """Durations past MAX_DUR_US (1e308 in a hand-edited trace) would turn every sum into inf and every share
    into nan: read them as 0 and count them. The tables keep their rows, so the op args stay aligned."""
    count = 0
    for kind in ("ops", "launches", "gpu", "gpu_annotations", "python"):
        frame = getattr(tables, kind)
        if "dur" not in frame.columns or not frame.height:
            continue
        absurd = ~pl.col("dur").is_finite() | (pl.col("dur") > MAX_DUR_US)
        bad = frame.select(absurd.sum()).item()
        if bad:
            count += bad
            setattr(tables, kind, frame.with_columns(pl.when(absurd).then(0.0).otherwise(pl.col("dur")).alias("dur"))
                    .with_columns((pl.col("ts") + pl.col("dur")).alias("end")))
    return count


def build(raw: RawTrace) -> Trace:
    doc = raw.document
    tables = split_trace(raw)
    # Only the ops' args outlive this (for their input fields, decoded on demand); the events can go.
    doc.traceEvents = []
    clamped = _clamp_durations(tables)
    tax = taxonomy.load()
    gpu = tables.gpu
    names = gpu["name"].unique().sort()
    classes = tax.classify_all(names)
    known = pl.DataFrame({"name": names, "cls": classes, "group": [tax.group_of(c) for c in classes]},
                         schema={"name": pl.String, "cls": pl.String, "group": pl.String})
    gpu = gpu.join(known, on="name", how="left").with_columns(
        pl.when(pl.col("kind") == "kernel").then(pl.col("cls")).otherwise(pl.col("kind")).alias("cls"),
        pl.when(pl.col("kind") == "kernel").then(pl.col("group")).otherwise(pl.lit("copy")).alias("group"),
    ).sort("idx")
    meta = TraceMeta(
        devices=[d for d in (doc.deviceProperties or []) if isinstance(d, dict)],
        flags={k: bool(getattr(doc, k)) for k in ("record_shapes", "with_stack", "profile_memory", "with_flops",
                                                   "with_modules")},
        versions={k: getattr(doc, k) for k in ("schemaVersion", "cuda_driver_version", "cuda_runtime_version",
                                               "cupti_version") if getattr(doc, k) is not None},
        distributed=doc.distributedInfo if isinstance(doc.distributedInfo, dict) else None,
        dropped_events=raw.dropped_events,
        notes=list(raw.notes) + ([f"{clamped} event(s) with an absurd duration (over {MAX_DUR_US:.0e} us or not "
                                  "finite) read as 0"] if clamped else []),
        incomplete=raw.incomplete,
    )
    return Trace(path=raw.path, size=raw.size, meta=meta, ops=tables.ops, launches=tables.launches, gpu=gpu,
                 gpu_annotations=tables.gpu_annotations, flows=tables.flows, op_args=tables.op_args,
                 python=tables.python)
