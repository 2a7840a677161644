"""`lint --annotate OUT`: a copy of the trace with the findings on its timeline, for Perfetto UI and
chrome://tracing. The original bytes are kept as they are; the findings' events (an `attntrace` process,
a track per rule, a slice per finding and step, flow arrows to the flagged events) are inserted at the
start of the event list, and the copy is gzip when its name ends in .gz. The copy is streamed. An Nsight Systems
export has no JSON of its own: its copy is a Chrome trace written from the tables it was read into."""

from __future__ import annotations

import gzip
import io
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from attntrace.formats.output import WouldOverwriteInput, replacing
from attntrace.model import Trace
from attntrace.read.buffers import unchanged
from attntrace.read.encodings import utf16_to_utf8, wide_codec
from attntrace.read.errors import TraceError
from attntrace.read.raw import FileIdentity
from attntrace.report.flagged import Span, resolve

PROCESS_NAME = "attntrace"
CATEGORY = "attntrace"
FLOW_NAME = "attntrace finding"
FLOW_ID_BASE = 1 << 40  # above Kineto's correlation ids, so that no arrow is joined to one of the trace's own
MAX_FLOWS_PER_SPAN = 64  # a launch-bound step flags hundreds of kernels; arrows to all would hide the timeline
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_NON_SPACE = re.compile(rb"[^ \t\r\n]")


def _free_pid(trace: Trace) -> int:
    """A process id that no event of the trace uses (tracks of one pid are one process in Perfetto)."""
    used: set[int] = set()
    for frame in (trace.ops, trace.launches, trace.gpu, trace.gpu_annotations):
        if frame.height and frame.schema["pid"] == pl.Int64:
            used.update(v for v in frame["pid"].unique().to_list() if v is not None)
    pid = 1_000_000_000
    while pid in used:
        pid += 1
    return pid


def _short(message: str, limit: int = 80) -> str:
    return message if len(message) <= limit else message[: limit - 1] + "…"


def _lanes(spans: list[Span]) -> list[int]:
    """A lane per span so that slices on one track never overlap in part (Perfetto needs proper nesting)."""
    ends: list[float] = []
    lanes = []
    for span in spans:
        lane = next((i for i, end in enumerate(ends) if end <= span.ts), len(ends))
        if lane == len(ends):
            ends.append(span.end)
        else:
            ends[lane] = span.end
        lanes.append(lane)
    return lanes


def events(trace: Trace, findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Trace Event Format events to add for this trace's findings."""
    spans = resolve(trace, findings)
    pid = _free_pid(trace)
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": PROCESS_NAME}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}},
    ]
    rules = sorted({findings[s.finding]["rule"] for s in spans})
    flow_id = FLOW_ID_BASE
    for rank, rule in enumerate(rules):
        on_rule = sorted((s for s in spans if findings[s.finding]["rule"] == rule), key=lambda s: (s.ts, -s.end))
        lanes = _lanes(on_rule)
        name = findings[on_rule[0].finding]["name"]
        for lane in sorted(set(lanes)):
            tid = (rank + 1) * 100 + lane
            label = f"{rule} {name}" + (f" ({lane + 1})" if lane else "")
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        for span, lane in zip(on_rule, lanes, strict=True):
            finding = findings[span.finding]
            tid = (rank + 1) * 100 + lane
            args = {"message": finding["message"], "severity": finding["severity"], "step": span.step,
                    "where": finding["where"], "evidence": finding["evidence"], "impact": finding["impact"],
                    "fix": finding["fix"], "fingerprint": finding["fingerprint"],
                    "flagged_events": len(span.targets)}
            if len(span.targets) > MAX_FLOWS_PER_SPAN:
                args["arrows_shown"] = MAX_FLOWS_PER_SPAN
            out.append({"ph": "X", "cat": CATEGORY, "name": f"{rule} {_short(finding['message'])}", "pid": pid,
                        "tid": tid, "ts": span.ts, "dur": max(span.end - span.ts, 0.0), "args": args})
            for target in span.targets[:MAX_FLOWS_PER_SPAN]:
                flow_id += 1
                common = {"cat": CATEGORY, "name": FLOW_NAME, "id": flow_id}
                out.append({"ph": "s", **common, "pid": pid, "tid": tid, "ts": span.ts})
                # bp "e" binds the arrow to the slice enclosing the point: aim at the event's middle so that
                # float rounding of its start cannot put the point just outside it.
                middle = (target.ts + target.end) / 2
                out.append({"ph": "f", "bp": "e", **common, "pid": target.pid, "tid": target.tid, "ts": middle})
    return out + path_events(trace, pid)


# The critical path's track in the attntrace process, below the rules' tracks.
PATH_TID = 1_000_000


