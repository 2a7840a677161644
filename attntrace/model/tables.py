"""Events split by kind into polars tables: CPU ops, runtime/driver calls, GPU activity, flows, GPU
annotations and Python frames. Category names of every Kineto generation and vendor map to one kind each.

Columns are extracted at C speed (attrgetter over the decoded structs), so this costs little beyond the decode.
"""

from __future__ import annotations

import gc
import io
import multiprocessing
import os
import re
import sys
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from math import prod
from operator import attrgetter
from pathlib import Path
from typing import Any, overload

import msgspec
import polars as pl

from attntrace.reader import Args, Document, Event, RawTrace, bracketed, decode_piece, decode_pieces

# Categories by kind, current and older spellings and other vendors (TRACE_FORMAT.md).
CPU_OP_CATS = {"cpu_op": "cpu_op", "Operator": "cpu_op", "user_annotation": "user_annotation"}
RUNTIME_CATS = {"cuda_runtime": "runtime", "Runtime": "runtime", "cuda_driver": "driver"}
GPU_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
            "gpu_memset": "memset", "Memset": "memset", "mtia_ccp_events": "kernel"}
GPU_ANNOTATION_CATS = {"gpu_user_annotation"}
FLOW_CATS = {"ac2g", "async_cpu_to_gpu", "async", "async_gpu", "fwdbwd"}
STEP_PREFIX = "ProfilerStep#"
LAUNCH_APIS = (
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchKernelEx", "cuLaunchKernel", "cuLaunchKernelEx",
    "cudaLaunchCooperativeKernel", "cudaLaunchCooperativeKernelMultiDevice", "cuLaunchCooperativeKernel",
    "cudaGraphLaunch", "cuGraphLaunch",
    "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
    "hipLaunchCooperativeKernel", "hipGraphLaunch", "hipExtLaunchMultiKernelMultiDevice",
)
GRAPH_LAUNCH_APIS = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")

_EMPTY_ARGS = Args()


def runtime_kind(cat: str) -> str | None:
    """runtime or driver for a host API category of any vendor (cuda_runtime, mtia_runtime, xpu_driver...)."""
    if cat in RUNTIME_CATS:
        return RUNTIME_CATS[cat]
    if cat.endswith("_runtime"):
        return "runtime"
    if cat.endswith("_driver"):
        return "driver"
    return None


def series(name: str, values: list[Any], dtype: pl.DataType | type[pl.DataType]) -> pl.Series:
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


def _frame(events: list[Event], base: pl.DataFrame, arg_fields: dict[str, Any]) -> pl.DataFrame:
    """The table of one kind: `base` holds its name, cat and ts (already taken out for the split); the rest
    comes out of the structs at C speed."""
    columns = {
        "name": base["name"],
        "cat": base["cat"],
        "pid": _ids("pid", list(map(attrgetter("pid"), events))),
        "tid": _ids("tid", list(map(attrgetter("tid"), events))),
        "ts": base["ts"],
        "dur": series("dur", list(map(attrgetter("dur"), events)), pl.Float64).fill_null(0.0).clip(lower_bound=0.0),
    }
    if arg_fields:
        args = _args(events)
        columns.update({name: series(name, list(map(attrgetter(name), args)), dtype)
                        for name, dtype in arg_fields.items()})
    frame = pl.DataFrame(columns)
    if "external_id_old" in frame.columns:
        frame = frame.with_columns(pl.coalesce("external_id", "external_id_old").alias("external_id")).drop(
            "external_id_old")
    return frame.with_columns((pl.col("ts") + pl.col("dur")).alias("end"))


def _args(events: list[Event]) -> list[Args]:
    args = list(map(attrgetter("args"), events))
    if None in args:
        args = [_EMPTY_ARGS if a is None else a for a in args]
    return args


_ID_FIELDS = {"external_id": pl.Int64, "external_id_old": pl.Int64}
_GPU_FIELDS = {**_ID_FIELDS, "correlation": pl.Int64, "registers": pl.Int64, "shared_memory": pl.Int64,
               "blocks_per_sm": pl.Float64, "occupancy": pl.Float64, "device": pl.Int64, "stream": pl.Int64,
               "bytes": pl.Int64}


