"""Events split by kind into polars tables: CPU ops, runtime/driver calls, GPU activity, flows, GPU
annotations and Python frames. Category names of every Kineto generation and vendor map to one kind each.

Columns are extracted at C speed (attrgetter over the decoded structs), so this costs little beyond the decode.
"""

from __future__ import annotations

import contextlib
import gc
import io
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from itertools import chain
from math import prod
from operator import attrgetter, getitem, methodcaller
from typing import Any, overload

import msgspec
import polars as pl

from attntrace.model.plain import collect_plain
from attntrace.read import workers
from attntrace.read.buffers import let_go, read_span, reread
from attntrace.read.decoding import (
    Undecodable,
    bracketed,
    decode_piece,
    decode_pieces,
    decode_span,
    empty_problem,
    no_phase_problem,
    redecode,
)
from attntrace.read.errors import TraceError
from attntrace.read.events import Args, Begin, Complete, Document, End, Event, TraceEvent
from attntrace.read.raw import FileIdentity, Pieces, RawTrace

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


def _columns(events: list[Event], arg_fields: dict[str, Any]) -> dict[str, pl.Series]:
    """The columns of one kind's events, taken out of the structs at C speed; what derives from them is
    computed once the pieces are joined (_derive)."""
    columns = {
        "name": pl.Series("name", list(map(attrgetter("name"), events)), dtype=pl.String),
        "cat": pl.Series("cat", list(map(attrgetter("cat"), events)), dtype=pl.String),
        "pid": _ids("pid", list(map(attrgetter("pid"), events))),
        "tid": _ids("tid", list(map(attrgetter("tid"), events))),
        "ts": series("ts", list(map(attrgetter("ts"), events)), pl.Float64),
        "dur": series("dur", list(map(attrgetter("dur"), events)), pl.Float64),
    }
    if arg_fields:
        args = _args(events)
        columns.update({name: series(name, list(map(attrgetter(name), args)), dtype)
                        for name, dtype in arg_fields.items()})
    return columns


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
_RAW_INPUTS = ("input_dims", "input_types", "concrete_inputs", "input_strides")


