"""The trace as polars tables plus metadata: CPU ops with their tree, launch calls, GPU activity, steps,
and the links between them (CPU op -> launch -> kernel/memcpy/memset).

Events are split by kind with column extraction at C speed (attrgetter over the decoded structs), so the
model costs little beyond the decode itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from typing import Any

import polars as pl

from attntrace import taxonomy
from attntrace.reader import Args, Event, RawTrace, decode_raw

# Categories by kind, current and older spellings (TRACE_FORMAT.md).
CPU_OP_CATS = {"cpu_op": "cpu_op", "Operator": "cpu_op", "user_annotation": "user_annotation"}
RUNTIME_CATS = {"cuda_runtime": "runtime", "Runtime": "runtime", "cuda_driver": "driver"}
GPU_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
            "gpu_memset": "memset", "Memset": "memset"}
FLOW_CATS = {"ac2g", "async_cpu_to_gpu", "async", "async_gpu", "fwdbwd"}
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
               "cudaLaunchCooperativeKernel", "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel")

_EMPTY_ARGS = Args()
PY_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<function>.+)$")
# Frames that are not the user's code: the interpreter, torch and installed libraries.
LIBRARY_FRAMES = r"^<|torch/|site-packages/|dist-packages/|click/|contextlib|threading\.py|runpy"


@dataclass(frozen=True)
class TraceMeta:
    devices: list[dict[str, Any]]
    flags: dict[str, bool]
    versions: dict[str, Any]
    distributed: dict[str, Any] | None
    dropped_events: int
    notes: list[str] = field(default_factory=list)
    incomplete: bool = False

    def device(self, index: int | None) -> dict[str, Any]:
        """Properties of a GPU by index; the first one when the index is unknown."""
        for props in self.devices:
            if props.get("id") == index:
                return props
        return self.devices[0] if self.devices else {}


def _series(name: str, values: list[Any], dtype: pl.DataType | type[pl.DataType]) -> pl.Series:
    """A typed column; values of another type are coerced, and a column that cannot be is kept as text."""
    for strict in (True, False):
        try:
            return pl.Series(name, values, dtype=dtype, strict=strict)
        except (TypeError, OverflowError, pl.exceptions.PolarsError):
            continue
    return pl.Series(name, [None if v is None else str(v) for v in values], dtype=pl.String)


def _ids(name: str, values: list[Any]) -> pl.Series:
    """pid/tid: integers in most traces, strings ("Spans", "") in some; keep one type per column."""
    try:
        return pl.Series(name, values, dtype=pl.Int64, strict=True)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        return pl.Series(name, [str(v) for v in values], dtype=pl.String)


def _base_columns(events: list[Event]) -> dict[str, pl.Series]:
    ts = _series("ts", list(map(attrgetter("ts"), events)), pl.Float64)
    dur = _series("dur", list(map(attrgetter("dur"), events)), pl.Float64).fill_null(0.0).clip(lower_bound=0.0)
    return {
        "name": pl.Series("name", list(map(attrgetter("name"), events)), dtype=pl.String),
        "cat": pl.Series("cat", list(map(attrgetter("cat"), events)), dtype=pl.String),
        "pid": _ids("pid", list(map(attrgetter("pid"), events))),
        "tid": _ids("tid", list(map(attrgetter("tid"), events))),
        "ts": ts,
        "dur": dur,
    }


def _args_columns(args: list[Args], fields: dict[str, pl.DataType | type[pl.DataType]]) -> dict[str, pl.Series]:
    return {name: _series(name, list(map(attrgetter(name), args)), dtype) for name, dtype in fields.items()}


def _frame(events: list[Event], arg_fields: dict[str, Any]) -> pl.DataFrame:
    columns = _base_columns(events)
    args = [e.args or _EMPTY_ARGS for e in events]
    columns.update(_args_columns(args, arg_fields))
    frame = pl.DataFrame(columns)
    if "external_id_old" in frame.columns:
        frame = frame.with_columns(pl.coalesce("external_id", "external_id_old").alias("external_id")).drop(
            "external_id_old")
    return frame.with_columns((pl.col("ts") + pl.col("dur")).alias("end"))


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The pieces of one kind in file order, numbered (idx) across pieces; types widen where pieces differ
    (integer pids in one, string pids in another)."""
    whole = frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical_relaxed")
    return whole.with_row_index("idx")


