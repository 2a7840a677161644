"""The trace as polars tables plus metadata, behind one view (`Trace`): CPU ops and their tree, launch calls,
GPU activity by device and stream, steps, and the links CPU op -> launch -> kernel/memcpy/memset.

Read by concern: `tables` (events by kind), `optree`, `steps`, `links`, `intervals` (busy time per device),
`trace` (the view rules use)."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.model import measured as measured_steps
from attntrace.model import taxonomy
from attntrace.model.intervals import busy_us
from attntrace.model.steps import MAX_SPAN_US
from attntrace.model.tables import Tables, split_trace
from attntrace.model.trace import Trace, TraceMeta
from attntrace.read.raw import RawTrace

__all__ = ["Trace", "TraceMeta", "build", "busy_us"]


MAX_DUR_US = MAX_SPAN_US  # a larger duration, or a GPU event's start this far from the others, is a broken writer's


def _clamp_durations(tables: Any) -> int:
    """Durations past MAX_DUR_US (1e308 in a hand-edited trace) would turn every sum into inf and every share
    into nan: read them as 0 and count them. The tables keep their rows, so the op args stay aligned."""
    count = 0
    for kind in ("ops", "launches", "gpu", "gpu_annotations", "python"):
        frame = getattr(tables, kind)
        if "dur" not in frame.columns or not frame.height:
            continue
        absurd = ~pl.col("dur").is_finite() | (pl.col("dur") > MAX_DUR_US)
        dur = frame["dur"]  # counted on the column itself: a query per table was a tenth of a small trace's time
        bad = int((~dur.is_finite() | (dur > MAX_DUR_US)).sum())
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
    ts = gpu["ts"]  # on the column itself, as _clamp_durations counts
    middle = ts.filter(ts.is_finite()).median()
    if middle is None:
        return 0
    stray = ~ts.is_finite() | ((ts - middle).abs() > MAX_DUR_US)
    count = int(stray.sum())
    if count:
        tables.gpu = gpu.filter(~stray)
    return count


# An aten op that lasts most of its thread's recorded span and holds this many aten ops is a broken duration more
# likely than an op (rules read the ops inside an aten op as its implementation, not the program's own).
ENGULFING_OPS = 50


def _engulfing_ops(ops: pl.DataFrame) -> list[str]:
    """Notes for aten ops that span 90% or more of their thread's events and hold ENGULFING_OPS other aten ops:
    one such op (a hand-edited `dur`) made AT102 find nothing, without a word. Ops with one name and one window
    get one note. The ops inside a window are counted from the thread's sorted starts and ends, not by a filter
    per wide op: every op of a thread whose ops share one time is wide (issue 43: 20k such ops took 13 s)."""
    aten = ops.filter(pl.col("name").str.starts_with("aten::")).select("idx", "name", "pid", "tid", "ts", "dur",
                                                                           "end")
    if aten.height <= ENGULFING_OPS:
        return []
    span = aten.group_by("pid", "tid").agg(pl.col("ts").min().alias("first"), pl.col("end").max().alias("last"))
    wide = (aten.join(span, on=["pid", "tid"], how="inner", nulls_equal=True)
            .filter(pl.col("dur") >= 0.9 * (pl.col("last") - pl.col("first"))))
    if wide.is_empty():
        return []
    threads = aten.partition_by("pid", "tid", as_dict=True)
    found: list[tuple[int, str]] = []
    for key, thread_wide in wide.partition_by("pid", "tid", as_dict=True).items():
        mine = threads[key]
        windows = (thread_wide.group_by("ts", "end").agg(pl.len().alias("ops"))
                   .sort("ts", pl.col("end"), descending=[False, True]))
        # Ops of the thread that start at or after a window and end at or before it: all of them, less those that
        # start before it, less those that end after it, plus those that do both (they hold the window, so they
        # are wide: counted among the windows), less the op itself.
        starts, ends = mine["ts"].sort(), mine["end"].sort()
        before = starts.search_sorted(windows["ts"], side="left").cast(pl.Int64)
        after = mine.height - ends.search_sorted(windows["end"], side="right").cast(pl.Int64)
        holding = _holding(windows["ts"].to_list(), windows["end"].to_list(), windows["ops"].to_list())
        counted = windows.with_columns(
            (mine.height - before - after + pl.Series(holding, dtype=pl.Int64) - 1).alias("inside"))
        named = (thread_wide.join(counted, on=["ts", "end"], how="inner")
                 .filter(pl.col("inside") >= ENGULFING_OPS)
                 .group_by("name", "ts", "end").agg(pl.col("idx").min(), pl.len().alias("ops"),
                                                    pl.col("inside").first()))
        for name, first_idx, same, inside in named.select("name", "idx", "ops", "inside").iter_rows():
            who = name if same == 1 else f"{same} {name} ops"
            verb = "spans" if same == 1 else "span"
            found.append((first_idx, f"{who} {verb} the whole of its thread's recorded time with {inside} aten ops "
                                     "inside it (a broken duration?): ops inside an aten op are read as its "
                                     "implementation"))
    return [note for _, note in sorted(found)]


def _holding(starts: list[float], ends: list[float], counts: list[int]) -> list[int]:
    """For each window (sorted by start, then by end from the latest), the ops of the windows that start before it
    and end after it: a Fenwick tree over the ends' ranks, filled in order of start, so O(n log n) in windows."""
    ranks = {end: rank for rank, end in enumerate(sorted(set(ends)), start=1)}
    tree = [0] * (len(ranks) + 1)
    held = [0] * len(starts)
    total = 0
    i = 0
    while i < len(starts):
        j = i
        while j < len(starts) and starts[j] == starts[i]:
            j += 1
        for k in range(i, j):  # windows of one start: those inserted so far all start before
            rank, at_or_below = ranks[ends[k]], 0
            while rank:
                at_or_below += tree[rank]
                rank -= rank & -rank
            held[k] = total - at_or_below
        for k in range(i, j):
            rank = ranks[ends[k]]
            while rank < len(tree):
                tree[rank] += counts[k]
                rank += rank & -rank
            total += counts[k]
        i = j
    return held