def path_events(trace: Trace, pid: int) -> list[dict[str, Any]]:
    """The critical path of the steps a what-if judges, one track per device: each stretch of the path as a slice
    named by what it spends the time on (GPU work at its recorded times, CPU stretches mapped back from the
    replay), consecutive stretches of one kind merged."""
    if trace.replay.reason or not trace.replay.table.height:
        return []
    out: list[dict[str, Any]] = []
    for path in trace.judged_paths(trace.critical_path):
        tid = PATH_TID + int(path["device"])
        if not any(e["tid"] == tid for e in out):
            label = f"critical path (device {path['device']}, without the profiler)"
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}})
        merged: list[list[Any]] = []
        for start, end, what in sorted(path["segments"]):
            if merged and merged[-1][2] == what and start <= merged[-1][1] + 1.0:
                merged[-1][1] = max(merged[-1][1], end)
            elif not merged or start >= merged[-1][1]:  # slices on one track must not overlap
                merged.append([start, end, what])
        out.extend({"ph": "X", "cat": CATEGORY, "name": what, "pid": pid, "tid": tid, "ts": start,
                    "dur": max(end - start, 0.0), "args": {"step": path["step"]}} for start, end, what in merged)
    return out


CHUNK_BYTES = 16 << 20
HEAD_LIMIT = 256 << 20  # the event list must start within this much metadata
_BOM = b"\xef\xbb\xbf"


def _chunks(source: str, read: FileIdentity | None) -> Iterator[bytes]:
    """The file's text as UTF-8, a piece at a time: a UTF-16 or UTF-32 trace (which the reader reads) is re-encoded
    whole, so the events added are in the same encoding as the rest; any other passes through as it is. `read`:
    the file as it was read; TraceError when it is another now."""
    pieces = _raw_chunks(source, read)
    first = next(pieces, b"")
    if wide_codec(first[:4]) is None:
        yield first
        yield from pieces
        return
    wide = utf16_to_utf8(b"".join([first, *pieces]))
    assert wide is not None  # its codec was found above
    yield bytes(wide)


GPU_EVENT_CATS = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}


def _model_chunks(trace: Trace) -> Iterator[bytes]:
    """A Chrome trace of a trace read into tables (an Nsight Systems export): its ops, runtime calls and GPU
    events as complete events, on the processes, threads, devices and streams the findings point at."""
    host = ["ph", "cat", "name", "pid", "tid", "ts", "dur"]
    x = pl.lit("X").alias("ph")
    frames = [
        trace.ops.select(x, "cat", "name", "pid", "tid", "ts", "dur"),
        trace.launches.select(x, "cat", "name", "pid", "tid", "ts", "dur",
                              pl.struct("correlation").alias("args")),
        trace.gpu.select(x, pl.col("kind").replace_strict(GPU_EVENT_CATS, default="kernel").alias("cat"), "name",
                         "pid", "tid", "ts", "dur", pl.struct(
                             "correlation", "device", "stream", "bytes",
                             pl.col("registers").alias("registers per thread"),
                             pl.col("shared_memory").alias("shared memory"),
                             pl.col("blocks_per_sm").alias("blocks per SM"),
                             *(pl.when(pl.col(volume).is_not_null())
                               .then(pl.concat_list(volume, pl.lit(1, pl.Int64), pl.lit(1, pl.Int64))).alias(name)
                               for volume, name in (("grid_blocks", "grid"), ("block_threads", "block")))
                         ).alias("args")),
        pl.DataFrame({"ph": "M", "name": "process_name", "pid": trace.devices,
                      "args": [{"name": f"GPU {d}"} for d in trace.devices]}),
    ]
    yield b'{"deviceProperties":' + orjson.dumps(trace.meta.devices) + b',"traceEvents":['
    first = True
    for frame in frames:
        if not frame.height:
            continue
        frame = frame.select([c for c in (*host, "args") if c in frame.columns])
        out = io.BytesIO()
        frame.write_ndjson(out)
        # One event per line, each line one JSON object with its newlines escaped: commas join them.
        yield (b"" if first else b",") + out.getvalue().rstrip(b"\n").replace(b"\n", b",")
        first = False
    yield b"]}"


def _raw_chunks(source: str, read: FileIdentity | None) -> Iterator[bytes]:
    """The file's bytes, gunzipped when gzip (members concatenated, as the reader reads them), a piece at a
    time: the copy is streamed, so annotating costs no second copy of the trace in memory. The file must be the
    one read (`read`), before and after."""
    # Opened without waiting: a FIFO put in its place would wait for a writer for ever.
    fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with open(fd, "rb") as fh:
        _still(read, fd)
        compressed = fh.read(2) == b"\x1f\x8b"
        fh.seek(0)
        yield from (_gunzipped(fh) if compressed else iter(lambda: fh.read(CHUNK_BYTES), b""))
        _still(read, fd)


def _still(read: FileIdentity | None, fd: int) -> None:
    """TraceError unless the open file is the one read: one moved over it, or rewritten, since would give a copy
    of another trace under these findings."""
    if read is None or not unchanged(read, os.fstat(fd)):
        raise TraceError("unreadable", "the input changed after it was read: no copy written (it would not be the "
                         "trace analysed)")