def _volume(dims: list[int] | None) -> int | None:
    """x*y*z of a grid or block, or None when the trace does not give it (or it is not a list of ints)."""
    if not dims or not isinstance(dims, list):
        return None
    out = 1
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool):
            return None
        out *= d
    return out if -(2**63) <= out < 2**63 else None


def _volumes(name: str, dims: list[list[int] | None]) -> pl.Series:
    """_volume of every grid or block. The decoder gives lists of ints (never bools), so math.prod at C speed
    is the same; only a product outside 64 bits needs the careful path."""
    try:
        return pl.Series(name, [prod(d) if d else None for d in dims], dtype=pl.Int64, strict=True)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        return pl.Series(name, list(map(_volume, dims)), dtype=pl.Int64)


KINDS = ("ops", "launches", "gpu", "flows", "gpu_annotations", "python")
_RAW_INPUTS = ("input_dims", "input_types", "concrete_inputs")


class OpInputs(Sequence[Args]):
    """Each op's raw input fields (Input Dims, Input type, Concrete Inputs), in ops-table order, as an Args per
    op. They are kept as copies in binary columns: the decoder's raw fields are views that would keep the
    whole file in memory."""

    def __init__(self, frame: pl.DataFrame) -> None:
        self._frame = frame

    def __len__(self) -> int:
        return self._frame.height

    @overload
    def __getitem__(self, index: int) -> Args: ...
    @overload
    def __getitem__(self, index: slice) -> list[Args]: ...

    def __getitem__(self, index: int | slice) -> Args | list[Args]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            rows = self._frame.slice(start, max(0, stop - start)).rows()[::step]
            return [_row_args(row) for row in rows]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return _row_args(self._frame.row(index))


def _row_args(row: tuple[bytes | None, ...]) -> Args:
    dims, types, concrete = (msgspec.Raw(value or b"") for value in row)
    return Args(input_dims=dims, input_types=types, concrete_inputs=concrete)


def _inputs(events: list[Event]) -> pl.DataFrame:
    args = _args(events)
    return pl.DataFrame({name: pl.Series(name, list(map(bytes, map(attrgetter(name), args))), dtype=pl.Binary)
                         for name in _RAW_INPUTS})


@dataclass
class Tables:
    ops: pl.DataFrame  # cpu_op and user_annotation: idx, name, cat, pid, tid, ts, dur, end, external_id
    launches: pl.DataFrame  # runtime and driver calls: ..., correlation, api_kind, is_launch
    gpu: pl.DataFrame  # kernels, memcpys, memsets: ..., kind, correlation, device, stream, launch configuration
    flows: pl.DataFrame
    gpu_annotations: pl.DataFrame
    python: pl.DataFrame
    op_args: OpInputs  # each op's args, in ops-table order, for its raw input fields


def split(chunks: Iterable[list[Event]]) -> Tables:
    """Every piece of the event list into a table per kind, in file order; B/E pairs become complete events."""
    return _assemble(*_split_all(chunks))


_Parts = tuple[dict[str, list[pl.DataFrame]], list[pl.DataFrame]]


def _split_all(chunks: Iterable[list[Event]]) -> _Parts:
    parts: dict[str, list[pl.DataFrame]] = {kind: [] for kind in KINDS}
    inputs: list[pl.DataFrame] = []
    open_ended: list[Event] = []
    # The decoder's structs hold no cycles; collections while millions of them come and go find nothing.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for events in chunks:
            _split(events, parts, inputs, open_ended)
            del events  # one piece's structs at a time
        if open_ended:
            _split(pair_begin_end(open_ended), parts, inputs, [])
    finally:
        if collecting:
            gc.enable()
    return parts, inputs