FLAGS = ("record_shapes", "with_stack", "profile_memory", "with_flops", "with_modules")
MAX_DEVICE_NAME = 1024
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
        # A device's name is matched against every peaks.toml entry and printed in every format: a name of
        # megabytes (a hostile trace's) took lint minutes. Real names are tens of characters.
        too_long = [isinstance(d.get("name"), str) and len(d["name"]) > MAX_DEVICE_NAME for d in devices]
        if any(too_long):
            odd.append(f"deviceProperties name (over {MAX_DEVICE_NAME} characters)")
            devices = [{k: v for k, v in d.items() if k != "name"} if long else d
                       for d, long in zip(devices, too_long, strict=True)]
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


def _unlinkable_launches(launches: pl.DataFrame) -> list[str]:
    """A note for kernel launch calls without a usable correlation id: Kineto gives every launch one, so these had
    ids past 64 bits, fractional ones or none, and the GPU work they queued is linked to no launch or op. Ids of 2**63
    and more unlinked every launch in silence: the rules that judge launches were skipped as if the trace had none."""
    if not launches.height or "correlation" not in launches.columns:
        return []
    lost = launches.filter(pl.col("is_launch") & pl.col("correlation").is_null()).height
    return [f"{lost} kernel launch call(s) without a usable correlation id (none, or not a 64-bit integer): the GPU "
            "work they queued is not linked to them"] if lost else []


def untimed_host(ops: pl.DataFrame, launches: pl.DataFrame) -> str | None:
    """What a trace whose CPU events all last 0 us (or none: read as 0) lost: the CPU ops' or the runtime calls'
    times, from which the step without the profiler is replayed. None when both have some time."""
    missing = "all last 0 us (the CPU's times are missing)"
    cpu_ops = ops["cat"] == "cpu_op"  # a mask, not a filtered copy of the ops with all their columns
    if cpu_ops.any() and not (cpu_ops & (ops["dur"].fill_null(0.0) > 0)).any():
        return f"{int(cpu_ops.sum())} CPU op(s) {missing}"
    if launches.height and not (launches["dur"].fill_null(0.0) > 0).any():
        return f"{launches.height} runtime call(s) {missing}"
    return None


def _untimed_host_note(tables: Tables) -> list[str]:
    lost = untimed_host(tables.ops, tables.launches)
    return [f"{lost}: the steps replayed without the profiler lack the CPU's work"] if lost else []


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
              + _engulfing_ops(tables.ops) + _unlinkable_launches(tables.launches) + _untimed_host_note(tables)
              + ([measured_note] if measured_note else []),
        incomplete=raw.incomplete,
        measured=measured,
        profiler=raw.profiler,
        file=raw.file,
    )
    return Trace(path=raw.path, size=raw.size, meta=meta, ops=tables.ops, launches=tables.launches, gpu=gpu,
                 gpu_annotations=tables.gpu_annotations, flows=tables.flows, op_args=tables.op_args,
                 python=tables.python)