_ID_FIELDS = {"external_id": pl.Int64, "external_id_old": pl.Int64}
_GPU_FIELDS = {**_ID_FIELDS, "correlation": pl.Int64, "registers": pl.Int64, "shared_memory": pl.Int64,
               "blocks_per_sm": pl.Float64, "occupancy": pl.Float64, "device": pl.Int64, "bytes": pl.Int64}


def _volume(dims: list[int] | None) -> int | None:
    """x*y*z of a grid or block, or None when the trace does not give it."""
    if not dims:
        return None
    out = 1
    for d in dims:
        out *= d
    return out


@dataclass
class Trace:
    path: str
    size: int
    meta: TraceMeta
    ops: pl.DataFrame  # cpu_op and user_annotation: idx, name, cat, pid, tid, ts, dur, end, external_id, ...
    launches: pl.DataFrame  # runtime and driver calls: ..., correlation, external_id, api_kind, is_launch
    gpu: pl.DataFrame  # kernels, memcpys, memsets: ..., kind, cls, correlation, launch configuration
    gpu_annotations: pl.DataFrame
    flows: pl.DataFrame
    op_args: list[Args]  # each op's args, in ops-table order, for its raw input fields
    python: pl.DataFrame  # python_function frames (with_stack): name "file.py(line): func", pid, tid, ts, end

    # --- steps ------------------------------------------------------------------------------------
    @cached_property
    def steps(self) -> pl.DataFrame:
        """One row per ProfilerStep#N (CPU side), or one row spanning the whole trace when there are none."""
        marks = (self.ops.filter(pl.col("cat") == "user_annotation")
                 .with_columns(pl.col("name").str.extract(r"^ProfilerStep#(\d+)$").cast(pl.Int64).alias("step"))
                 .filter(pl.col("step").is_not_null())
                 .unique("step", keep="first").sort("step")
                 .select("step", "ts", "end"))
        if marks.height:
            return marks
        starts = [f["ts"].min() for f in (self.ops, self.launches, self.gpu) if f.height]
        ends = [f["end"].max() for f in (self.ops, self.launches, self.gpu) if f.height]
        if not starts:
            return pl.DataFrame({"step": [], "ts": [], "end": []},
                                schema={"step": pl.Int64, "ts": pl.Float64, "end": pl.Float64})
        return pl.DataFrame({"step": [-1], "ts": [min(starts)], "end": [max(ends)]})

    @cached_property
    def step_table(self) -> pl.DataFrame:
        """One row per step: step, cpu_us (the step's CPU span), gpu_busy_us, kernels, memcpy, memset,
        kernel_us, launches, launch_cpu_us, and step_us = max(cpu_us, gpu_busy_us)."""
        steps = self.steps.select("step", (pl.col("end") - pl.col("ts")).alias("cpu_us"))
        gpu = self.gpu_linked.filter(pl.col("step").is_not_null())
        counts = gpu.group_by("step").agg(
            (pl.col("kind") == "kernel").sum().alias("kernels"),
            (pl.col("kind") == "memcpy").sum().alias("memcpy"),
            (pl.col("kind") == "memset").sum().alias("memset"),
            pl.col("dur").filter(pl.col("kind") == "kernel").sum().alias("kernel_us"))
        launches = self.launches_linked.filter(pl.col("is_launch") & pl.col("step").is_not_null()).group_by(
            "step").agg(pl.len().alias("launches"), pl.col("dur").sum().alias("launch_cpu_us"))
        busy = busy_us(gpu, ["step"]).rename({"busy_us": "gpu_busy_us"})
        table = (steps.join(busy, on="step", how="left").join(counts, on="step", how="left")
                 .join(launches, on="step", how="left").sort("step"))
        return table.with_columns(
            pl.col("gpu_busy_us", "kernel_us", "launch_cpu_us").cast(pl.Float64).fill_null(0.0),
            pl.col("kernels", "memcpy", "memset", "launches").fill_null(0).cast(pl.Int64),
        ).with_columns(pl.max_horizontal("cpu_us", "gpu_busy_us").alias("step_us"))

    @property
    def has_step_markers(self) -> bool:
        return bool(self.steps.height) and self.steps["step"][0] != -1

    def _assign_step(self, frame: pl.DataFrame) -> pl.DataFrame:
        steps = self.steps
        if not steps.height or not frame.height:
            return frame.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
        joined = frame.sort("ts").join_asof(
            steps.rename({"ts": "step_ts", "end": "step_end"}), left_on="ts", right_on="step_ts",
            strategy="backward")
        return (joined.with_columns(
            pl.when(pl.col("ts") <= pl.col("step_end")).then(pl.col("step")).otherwise(None).alias("step"))
            .drop("step_ts", "step_end").sort("idx"))

    # --- links ------------------------------------------------------------------------------------
    @cached_property
    def launches_linked(self) -> pl.DataFrame:
        """Launch calls with their step and launching op (innermost CPU op around them on the thread)."""
        frame = self._assign_step(self.launches)
        return frame.with_columns(pl.Series("op", self._innermost_ops(frame), dtype=pl.Int64))

    @cached_property
    def gpu_linked(self) -> pl.DataFrame:
        """GPU activity with its launch (by correlation, else by flow), launching op and step.

        A GPU event takes the step of the CPU call that launched it. One with no recorded launch (work
        queued before profiling began, or a dropped launch) takes the GPU-side ProfilerStep window that it
        starts in; only a trace with no launch links at all falls back to the CPU step windows."""
        launches = self.launches_linked.select(
            pl.col("idx").alias("launch"), pl.col("correlation"), pl.col("op"),
            pl.col("step").alias("launch_step"), pl.col("name").alias("launch_api"))
        launches = launches.filter(pl.col("correlation").is_not_null()).unique("correlation", keep="first")
        gpu = self._correlation_from_flows(self.gpu)
        linked = gpu.join(launches, on="correlation", how="left")
        if linked["launch"].is_not_null().any():
            by_time = self._gpu_step_windows(linked)
        else:
            by_time = self._assign_step(linked.drop("launch_step")).select("idx", pl.col("step").alias("time_step"))
        return (linked.join(by_time, on="idx", how="left")
                .with_columns(pl.coalesce("launch_step", "time_step").alias("step"))
                .drop("launch_step", "time_step").sort("idx"))

    def _gpu_step_windows(self, gpu: pl.DataFrame) -> pl.DataFrame:
        marks = (self.gpu_annotations
                 .with_columns(pl.col("name").str.extract(r"^ProfilerStep#(\d+)$").cast(pl.Int64).alias("time_step"))
                 .filter(pl.col("time_step").is_not_null())
                 .select("time_step", pl.col("ts").alias("w_ts"), pl.col("end").alias("w_end")).sort("w_ts"))
        if not marks.height or not gpu.height:
            return gpu.select("idx", pl.lit(None, dtype=pl.Int64).alias("time_step"))
        joined = gpu.select("idx", "ts").sort("ts").join_asof(marks, left_on="ts", right_on="w_ts",
                                                              strategy="backward")
        return joined.select("idx", pl.when(pl.col("ts") <= pl.col("w_end")).then(pl.col("time_step"))
                             .alias("time_step"))

    def _correlation_from_flows(self, gpu: pl.DataFrame) -> pl.DataFrame:
        """Older traces link launch and GPU event only by an s/f flow pair: recover the correlation."""
        if not gpu.height or gpu["correlation"].null_count() == 0 or not self.flows.height:
            return gpu
        flows = self.flows.filter(pl.col("cat") != "fwdbwd")
        starts = flows.filter(pl.col("ph") == "s").select("cat", "id", pl.col("ts").alias("s_ts"),
                                                           pl.col("tid").cast(pl.String).alias("s_tid"))
        finishes = flows.filter(pl.col("ph") == "f").select("cat", "id", pl.col("ts").alias("f_ts"),
                                                             pl.col("tid").cast(pl.String).alias("f_tid"))
        pairs = starts.join(finishes, on=["cat", "id"])
        launches = self.launches.select(pl.col("correlation").alias("flow_corr"), pl.col("ts").alias("s_ts"),
                                        pl.col("tid").cast(pl.String).alias("s_tid"))
        pairs = pairs.join(launches, on=["s_ts", "s_tid"]).unique(["f_ts", "f_tid"], keep="first")
        gpu = gpu.with_columns(pl.col("tid").cast(pl.String).alias("f_tid"), pl.col("ts").alias("f_ts"))
        gpu = gpu.join(pairs.select("f_ts", "f_tid", "flow_corr"), on=["f_ts", "f_tid"], how="left")
        return gpu.with_columns(pl.coalesce("correlation", "flow_corr").alias("correlation")).drop(
            "f_ts", "f_tid", "flow_corr").sort("idx")

    # --- op tree ----------------------------------------------------------------------------------
    @cached_property
    def op_parent(self) -> list[int | None]:
        """Parent op index of every op, from time containment on its (pid, tid)."""
        parent: list[int | None] = [None] * self.ops.height
        ordered = self.ops.select("idx", "pid", "tid", "ts", "end").sort(
            ["pid", "tid", "ts", "end"], descending=[False, False, False, True])
        thread_start = (pl.struct("pid", "tid") != pl.struct("pid", "tid").shift(1)).fill_null(True)
        new_thread = ordered.select(thread_start)[:, 0].to_list()
        stack: list[tuple[float, int]] = []
        for idx, ts, end, fresh in zip(ordered["idx"].to_list(), ordered["ts"].to_list(), ordered["end"].to_list(),
                                       new_thread, strict=True):
            if fresh:
                stack = []
            while stack and stack[-1][0] < ts:
                stack.pop()
            # An op that starts inside its parent but overruns it (clock rounding) still nests.
            parent[idx] = stack[-1][1] if stack else None
            stack.append((end, idx))
        return parent

    @cached_property
    def op_children(self) -> dict[int | None, list[int]]:
        """Child ops of each op, in start order (None holds the top-level ops)."""
        children: dict[int | None, list[int]] = {}
        for idx in self.ops.sort("ts")["idx"].to_list():
            children.setdefault(self.op_parent[idx], []).append(idx)
        return children

    def _innermost_ops(self, calls: pl.DataFrame) -> list[int | None]:
        """For each call, the innermost cpu_op/user_annotation containing it on the same thread."""
        if not calls.height or not self.ops.height:
            return [None] * calls.height
        ops = self.ops.select("idx", "pid", "tid", "ts", "end").with_columns(
            pl.col("pid").cast(pl.String), pl.col("tid").cast(pl.String))
        keyed = calls.select(pl.col("idx").alias("call"), pl.col("pid").cast(pl.String),
                             pl.col("tid").cast(pl.String), pl.col("ts").alias("call_ts"),
                             pl.col("end").alias("call_end"))
        # The latest-starting op at or before the call on its thread is the innermost candidate; if it
        # ended before the call, climb its parents until one contains the call.
        cand = keyed.sort("call_ts").join_asof(
            ops.sort("ts"), left_on="call_ts", right_on="ts", by=["pid", "tid"], strategy="backward",
            check_sortedness=False)
        ends = self.ops["end"].to_list()
        parent = self.op_parent
        result: dict[int, int | None] = {}
        for call, call_ts, op in cand.select("call", "call_ts", "idx").iter_rows():
            while op is not None and ends[op] < call_ts:
                op = parent[op]
            result[call] = op
        return [result.get(i) for i in calls["idx"].to_list()]

    def op_ancestors(self, op: int | None) -> list[int]:
        """Op indices from the outermost op down to `op`, without ProfilerStep annotations."""
        chain: list[int] = []
        names = self.op_names
        while op is not None:
            if STEP_NAME.match(names[op]):
                break
            chain.append(op)
            op = self.op_parent[op]
        return chain[::-1]

    def op_chain(self, op: int | None) -> list[str]:
        """Names from the outermost op down to `op`, e.g. aten::masked_fill > aten::clone > aten::copy_."""
        names = self.op_names
        return [names[i] for i in self.op_ancestors(op)]

    @cached_property
    def ops_stepped(self) -> pl.DataFrame:
        """The ops with the step they start in."""
        return self._assign_step(self.ops)

    @cached_property
    def op_names(self) -> list[str]:
        return self.ops["name"].to_list()

    def op_input(self, op: int) -> tuple[Any, Any, Any]:
        """(Input Dims, Input type, Concrete Inputs) of an op, decoded on demand."""
        args = self.op_args[op]
        return decode_raw(args.input_dims), decode_raw(args.input_types), decode_raw(args.concrete_inputs)

    @property
    def has_shapes(self) -> bool:
        return bool(self.meta.flags.get("record_shapes")) or any(a.input_dims for a in self.op_args[:2000])

    def source_of(self, op: int | None) -> dict[str, Any] | None:
        """The user's Python function around an op (innermost frame outside torch and libraries), from the
        trace's Python stacks; None without with_stack. Kineto names a frame by the function's first line."""
        if op is None or not self.python.height:
            return None
        row = self.ops.row(op, named=True)
        frames = self.python.filter(
            (pl.col("pid") == row["pid"]) & (pl.col("tid") == row["tid"]) & (pl.col("ts") <= row["ts"])
            & (pl.col("end") >= row["ts"]) & ~pl.col("name").str.contains(LIBRARY_FRAMES)).sort("ts")
        if not frames.height:
            return None
        match = PY_FRAME.match(frames["name"][-1])
        if not match:
            return None
        return {"file": match["file"], "line": int(match["line"]), "function": match["function"]}

    @property
    def has_gpu(self) -> bool:
        return self.gpu.height > 0