def _gunzipped(fh: Any) -> Iterator[bytes]:
    decomp = zlib.decompressobj(wbits=47)
    while data := fh.read(CHUNK_BYTES):
        while data:
            out = decomp.decompress(data, CHUNK_BYTES)
            if out:
                yield out
            data = decomp.unconsumed_tail
            if decomp.eof and decomp.unused_data:
                data, decomp = decomp.unused_data, zlib.decompressobj(wbits=47)
    if tail := decomp.flush():
        yield tail


def _insertion_point(head: bytes | bytearray) -> int | None:
    """Just after the "[" that opens the event list, or None when `head` does not reach it yet."""
    start = 3 if head.startswith(_BOM) else 0
    first = _NON_SPACE.search(head, start)
    if first is not None and head[first.start():first.start() + 1] == b"[":
        return first.start() + 1  # a bare list of events (Trace Event Format allows it)
    key = _EVENTS_KEY.search(head)
    return key.end() if key else None


def insert(chunks: Iterator[bytes], added: list[dict[str, Any]]) -> Iterator[bytes]:
    """The document with `added` at the start of its event list; the original bytes pass through as they
    are. Raises TraceError when the event list cannot be found near the start."""
    head = bytearray()
    at = None
    for chunk in chunks:
        head += chunk
        at = _insertion_point(head)
        # Also look past "[" for the next byte, to know whether the list is empty.
        if at is not None and _NON_SPACE.search(head, at) is not None:
            break
        if len(head) > HEAD_LIMIT:
            break
    if at is None:
        raise TraceError("not-a-trace", "no traceEvents list to annotate")
    rest = _NON_SPACE.search(head, at)
    empty = rest is not None and head[rest.start():rest.start() + 1] == b"]"
    yield bytes(head[:at])
    if added:
        yield b"\n" + b",\n".join(orjson.dumps(e) for e in added) + (b"\n" if empty else b",\n")
    yield bytes(head[at:])
    del head
    yield from chunks


def write(source: str, target: str, trace: Trace, findings: list[dict[str, Any]]) -> None:
    """Write `source` with the findings' events to `target`: gzip when the target's name ends in .gz (an
    input's own name under a directory target), plain JSON otherwise, whatever the input was."""
    if trace.meta.incomplete:
        raise TraceError("truncated", "cannot annotate a cut-off trace (its event list has no end)")
    compressed = target.endswith(".gz")
    added = events(trace, findings)
    try:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        # No name and mtime=0 in the gzip header: the same input gives byte-identical output.
        with replacing(target, [source]) as raw, (
                gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6, mtime=0) if compressed else raw
        ) as out:
            # The file is read again, and must be the one analysed: one moved over it or made a FIFO since (a copy
            # of another trace under these findings; a wait for ever) is refused.
            chunks = _model_chunks(trace) if trace.meta.profiler == "nsys" else _chunks(source, trace.meta.file)
            for piece in insert(chunks, added):
                out.write(piece)
    except WouldOverwriteInput as exc:
        raise TraceError("unwritable", f"--annotate would overwrite the input {target}") from exc
    except (OSError, zlib.error) as exc:
        raise TraceError("unwritable", f"cannot write {target} ({getattr(exc, 'strerror', None) or exc})") from exc


def targets_for(paths: list[str], out: str, keep: Iterable[str] = ()) -> dict[str, str]:
    """Where each input trace's annotated copy goes. One input file: OUT is the file (or a directory to put
    it in, when it is one or ends with a slash). A directory: OUT is a directory with the same relative names.
    Several inputs: OUT is a directory with each input's name under it. Raises ValueError on stdin, an empty
    OUT, clashing names, or a copy that would replace an input or one of the files in `keep` (the run's config,
    baseline...)."""
    from attntrace.read.inputs import discover

    if "-" in paths:
        raise ValueError("--annotate needs trace files or directories, not stdin")
    if not out:  # Path("") is ".": the copies went into the working directory, over the user's files there
        raise ValueError("--annotate needs a file or directory, not an empty path")
    single_file = len(paths) == 1 and not Path(paths[0]).is_dir()
    # "out/" names a directory even before it exists (Path drops the slash: a file named out was written).
    into_folder = out.endswith(("/", os.sep)) or Path(out).is_dir()
    if not single_file and os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--annotate {out} must be a directory for a directory or several traces")
    mapping: dict[str, str] = {}
    for given in paths:
        root = Path(given)
        for item in discover([given]):
            if not isinstance(item, tuple):
                continue
            path = item[0]
            if single_file:
                target = Path(out) / root.name if into_folder else Path(out)
            elif root.is_dir():
                rel = Path(path).relative_to(root)
                target = Path(out) / (rel if len(paths) == 1 else Path(root.resolve().name) / rel)
            else:
                target = Path(out) / root.name
            if str(target) in mapping.values():
                raise ValueError(f"--annotate: two inputs would both be written to {target}")
            mapping[path] = str(target)
    # Asked before any trace is read: a refused target is a usage error, not a trace that could not be read.
    inputs = {os.path.realpath(p) for p in (*mapping, *keep)}
    clash = next((t for t in sorted(mapping.values()) if os.path.realpath(t) in inputs), None)
    if clash is not None:
        raise ValueError(f"--annotate would overwrite the input {clash}: give another file or a directory")
    return mapping