class OpInputs(Sequence[Args]):
    """Each op's raw input fields (Input Dims, Input type, Concrete Inputs, Input Strides), in ops-table order,
    as an Args per op. They are kept as copies in binary columns: the decoder's raw fields are views that would keep the
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

    def representatives(self, indices: list[int], names: list[str]) -> list[int]:
        """For each op of `indices` (names: every op's name), the first of them with the same name and the same
        recorded inputs: ops that agree on both cost the same, and a decode loop repeats a few hundred such
        signatures tens of thousands of times."""
        if not indices:
            return []
        rows = self._frame[indices].with_columns(pl.Series("op", indices, dtype=pl.Int64),
                                                 pl.Series("name", [names[i] for i in indices], dtype=pl.String))
        return rows.select(pl.col("op").first().over("name", *_RAW_INPUTS))["op"].to_list()

    def take(self, indices: list[int]) -> list[Args]:
        """The args of many ops in one gather (a row at a time costs ~15 us each in polars)."""
        return [_row_args(row) for row in self._frame[indices].rows()]


def _row_args(row: tuple[bytes | None, ...]) -> Args:
    dims, types, concrete, strides = (msgspec.Raw(value or b"") for value in row)
    return Args(input_dims=dims, input_types=types, concrete_inputs=concrete, input_strides=strides)


# A stride of 0 in Input Strides (a number 0, not a digit of 1024): the only strides the model reads, a broadcast
# input's (flops.op_bytes). The others are not kept: kept whole, they took a 185 MB trace's peak from 1.75x to 1.96x
# the file.
BROADCAST_STRIDE = re.compile(rb"(?<![0-9.])0(?![0-9.eE])")


def _inputs(events: list[Event]) -> pl.DataFrame:
    args = _args(events)

    def column(name: str) -> list[bytes]:
        raws = map(attrgetter(name), args)
        if name == "input_strides":
            return [bytes(raw) if BROADCAST_STRIDE.search(raw) else b"" for raw in raws]
        return list(map(bytes, raws))

    return pl.DataFrame({name: pl.Series(name, column(name), dtype=pl.Binary) for name in _RAW_INPUTS})


@dataclass
class Tables:
    ops: pl.DataFrame  # cpu_op and user_annotation: idx, name, cat, pid, tid, ts, dur, end, external_id
    launches: pl.DataFrame  # runtime and driver calls: ..., correlation, api_kind, is_launch
    gpu: pl.DataFrame  # kernels, memcpys, memsets: ..., kind, correlation, device, stream, launch configuration
    flows: pl.DataFrame
    gpu_annotations: pl.DataFrame
    python: pl.DataFrame
    op_args: OpInputs  # each op's args, in ops-table order, for its raw input fields
    odd_durations: int = 0  # complete events with a negative or missing duration, read as 0
    unclosed: int = 0  # "B" events no "E" closed, left out
    untimed: int = 0  # events of a kind the model reads without a time ("ts"), left out


def split(chunks: Iterable[list[TraceEvent]]) -> Tables:
    """Every piece of the event list into a table per kind, in file order; B/E pairs become complete events."""
    return _assemble(*_split_all(chunks))


# Tables by kind, op inputs, and what was left out: "B"s no "E" closed, events without a time.
_Parts = tuple[dict[str, list[pl.DataFrame]], list[pl.DataFrame], int, int]


def _split_all(chunks: Iterable[list[TraceEvent]]) -> _Parts:
    parts: dict[str, list[pl.DataFrame]] = {kind: [] for kind in KINDS}
    inputs: list[pl.DataFrame] = []
    open_ended: list[Event] = []
    untimed = 0
    with gc_paused():
        for events in chunks:
            untimed += _split(events, parts, inputs, open_ended)
            del events  # one piece's structs at a time
        unclosed = 0
        if open_ended:
            complete, unclosed = pair_begin_end(open_ended)
            _split(complete, parts, inputs, [])
    return parts, inputs, unclosed, untimed


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: the decoder's structs and the rules' rows and dicts hold no cycles,
    and collections while millions of objects come and go find nothing (the rules ran 8% faster without)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _assemble(parts: dict[str, list[pl.DataFrame]], inputs: list[pl.DataFrame], unclosed: int = 0,
              untimed: int = 0) -> Tables:
    tables = {}
    odd = 0
    for kind in KINDS:  # one kind's pieces at a time: joining all at once would hold every table twice
        joined = _concat(parts.pop(kind))
        if kind != "flows" and joined.height:
            odd += joined.select((pl.col("dur").is_null() | (pl.col("dur") < 0)).sum()).item()
        tables[kind] = _derive(kind, joined)
    op_inputs = pl.concat(inputs, rechunk=True) if len(inputs) > 1 else inputs[0]
    return Tables(ops=tables["ops"], launches=tables["launches"], gpu=tables["gpu"],
                  flows=tables["flows"].drop("idx"), gpu_annotations=tables["gpu_annotations"],
                  python=tables["python"].drop("idx"), op_args=OpInputs(op_inputs), odd_durations=odd,
                  unclosed=unclosed, untimed=untimed)


def split_trace(raw: RawTrace) -> Tables:
    """split() of a trace's events; a big trace's pieces are decoded on every core, each worker returning its
    tables as Arrow IPC, stitched in file order: the tables are the same as from one process."""
    if raw.frames is not None:
        return _from_frames(raw.frames)
    if raw.pieces is None and raw.chunks is None:
        return split(raw.event_chunks())
    if raw.pieces is None:
        return _checked_pieces(raw, split(raw.event_chunks()))
    try:
        # Not held here: the file's buffer goes as soon as the pieces are decoded, before their tables are joined.
        return _checked_pieces(raw, _split_pieces(raw, raw.take_pieces()))  # type: ignore[arg-type]
    except Undecodable as failed:
        pieces = failed.pieces
    # Decoded again here, once the failed attempt's frames (views of the buffer) are gone.
    again = redecode(raw, pieces)
    del pieces
    in_pieces = again.chunks is not None
    tables = split(again.event_chunks())  # the pieces' counts go on `again` as they are decoded
    raw.document, raw.incomplete = again.document, again.incomplete
    raw.restore(again.counts())
    return _checked_pieces(raw, tables) if in_pieces else tables


def _from_frames(frames: dict[str, Any]) -> Tables:
    """The tables of a trace the reader gave in columns (an Nsight Systems export): the same derived columns
    as from events."""
    tables = {kind: _derive(kind, _concat([frames[kind]])) for kind in KINDS}
    odd = sum(tables[kind].height and frames[kind].select((pl.col("dur").is_null() | (pl.col("dur") < 0)).sum()).item()
              for kind in ("ops", "launches", "gpu"))
    return Tables(ops=tables["ops"], launches=tables["launches"], gpu=tables["gpu"],
                  flows=tables["flows"].drop("idx"), gpu_annotations=tables["gpu_annotations"],
                  python=tables["python"].drop("idx"), op_args=OpInputs(frames["op_args"]), odd_durations=odd)


def _checked_pieces(raw: RawTrace, tables: Tables) -> Tables:
    """The checks a document decoded whole gets (read/decoding.py), on one decoded in pieces: an event list of
    no trace events, or of events none of which has a phase, is refused at any size."""
    if raw.seen_events == raw.dropped_events:
        raise TraceError(*empty_problem(raw.dropped_events))
    if raw.unphased_events and raw.unphased_events == raw.seen_events - raw.dropped_events:
        raise TraceError("bad-trace", no_phase_problem(raw.unphased_events))
    return tables


def _split_pieces(raw: RawTrace, pieces: Pieces) -> Tables:
    processes = workers.read_workers(len(pieces))
    done: _Parts | None = None
    if processes > 1:
        counts = raw.counts()
        # No worker processes here (a sandbox), or the fork server gave none (it could not fork, `ulimit -u`; it
        # is gone: an EOF on its socket).
        with contextlib.suppress(OSError, EOFError, BrokenProcessPool):
            done = _split_parallel(raw, pieces, processes)
        workers.return_freed_memory()
        if done is None:  # one process does it all, from the start
            raw.restore(counts)
    if done is None:
        if not pieces.data and pieces.source:  # read from the file so far: decoded whole, it is read again
            pieces.data = reread(pieces.source)
            pieces.source = None
        done = _split_all(decode_pieces(raw, pieces))
    pieces.data = b""  # the file's buffer goes before the pieces' tables are joined
    return _assemble(*done)


# A frame per kind, op inputs, open events, events left out for want of a time.
_PieceParts = tuple[list[pl.DataFrame], pl.DataFrame, list[Event], int]


# The pool's threads move pieces and results through pipes 64 KiB at a time, taking the GIL for each: at the
# default 5 ms switch interval, while this thread decodes, a 16 MiB piece took over a second to reach a worker.
SWITCH_S = 1e-4
IN_FLIGHT_PER_WORKER = 4


def _split_parallel(raw: RawTrace, pieces: Pieces, processes: int) -> _Parts | None:
    """This process decodes pieces from the first one on while workers take them from the last one back; the
    tables are stitched in file order. None when a piece does not parse alone (a cut inside an event). A file's
    pieces are read from the file, by this process as by the workers, and its copy in memory goes first (held to
    the end, it was the peak: 2.2x the file); a caller that falls back reads it again (reread)."""
    done: list[_PieceParts | None] = [None] * len(pieces)
    if pieces.source:
        pieces.data = b""
    view = memoryview(pieces.data)

    def task(i: int) -> bytearray | tuple[FileIdentity, int, int]:
        """What a worker needs for piece i: where it is in the file, else a copy of it."""
        lo, hi = pieces.spans[i]
        return (pieces.source, lo, hi) if pieces.source else bracketed(view, lo, hi)

    def receive(i: int, future: Future[_PieceTables | None]) -> bool:
        result = future.result()
        if result is None:
            return False
        frames, piece_inputs, open_json, counted = result
        *piece_counts, untimed = counted
        done[i] = ([pl.read_ipc(io.BytesIO(blob)) for blob in frames], pl.read_ipc(io.BytesIO(piece_inputs)),
                   msgspec.json.decode(open_json, type=list[Begin | End]) if open_json else [], untimed)
        raw.count_piece(*piece_counts)
        return True

    with gc_paused():
        switch = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_S)
        workers.warm_up()  # the server that forks the workers starts with Ctrl-C ignored, if it was not running
        # This process decodes a piece too: it is the first of `processes`, the workers take the other shares.
        pool = workers.SharingPool(processes - 1, processes, first_slot=1)
        try:
            front, back = 0, len(pieces) - 1
            running: dict[int, Future[_PieceTables | None]] = {}
            while True:
                # A bounded window: pieces in flight may be copies (all of them at once would double the file); wide
                # enough that a worker never waits for this process to finish its own piece before it gets another.
                while back > front and len(running) < IN_FLIGHT_PER_WORKER * (processes - 1):
                    running[back] = pool.submit(_piece_tables, task(back))
                    back -= 1
                for i in [i for i, future in running.items() if future.done()]:
                    if not receive(i, running.pop(i)):
                        return None
                if front > back:
                    break
                piece = read_span(pieces.source, *pieces.spans[front]) if pieces.source else None
                if pieces.source and piece is None:  # the file changed, or its list holds other things
                    return None
                try:
                    events = (decode_piece(raw, piece) if piece is not None
                              else decode_span(raw, pieces.data, *pieces.spans[front]))
                except msgspec.DecodeError:  # a cut inside an event
                    return None
                del piece
                done[front] = _piece_parts(events)
                del events
                let_go(pieces.data, *pieces.spans[front])
                front += 1
            for i in sorted(running):  # popped as received: a finished future holds its result's IPC bytes
                if not receive(i, running.pop(i)):
                    return None
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            sys.setswitchinterval(switch)
    view.release()
    parts: dict[str, list[pl.DataFrame]] = {kind: [] for kind in KINDS}
    inputs: list[pl.DataFrame] = []
    open_ended: list[Event] = []
    untimed = 0
    for frames, piece_inputs, piece_open, piece_untimed in filter(None, done):
        untimed += piece_untimed
        for kind, frame in zip(KINDS, frames, strict=True):
            parts[kind].append(frame)
        inputs.append(piece_inputs)
        open_ended.extend(piece_open)
    unclosed = 0
    if open_ended:
        complete, unclosed = pair_begin_end(open_ended)
        _split(complete, parts, inputs, [])
    return parts, inputs, unclosed, untimed


def _piece_parts(events: list[TraceEvent]) -> _PieceParts:
    parts: dict[str, list[pl.DataFrame]] = {kind: [] for kind in KINDS}
    inputs: list[pl.DataFrame] = []
    open_ended: list[Event] = []
    untimed = _split(events, parts, inputs, open_ended)
    return [parts[kind][0] for kind in KINDS], inputs[0], open_ended, untimed


_PieceTables = tuple[list[bytes], bytes, bytes, tuple[int, int, int, int]]


def _piece_tables(piece: bytearray | tuple[FileIdentity, int, int]) -> _PieceTables | None:
    """In a worker: one piece's tables as Arrow IPC, its open-ended events as JSON and its counts (items,
    malformed ones, ones without a phase: RawTrace.count_piece); None
    when the piece does not parse (a cut inside an event) or the file no longer holds it."""
    raw = RawTrace("", 0, Document(traceEvents=[]))
    gc.disable()  # a worker does this alone: nothing it makes is cyclic
    if isinstance(piece, tuple):
        piece = read_span(*piece)
        if piece is None:
            return None
    try:
        events = decode_piece(raw, piece)
    except msgspec.DecodeError:
        return None
    del piece
    frames, inputs, open_ended, untimed = _piece_parts(events)
    del events
    return ([_ipc(frame) for frame in frames], _ipc(inputs),
            msgspec.json.encode(open_ended) if open_ended else b"",
            (raw.seen_events, raw.dropped_events, raw.unphased_events, untimed))


def _ipc(frame: pl.DataFrame) -> bytes:
    out = io.BytesIO()
    frame.write_ipc(out)
    return out.getvalue()


def _derive(kind: str, frame: pl.DataFrame) -> pl.DataFrame:
    """A kind's columns that derive from the others, computed once on the joined table: end times, the old
    spelling of External id, and the kind of each category. One query per kind: a query's fixed cost is most of a
    small trace's time."""
    if kind == "flows":
        return frame
    derived = frame.lazy().with_columns(pl.col("dur").fill_null(0.0).clip(lower_bound=0.0))
    if "external_id_old" in frame.columns:
        derived = derived.with_columns(pl.coalesce("external_id", "external_id_old").alias("external_id")).drop(
            "external_id_old")
    volumes = [c for c in ("grid_blocks", "block_threads") if c in frame.columns]
    derived = derived.select(pl.exclude(volumes), (pl.col("ts") + pl.col("dur")).alias("end"), *volumes)
    if kind == "ops":
        derived = derived.with_columns(pl.col("cat").replace_strict(CPU_OP_CATS, default="user_annotation"))
    elif kind == "launches":
        apis = {c: k for c in frame["cat"].unique().to_list() if (k := runtime_kind(c))}
        derived = derived.with_columns(
            pl.col("cat").replace_strict(apis, default="runtime", return_dtype=pl.String).alias("api_kind"),
            pl.col("name").is_in(LAUNCH_APIS).alias("is_launch"))
    elif kind == "gpu":
        derived = derived.with_columns(
            # The device from args, else from the pid: a number, or text naming one ("GPU 0", "cuda:1").
            pl.coalesce("device", pl.col("pid").cast(pl.Int64, strict=False),
                        pl.col("pid").cast(pl.String).str.extract(r"^(?i:gpu|cuda|device)?[\s:#]*(\d{1,9})$", 1)
                        .cast(pl.Int64, strict=False)).alias("device"),
            pl.coalesce("stream", pl.col("tid").cast(pl.Int64, strict=False)).alias("stream"),
        ).select(pl.exclude(volumes), pl.col("cat").replace_strict(GPU_CATS, default="kernel").alias("kind"),
                 *volumes)
    elif kind == "python":
        derived = derived.select("idx", "name", "pid", "tid", "ts", "end")
    return collect_plain(derived)


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The pieces of one kind in file order, numbered (idx) across pieces; types widen where pieces differ
    (integer pids in one, string pids in another)."""
    whole = frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical_relaxed", rechunk=True)
    return whole.with_row_index("idx")


def pair_begin_end(events: list[Event]) -> tuple[list[Event], int]:
    """Chrome's duration events: each "E" closes the latest open "B" on its (pid, tid), in time order and, at one
    time, in file order (as Chrome pairs them: a zero-length pair inside an open "B" closes itself, not that
    one); the complete events and the number of "B"s left unclosed, which are left out."""
    stacks: dict[tuple[Any, Any], list[Event]] = {}
    complete: list[Event] = []
    for event in sorted(events, key=attrgetter("ts")):  # stable: file order at one time
        stack = stacks.setdefault((event.pid, event.tid), [])
        if event.ph == "B":
            stack.append(event)
        elif stack:
            begin = stack.pop()
            complete.append(Complete(cat=begin.cat or event.cat, name=begin.name or event.name,
                                  pid=begin.pid, tid=begin.tid, ts=begin.ts, dur=(event.ts or 0.0) - (begin.ts or 0.0),
                                  args=begin.args or event.args))
    return complete, sum(map(len, stacks.values()))


def _split(events: list[TraceEvent], parts: dict[str, list[pl.DataFrame]], inputs: list[pl.DataFrame],
           open_ended: list[Event]) -> int:
    """Turn one piece of the event list into a table per kind, appended to `parts`; the number of its events
    left out for want of a time."""
    groups, untimed = _group(events)
    open_ended.extend(groups["open"])
    ops = groups["ops"]
    inputs.append(_inputs(ops))
    parts["ops"].append(pl.DataFrame(_columns(ops, _ID_FIELDS)))
    parts["launches"].append(pl.DataFrame(_columns(groups["launches"], {**_ID_FIELDS, "correlation": pl.Int64})))
    gpu = groups["gpu"]
    gpu_args = _args(gpu)
    parts["gpu"].append(pl.DataFrame({
        **_columns(gpu, _GPU_FIELDS),
        "grid_blocks": _volumes("grid_blocks", list(map(attrgetter("grid"), gpu_args))),
        "block_threads": _volumes("block_threads", list(map(attrgetter("block"), gpu_args)))}))
    flows = groups["flows"]
    parts["flows"].append(pl.DataFrame({
        "ph": pl.Series("ph", list(map(attrgetter("ph"), flows)), dtype=pl.String),
        "cat": pl.Series("cat", list(map(attrgetter("cat"), flows)), dtype=pl.String),
        "id": _text("id", list(map(attrgetter("id"), flows))),
        "ts": series("ts", list(map(attrgetter("ts"), flows)), pl.Float64),
        "tid": _text("tid", list(map(attrgetter("tid"), flows))),
    }))
    parts["gpu_annotations"].append(pl.DataFrame(_columns(groups["gpu_annotations"], {})))
    parts["python"].append(pl.DataFrame(_columns(groups["python"], {})))
    return untimed


# The groups events go to, in the order _group sorts them; "skip" (memory, metadata, counters...) last.
_GROUP_NAMES = ("ops", "launches", "gpu", "flows", "gpu_annotations", "python", "open", "other_host", "skip")
_GROUP_CODES = {name: code for code, name in enumerate(_GROUP_NAMES)}


class _CategoryCodes(dict[str, int]):
    """Category -> group code for events of one phase, each category's worked out once (_kind)."""

    def __init__(self, phase: type) -> None:
        super().__init__()
        self.phase = phase

    def __missing__(self, cat: str) -> int:
        code = self[cat] = _GROUP_CODES[_kind(self.phase, cat)]
        return code


