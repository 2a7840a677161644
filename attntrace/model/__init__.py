"""The trace as polars tables plus metadata, behind one view (`Trace`): CPU ops and their tree, launch calls,
GPU activity by device and stream, steps, and the links CPU op -> launch -> kernel/memcpy/memset.

Read by concern: `tables` (events by kind), `optree`, `steps`, `links`, `intervals` (busy time per device),
`trace` (the view rules use)."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace import taxonomy
from attntrace.model import measured as measured_steps
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


def _drop_stray_gpu_events(tables: Any) -> int:
    """GPU events that start more than MAX_DUR_US from the middle of the others (a timestamp of 1e308 in a
    hand-edited trace made the step it fell in last 1e308 us): dropped and counted. The GPU table's rows are
    referred to by idx, not by position, so rows can go."""
    gpu = tables.gpu
    if not gpu.height:
        return 0
    middle = gpu.select(pl.col("ts").filter(pl.col("ts").is_finite()).median()).item()
    if middle is None:
        return 0
    stray = ~pl.col("ts").is_finite() | ((pl.col("ts") - middle).abs() > MAX_DUR_US)
    count = gpu.select(stray.sum()).item()
    if count:
        tables.gpu = gpu.filter(~stray)
    return count


# An aten op that lasts most of its thread's recorded span and holds this many aten ops is a broken duration more
# likely than an op (rules read the ops inside an aten op as its implementation, not the program's own).
ENGULFING_OPS = 50


def _engulfing_ops(ops: pl.DataFrame) -> list[str]:
    """Notes for aten ops that span 90% or more of their thread's events and hold ENGULFING_OPS other aten ops:
    one such op (a hand-edited `dur`) made AT102 find nothing, without a word."""
    aten = ops.filter(pl.col("name").str.starts_with("aten::"))
    if aten.height <= ENGULFING_OPS:
        return []
    span = aten.group_by("pid", "tid").agg(pl.col("ts").min().alias("first"), pl.col("end").max().alias("last"))
    wide = (aten.join(span, on=["pid", "tid"], how="inner", nulls_equal=True)
            .filter(pl.col("dur") >= 0.9 * (pl.col("last") - pl.col("first")))
            .select("idx", "name", "pid", "tid", "ts", "end").sort("idx"))
    notes = []
    for idx, name, pid, tid, ts, end in wide.iter_rows():
        inside = aten.filter((pl.col("pid") == pid) & (pl.col("tid") == tid) & (pl.col("ts") >= ts)
                             & (pl.col("end") <= end) & (pl.col("idx") != idx)).height
        if inside >= ENGULFING_OPS:
            notes.append(f"{name} spans the whole of its thread's recorded time with {inside} aten ops inside it "
                         "(a broken duration?): ops inside an aten op are read as its implementation")
    return notes


FLAGS = ("record_shapes", "with_stack", "profile_memory", "with_flops", "with_modules")
VERSIONS = ("schemaVersion", "cuda_driver_version", "cuda_runtime_version", "cupti_version")


def header(doc: Any) -> tuple[list[dict[str, Any]], dict[str, bool], dict[str, int], dict[str, Any] | None,
                              list[str]]:
    """The header fields the model uses, each kept when it has the type Kineto writes: devices (a list of
    objects), profiler flags (0/1 or a bool), versions (integers), distributedInfo (an object); and the names of
    those that were there with another type (each ignored alone, the rest kept)."""
    odd: list[str] = []
    devices: list[dict[str, Any]] = []
    if isinstance(doc.deviceProperties, list):
        devices = [d for d in doc.deviceProperties if isinstance(d, dict)]
    elif doc.deviceProperties is not None:
        odd.append("deviceProperties")
    flags = {}
    for name in FLAGS:
        value = getattr(doc, name)
        if value is not None and not (isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))):
            odd.append(name)
            value = None
        flags[name] = bool(value)
    versions = {}
    for name in VERSIONS:
        value = getattr(doc, name)
        if isinstance(value, int) and not isinstance(value, bool):
            versions[name] = value
        elif value is not None:
            odd.append(name)
    distributed = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else None
    if doc.distributedInfo is not None and distributed is None:
        odd.append("distributedInfo")
    return devices, flags, versions, distributed, odd


def build(raw: RawTrace) -> Trace:
    doc = raw.document
    tables = split_trace(raw)
    # Only the ops' args outlive this (for their input fields, decoded on demand); the events can go.
    doc.traceEvents = []
    clamped = _clamp_durations(tables)
    stray = _drop_stray_gpu_events(tables)
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
    devices, flags, versions, distributed, odd = header(doc)
    measured, measured_note = measured_steps.read(doc.attntrace_measured)
    meta = TraceMeta(
        devices=devices, flags=flags, versions=versions, distributed=distributed,
        dropped_events=raw.dropped_events,
        notes=list(raw.notes) + ([f"{clamped} event(s) with an absurd duration (over {MAX_DUR_US:.0e} us or not "
                                  "finite) read as 0"] if clamped else [])
              + ([f"{stray} GPU event(s) more than {MAX_DUR_US:.0e} us from the others ignored"] if stray else [])
              + ([f"{tables.odd_durations} event(s) with a negative or missing duration read as 0"]
                 if tables.odd_durations else [])
              + ([f'{tables.unclosed} "B" event(s) that no "E" closed ignored'] if tables.unclosed else [])
              + ([f'{tables.untimed} event(s) without a time ("ts") ignored'] if tables.untimed else [])
              + ([f"header field(s) of a type Kineto does not write ignored: {', '.join(odd)}"] if odd else [])
              + _engulfing_ops(tables.ops) + ([measured_note] if measured_note else []),
        incomplete=raw.incomplete,
        measured=measured,
    )
    return Trace(path=raw.path, size=raw.size, meta=meta, ops=tables.ops, launches=tables.launches, gpu=gpu,
                 gpu_annotations=tables.gpu_annotations, flows=tables.flows, op_args=tables.op_args,
                 python=tables.python)