def _assemble(parts: dict[str, list[pl.DataFrame]], inputs: list[pl.DataFrame]) -> Tables:
    tables = {kind: _concat(frames) for kind, frames in parts.items()}
    op_inputs = pl.concat(inputs, rechunk=True) if len(inputs) > 1 else inputs[0]
    return Tables(ops=tables["ops"], launches=tables["launches"], gpu=tables["gpu"],
                  flows=tables["flows"].drop("idx"), gpu_annotations=tables["gpu_annotations"],
                  python=tables["python"].drop("idx"), op_args=OpInputs(op_inputs))


PARALLEL_MIN_PIECES = 4  # below this, starting worker processes costs more than it saves
# Processes that decode one big trace's pieces (0: one per usable core). Off unless asked for: on the 2-core
# machine it saved about 10% of the read at 210 MB, and the GPU host's sandbox could not start the workers.
WORKERS_ENV = "ATTNTRACE_READ_WORKERS"


def read_workers(pieces: int) -> int:
    """How many processes decode a trace of `pieces` pieces (ATTNTRACE_READ_WORKERS; 1 when unset)."""
    try:
        asked = int(os.environ.get(WORKERS_ENV) or 1)
    except ValueError:
        asked = 1
    if (asked == 1 or pieces < PARALLEL_MIN_PIECES or "forkserver" not in multiprocessing.get_all_start_methods()
            or not _main_is_guarded()):
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(asked if asked > 0 else cores, pieces))


def _main_is_guarded() -> bool:
    """Whether a worker may start: it imports the program's main module again (as every multiprocessing start
    method but fork does), which is harmless only when that module runs nothing on import: `python -m pkg`,
    a console script, an interactive session, or a script with an `if __name__ == "__main__":` guard."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        return bool(spec.name.endswith(".__main__") or spec.name == "__main__")
    path = getattr(main, "__file__", None)
    if path is None:
        return True
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return False
    return bool(re.search(r"""__name__\s*==\s*['"]__main__['"]""", text))


def split_trace(raw: RawTrace) -> Tables:
    """split() of a trace's events; a big trace's pieces are decoded on every core, each worker returning its
    tables as Arrow IPC, stitched in file order: the tables are the same as from one process."""
    taken = raw.take_pieces()
    if taken is None:
        return split(raw.event_chunks())
    data, pieces = taken
    del taken
    workers = read_workers(len(pieces))
    done: _Parts | None = None
    if workers > 1:
        dropped, notes = raw.dropped_events, list(raw.notes)
        try:
            done = _split_parallel(raw, data, pieces, workers)
        except (OSError, BrokenProcessPool):
            # No worker processes here (a sandbox, no /dev/shm): one process does it all, from the start.
            raw.dropped_events, raw.notes[:] = dropped, notes
    if done is None:
        done = _split_all(decode_pieces(raw, data, pieces))
    del data  # the file's buffer goes before the pieces' tables are joined (which briefly doubles them)
    return _assemble(*done)


def _split_parallel(raw: RawTrace, data: bytes | bytearray, pieces: list[tuple[int, int]], workers: int) -> _Parts:
    context = multiprocessing.get_context("forkserver")
    # The workers fork from a fresh server that has imported this module (polars) and run nothing: polars'
    # thread pool is never inherited half-used, and each worker starts in milliseconds.
    context.set_forkserver_preload([__name__])
    parts: dict[str, list[pl.DataFrame]] = {kind: [] for kind in KINDS}
    inputs: list[pl.DataFrame] = []
    open_ended: list[Event] = []
    view = memoryview(data)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        running: deque[Future[_PieceTables | None]] = deque()
        queued = 0

        def feed() -> None:
            nonlocal queued
            # A bounded window: the pieces in flight are copies, and all of them at once would double the file.
            while queued < len(pieces) and len(running) < 2 * workers:
                lo, hi = pieces[queued]
                running.append(pool.submit(_piece_tables, bracketed(view, lo, hi)))
                queued += 1

        feed()
        done = 0
        while running:
            result = running.popleft().result()
            if result is None:  # a cut inside an event: this process goes on from here, joining pieces
                for future in running:
                    future.cancel()
                for events in decode_pieces(raw, data, pieces[done:]):
                    _split(events, parts, inputs, open_ended)
                break
            frames, piece_inputs, open_json, dropped = result
            for kind, blob in zip(KINDS, frames, strict=True):
                parts[kind].append(pl.read_ipc(io.BytesIO(blob)))
            inputs.append(pl.read_ipc(io.BytesIO(piece_inputs)))
            if open_json:
                open_ended.extend(msgspec.json.decode(open_json, type=list[Event]))
            raw.count_dropped(dropped)
            done += 1
            feed()
    if open_ended:
        _split(pair_begin_end(open_ended), parts, inputs, [])
    return parts, inputs