class _PhaseCodes(dict[type, _CategoryCodes]):
    def __missing__(self, phase: type) -> _CategoryCodes:
        codes = self[phase] = _CategoryCodes(phase)
        return codes


def _group(events: list[TraceEvent]) -> tuple[dict[str, list[Event]], int]:
    """The events of each kind, in file order, by phase and category: complete events by their category,
    flows in the flow categories, begin/end pairs for pairing later; events without a time are left out.
    Step markers count as ops in any host category (PyTorch 1.8-1.10 wrote them as "Operator").

    Done at C speed (map, a stable sort by group, slices): a Python loop over the events would cost more than
    decoding them, and a pass per group twice the sort."""
    codes = list(map(getitem, map(_PhaseCodes().__getitem__, map(type, events)), map(attrgetter("cat"), events)))
    counts = Counter(codes)
    ordered = list(map(events.__getitem__, sorted(range(len(events)), key=codes.__getitem__)))
    groups: dict[str, list[Event]] = {}
    start = 0
    untimed = 0
    for code, name in enumerate(_GROUP_NAMES[:-1]):
        group = ordered[start:start + counts[code]]
        start += counts[code]
        if None in map(attrgetter("ts"), group):
            timed = [e for e in group if e.ts is not None]
            if name != "other_host":  # (those no table reads anyway)
                untimed += len(group) - len(timed)
            group = timed
        groups[name] = group  # type: ignore[assignment]
    del ordered
    hosts = chain(groups["python"], groups.pop("other_host"))
    if any(map(methodcaller("startswith", STEP_PREFIX), map(attrgetter("name"), hosts))):
        ops, hosts_codes = _GROUP_CODES["ops"], (_GROUP_CODES["python"], _GROUP_CODES["other_host"])
        groups["ops"] = [e for e, code in zip(events, codes, strict=True)  # type: ignore[misc]
                         if e.ts is not None and (code == ops or (code in hosts_codes
                                                                  and e.name.startswith(STEP_PREFIX)))]
    return groups, untimed


def _kind(phase: type, cat: str) -> str:
    """The group that events of this phase and category go to; other_host: complete events of a host category
    no table takes (only a step marker among them is read); skip: none."""
    if phase is Complete:
        if cat in CPU_OP_CATS:
            return "ops"
        if runtime_kind(cat) is not None:
            return "launches"
        if cat in GPU_CATS:
            return "gpu"
        if cat in GPU_ANNOTATION_CATS:
            return "gpu_annotations"
        return "python" if cat == "python_function" else "other_host"
    if phase in (Begin, End):
        return "open"
    if phase.ph in ("s", "f", "t") and cat in FLOW_CATS:
        return "flows"
    return "skip"


def _text(name: str, values: list[Any]) -> pl.Series:
    """Ids as text whatever their JSON type (str(v), None kept)."""
    try:
        return pl.Series(name, values, dtype=pl.String, strict=False)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        return pl.Series(name, [None if v is None else str(v) for v in values], dtype=pl.String)