KINDS = ("ops", "launches", "gpu", "flows", "gpu_annotations", "python")


def _split(events: list[Event], parts: dict[str, list[pl.DataFrame]], op_args: list[Args]) -> None:
    """Turn one piece of the event list into a table per kind, appended to `parts`."""
    # Split by kind on columns, not in a Python loop: ph and cat come out at C speed.
    kinds = pl.DataFrame({
        "ph": pl.Series(list(map(attrgetter("ph"), events)), dtype=pl.String),
        "cat": pl.Series(list(map(attrgetter("cat"), events)), dtype=pl.String),
        "timed": pl.Series([e.ts is not None for e in events], dtype=pl.Boolean),
    }).with_row_index("i")
    complete = (pl.col("ph") == "X") & pl.col("timed")

    def pick(condition: pl.Expr) -> list[Event]:
        return [events[i] for i in kinds.filter(condition)["i"].to_list()]

    ops_events = pick(complete & pl.col("cat").is_in(list(CPU_OP_CATS)))
    op_args.extend(e.args or _EMPTY_ARGS for e in ops_events)
    parts["ops"].append(_frame(ops_events, _ID_FIELDS).with_columns(
        pl.col("cat").replace_strict(CPU_OP_CATS, default="cpu_op")))

    parts["launches"].append(_frame(pick(complete & pl.col("cat").is_in(list(RUNTIME_CATS))),
                                    {**_ID_FIELDS, "correlation": pl.Int64}).with_columns(
        pl.col("cat").replace_strict(RUNTIME_CATS, default="runtime").alias("api_kind"),
        pl.col("name").is_in(LAUNCH_APIS).alias("is_launch")))

    gpu_events = pick(complete & pl.col("cat").is_in(list(GPU_CATS)))
    gpu_args = [e.args or _EMPTY_ARGS for e in gpu_events]
    parts["gpu"].append(_frame(gpu_events, _GPU_FIELDS).with_columns(
        pl.col("cat").replace_strict(GPU_CATS, default="kernel").alias("kind"),
        pl.Series("grid_blocks", [_volume(a.grid) for a in gpu_args], dtype=pl.Int64),
        pl.Series("block_threads", [_volume(a.block) for a in gpu_args], dtype=pl.Int64),
        pl.coalesce("device", pl.col("pid").cast(pl.Int64, strict=False)).alias("device")))

    flows = pick(pl.col("ph").is_in(["s", "f", "t"]) & pl.col("timed") & pl.col("cat").is_in(list(FLOW_CATS)))
    parts["flows"].append(pl.DataFrame({
        "ph": [e.ph for e in flows], "cat": [e.cat for e in flows],
        "id": [None if e.id is None else str(e.id) for e in flows],
        "ts": _series("ts", [e.ts for e in flows], pl.Float64),
        "tid": [str(e.tid) for e in flows],
    }, schema={"ph": pl.String, "cat": pl.String, "id": pl.String, "ts": pl.Float64, "tid": pl.String}))

    parts["gpu_annotations"].append(_frame(pick(complete & (pl.col("cat") == "gpu_user_annotation")), {}))
    parts["python"].append(_frame(pick(complete & (pl.col("cat") == "python_function")), {}).select(
        "name", "pid", "tid", "ts", "end"))