_PieceTables = tuple[list[bytes], bytes, bytes, int]


def _piece_tables(piece: bytearray) -> _PieceTables | None:
    """In a worker: one piece's tables as Arrow IPC, its open-ended events as JSON and its dropped events; None
    when the piece does not parse (a cut inside an event)."""
    raw = RawTrace("", 0, Document(traceEvents=[]))
    gc.disable()  # a worker does this alone: nothing it makes is cyclic
    try:
        events = decode_piece(raw, piece)
    except msgspec.DecodeError:
        return None
    del piece
    parts: dict[str, list[pl.DataFrame]] = {kind: [] for kind in KINDS}
    inputs: list[pl.DataFrame] = []
    open_ended: list[Event] = []
    _split(events, parts, inputs, open_ended)
    del events
    return ([_ipc(parts[kind][0]) for kind in KINDS], _ipc(inputs[0]),
            msgspec.json.encode(open_ended) if open_ended else b"", raw.dropped_events)


def _ipc(frame: pl.DataFrame) -> bytes:
    out = io.BytesIO()
    frame.write_ipc(out)
    return out.getvalue()


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The pieces of one kind in file order, numbered (idx) across pieces; types widen where pieces differ
    (integer pids in one, string pids in another)."""
    whole = frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical_relaxed", rechunk=True)
    return whole.with_row_index("idx")


def pair_begin_end(events: list[Event]) -> list[Event]:
    """Chrome's duration events: each "E" closes the latest open "B" on its (pid, tid). Unclosed ones are dropped."""
    stacks: dict[tuple[Any, Any], list[Event]] = {}
    complete: list[Event] = []
    for event in sorted(events, key=lambda e: (e.ts, 0 if e.ph == "E" else 1)):
        stack = stacks.setdefault((event.pid, event.tid), [])
        if event.ph == "B":
            stack.append(event)
        elif stack:
            begin = stack.pop()
            complete.append(Event(ph="X", cat=begin.cat or event.cat, name=begin.name or event.name,
                                  pid=begin.pid, tid=begin.tid, ts=begin.ts, dur=(event.ts or 0.0) - (begin.ts or 0.0),
                                  args=begin.args or event.args))
    return complete


