"""The trace as polars tables plus metadata, behind one view (`Trace`): CPU ops and their tree, launch calls,
GPU activity by device and stream, steps, and the links CPU op -> launch -> kernel/memcpy/memset.

Read by concern: `tables` (events by kind), `optree`, `steps`, `links`, `intervals` (busy time per device),
`trace` (the view rules use)."""

from __future__ import annotations

import polars as pl

from attntrace import taxonomy
from attntrace.model.intervals import busy_us
from attntrace.model.tables import split_trace
from attntrace.model.trace import Trace, TraceMeta
from attntrace.reader import RawTrace

__all__ = ["Trace", "TraceMeta", "build", "busy_us"]


def build(raw: RawTrace) -> Trace:
    doc = raw.document
    tables = split_trace(raw)
    # Only the ops' args outlive this (for their input fields, decoded on demand); the events can go.
    doc.traceEvents = []
    tax = taxonomy.load()
    gpu = tables.gpu
    names = gpu["name"].unique().to_list()
    classes = [tax.classify(n) for n in names]
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
        notes=list(raw.notes),
        incomplete=raw.incomplete,
    )
    return Trace(path=raw.path, size=raw.size, meta=meta, ops=tables.ops, launches=tables.launches, gpu=gpu,
                 gpu_annotations=tables.gpu_annotations, flows=tables.flows, op_args=tables.op_args,
                 python=tables.python)