def build(raw: RawTrace) -> Trace:
    doc = raw.document
    parts: dict[str, list[pl.DataFrame]] = {kind: [] for kind in KINDS}
    op_args: list[Args] = []
    for events in raw.event_chunks():
        _split(events, parts, op_args)
    # Only the ops' args outlive this (for their input fields, decoded on demand); the events can go.
    doc.traceEvents = []
    tables = {kind: _concat(frames) for kind, frames in parts.items()}
    gpu = tables["gpu"]
    tax = taxonomy.load()
    names = gpu["name"].unique().to_list()
    classes = pl.DataFrame({"name": names, "cls": [tax.classify(n) for n in names]},
                           schema={"name": pl.String, "cls": pl.String})
    gpu = gpu.join(classes, on="name", how="left").with_columns(
        pl.when(pl.col("kind") == "kernel").then(pl.col("cls")).otherwise(pl.col("kind")).alias("cls")
    ).sort("idx")

    meta = TraceMeta(
        devices=list(doc.deviceProperties or []),
        flags={k: bool(getattr(doc, k)) for k in ("record_shapes", "with_stack", "profile_memory", "with_flops",
                                                   "with_modules")},
        versions={k: getattr(doc, k) for k in ("schemaVersion", "cuda_driver_version", "cuda_runtime_version",
                                               "cupti_version") if getattr(doc, k) is not None},
        distributed=doc.distributedInfo,
        dropped_events=raw.dropped_events,
        notes=list(raw.notes),
        incomplete=raw.incomplete,
    )
    return Trace(
        path=raw.path, size=raw.size, meta=meta, ops=tables["ops"], launches=tables["launches"], gpu=gpu,
        gpu_annotations=tables["gpu_annotations"], flows=tables["flows"].drop("idx"),
        op_args=op_args, python=tables["python"].drop("idx"),
    )


def busy_us(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Union of [ts, end) intervals per device (and per `by` group), not their sum: overlapping kernels on
    several streams count once."""
    keys = [*by, "device"]
    if not frame.height:
        return pl.DataFrame(schema={**{k: frame.schema.get(k, pl.Int64) for k in by}, "busy_us": pl.Float64})
    merged = (frame.select([*keys, "ts", "end"]).sort([*keys, "ts"])
              .with_columns(pl.col("end").cum_max().shift(1).over(keys).alias("prev_end"))
              .with_columns((pl.col("prev_end").is_null() | (pl.col("ts") > pl.col("prev_end")))
                            .cast(pl.Int64).cum_sum().over(keys).alias("run"))
              .group_by([*keys, "run"]).agg(pl.col("ts").min(), pl.col("end").max())
              .with_columns((pl.col("end") - pl.col("ts")).alias("busy_us")))
    return merged.group_by(by).agg(pl.col("busy_us").sum()).sort(by) if by else merged.select(
        pl.col("busy_us").sum())