def _split(events: list[Event], parts: dict[str, list[pl.DataFrame]], inputs: list[pl.DataFrame],
           open_ended: list[Event]) -> None:
    """Turn one piece of the event list into a table per kind, appended to `parts`."""
    # Split by kind on columns, not in a Python loop: ph, cat, name and ts come out at C speed, once.
    kinds = pl.DataFrame({
        "ph": pl.Series(list(map(attrgetter("ph"), events)), dtype=pl.String),
        "cat": pl.Series(list(map(attrgetter("cat"), events)), dtype=pl.String),
        "name": pl.Series(list(map(attrgetter("name"), events)), dtype=pl.String),
        "ts": series("ts", list(map(attrgetter("ts"), events)), pl.Float64),
    }).with_row_index("i").with_columns(pl.col("ts").is_not_null().alias("timed"))
    complete = (pl.col("ph") == "X") & pl.col("timed")
    cats = kinds["cat"].unique().to_list()
    runtime_cats = {c: k for c in cats if c is not None and (k := runtime_kind(c))}
    device_cats = list(GPU_CATS) + list(GPU_ANNOTATION_CATS)
    # Step markers count in any host category (PyTorch 1.8-1.10 wrote them as "Operator").
    is_op = pl.col("cat").is_in(list(CPU_OP_CATS)) | (
        pl.col("name").str.starts_with(STEP_PREFIX) & ~pl.col("cat").is_in(device_cats)
        & ~pl.col("cat").is_in(list(runtime_cats)))
    flow = pl.col("ph").is_in(["s", "f", "t"]) & pl.col("timed") & pl.col("cat").is_in(list(FLOW_CATS))
    # One pass gives every kind its rows (memory instants and metadata fall through to none).
    kind = (pl.when(complete & is_op).then(pl.lit("ops"))
            .when(complete & pl.col("cat").is_in(list(runtime_cats))).then(pl.lit("launches"))
            .when(complete & pl.col("cat").is_in(list(GPU_CATS))).then(pl.lit("gpu"))
            .when(flow).then(pl.lit("flows"))
            .when(complete & pl.col("cat").is_in(list(GPU_ANNOTATION_CATS))).then(pl.lit("gpu_annotations"))
            .when(pl.col("ph").is_in(["B", "E"]) & pl.col("timed")).then(pl.lit("open")))
    rows = kinds.with_columns(kind.alias("kind")).drop("timed").filter(pl.col("kind").is_not_null())
    by_kind = {str(k[0]): frame.drop("kind") for k, frame in rows.partition_by("kind", as_dict=True).items()}
    # Python frames apart: one could also be a step marker by its name.
    by_kind["python"] = kinds.filter(complete & (pl.col("cat") == "python_function")).drop("timed")
    empty = kinds.clear().drop("timed")

    def pick(name: str) -> tuple[list[Event], pl.DataFrame]:
        base = by_kind.get(name, empty)
        return list(map(events.__getitem__, base["i"].to_list())), base

    open_ended.extend(pick("open")[0])

    ops_events, base = pick("ops")
    inputs.append(_inputs(ops_events))
    parts["ops"].append(_frame(ops_events, base, _ID_FIELDS).with_columns(
        pl.col("cat").replace_strict(CPU_OP_CATS, default="user_annotation")))

    parts["launches"].append(_frame(*pick("launches"), {**_ID_FIELDS, "correlation": pl.Int64}).with_columns(
        pl.col("cat").replace_strict(runtime_cats, default="runtime", return_dtype=pl.String).alias("api_kind"),
        pl.col("name").is_in(LAUNCH_APIS).alias("is_launch")))

    gpu_events, base = pick("gpu")
    gpu_args = _args(gpu_events)
    parts["gpu"].append(_frame(gpu_events, base, _GPU_FIELDS).with_columns(
        pl.col("cat").replace_strict(GPU_CATS, default="kernel").alias("kind"),
        _volumes("grid_blocks", list(map(attrgetter("grid"), gpu_args))),
        _volumes("block_threads", list(map(attrgetter("block"), gpu_args))),
        pl.coalesce("device", pl.col("pid").cast(pl.Int64, strict=False)).alias("device"),
        pl.coalesce("stream", pl.col("tid").cast(pl.Int64, strict=False)).alias("stream")))

    flows, base = pick("flows")
    parts["flows"].append(pl.DataFrame({
        "ph": base["ph"], "cat": base["cat"],
        "id": _text("id", list(map(attrgetter("id"), flows))),
        "ts": base["ts"],
        "tid": _text("tid", list(map(attrgetter("tid"), flows))),
    }, schema={"ph": pl.String, "cat": pl.String, "id": pl.String, "ts": pl.Float64, "tid": pl.String}))

    parts["gpu_annotations"].append(_frame(*pick("gpu_annotations"), {}))
    parts["python"].append(_frame(*pick("python"), {}).select("name", "pid", "tid", "ts", "end"))


def _text(name: str, values: list[Any]) -> pl.Series:
    """Ids as text whatever their JSON type (str(v), None kept)."""
    try:
        return pl.Series(name, values, dtype=pl.String, strict=False)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        return pl.Series(name, [None if v is None else str(v) for v in values], dtype=pl.String)
