"""Nsight Systems exports (`nsys export --type sqlite`): the same facts a Kineto trace holds, read with SQL and
polars into the column tables the Kineto decoder's events give (model/tables.py), so that every rule and
surface works on them unchanged.

What is read, and how it maps (TRACE_FORMAT.md names the Kineto side):
- CUPTI_ACTIVITY_KIND_KERNEL -> GPU events of kind kernel: the demangled name, device, stream, correlation id,
  registers, shared memory (static + dynamic), grid and block volumes;
- CUPTI_ACTIVITY_KIND_MEMCPY / _MEMSET -> memcpy / memset, named as Kineto names them ("Memcpy DtoD (Device ->
  Device)", "Memset (Device)"), with their bytes;
- CUPTI_ACTIVITY_KIND_RUNTIME -> runtime and driver calls, their names without nsys's version suffix
  (cudaLaunchKernel_v7000 -> cudaLaunchKernel), on the process and thread of their serialized globalTid;
- NVTX_EVENTS push/pop and start/end ranges -> CPU ops: `torch.autograd.profiler.emit_nvtx()` writes every op as
  "aten::mm, seq = 3, op_id = 17, sizes = [[4, 5], [5, 6]]": the name is the op, the sizes its Input Dims;
  other ranges (a user's `nvtx.range("step")`, ProfilerStep#N) are annotations, as record_function's are;
- TARGET_INFO_GPU -> device properties under Kineto's names; StringIds resolve every name id;
- PROFILER_OVERHEAD and CUPTI_ACTIVITY_KIND_OVERHEAD -> notes of nsys's and CUPTI's own time, and of CUDA's
  (a full command buffer: launches that waited for the GPU).
Times are nanoseconds there and microseconds here. The file is opened read-only (`mode=ro`) and never written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import polars as pl

from attntrace.read.errors import TraceError
from attntrace.read.events import Document
from attntrace.read.raw import Buffer, RawTrace

SQLITE_MAGIC = b"SQLite format 3\x00"
KNOWN_SCHEMA_MAJOR = 3  # Nsight Systems 2021.x to 2026.2 export schema 3.x (3.24 and 3.25 are in the corpus)
NVTX_RANGE_TYPES = (59, 60)  # ENUM_NSYS_EVENT_TYPE: NvtxPushPopRange, NvtxStartEndRange
BATCH_ROWS = 1 << 18  # rows fetched at a time: one batch's Python tuples live at once, not the table's
LOCK_WAIT_S = 1.0  # how long a reader waits for a writer's lock before the file is refused

# CUPTI's copy kinds (ENUM_CUDA_MEMCPY_OPER) and memory kinds (ENUM_CUDA_MEM_KIND), as Kineto spells them.
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
              10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
MEMORY_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
                6: "Managed Static"}
# TARGET_INFO_GPU's columns under the names of Kineto's deviceProperties (occupancy.py, peaks.py read those).
DEVICE_PROPERTIES = {"id": "id", "name": "name", "totalMemory": "totalGlobalMem", "computeMajor": "computeMajor",
                     "computeMinor": "computeMinor", "maxThreadsPerBlock": "maxThreadsPerBlock",
                     "maxRegistersPerBlock": "regsPerBlock", "maxRegistersPerSm": "regsPerMultiprocessor",
                     "threadsPerWarp": "warpSize", "maxShmemPerBlock": "sharedMemPerBlock",
                     "maxShmemPerSm": "sharedMemPerMultiprocessor",
                     "maxShmemPerBlockOptin": "sharedMemPerBlockOptin", "smCount": "numSms"}
# An op name that is a PyTorch operator (aten::mm, c10d::allreduce_, prim::...): a CPU op as Kineto's cpu_op;
# any other range (FSDP::pre_forward, a user's "step") is an annotation.
OP_NAMESPACE = r"^[a-z_][a-z0-9_]*::"
# emit_nvtx's range text: name[, seq = N][, op_id = N][, sizes = [[...]]][, input_op_ids = [...]].
NVTX_OP_TEXT = (r"^(?s)(?P<name>.*?)(?:, seq = -?\d+)?(?:, op_id = \d+)?(?:, sizes = (?P<sizes>\[.*?\]))?"
                r"(?:, input_op_ids = .*)?$")

GPU_SCHEMA = {"name": pl.String, "cat": pl.String, "pid": pl.Int64, "tid": pl.Int64, "ts": pl.Float64,
              "dur": pl.Float64, "external_id": pl.Int64, "correlation": pl.Int64, "registers": pl.Int64,
              "shared_memory": pl.Int64, "blocks_per_sm": pl.Float64, "occupancy": pl.Float64, "device": pl.Int64,
              "stream": pl.Int64, "bytes": pl.Int64, "grid_blocks": pl.Int64, "block_threads": pl.Int64}
HOST_SCHEMA = {"name": pl.String, "cat": pl.String, "pid": pl.Int64, "tid": pl.Int64, "ts": pl.Float64,
               "dur": pl.Float64}


def is_sqlite_file(path: str) -> bool:
    """Whether `path` is a local regular file that starts as a SQLite database does (by content, not name)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as fh:
            return fh.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return False  # the ordinary reader names the problem


def is_sqlite(data: Buffer) -> bool:
    return bytes(data[:len(SQLITE_MAGIC)]) == SQLITE_MAGIC


def read_export(path: str, data: Buffer | None = None) -> RawTrace:
    """An Nsight Systems SQLite export as a RawTrace whose `frames` hold its tables; from the file at `path`, or
    from `data` (stdin, a URL) when given. TraceError with one line when it is not one, or cannot be read."""
    with _readable_copy(path, data) as where:
        try:
            connection = _connect(where, data, private=where != path)
        except sqlite3.Error as exc:
            raise TraceError(*_sqlite_problem(exc)) from None
        try:
            with contextlib.closing(connection):
                return _read(connection, path, len(data) if data is not None else os.path.getsize(path))
        except sqlite3.Error as exc:
            raise TraceError(*_sqlite_problem(exc)) from None
        except (ValueError, TypeError, KeyError, OverflowError, pl.exceptions.PolarsError) as exc:
            # SQLite keeps any value in any column: text or NULL where Nsight writes an id is the file's problem
            # (one line naming it), not "internal error; please report it".
            detail = " ".join(str(exc).split())[:120]
            raise TraceError("bad-trace", "an Nsight Systems export holding a value Nsight does not write "
                             f"({type(exc).__name__}: {detail}); export it again") from None


@contextlib.contextmanager
def _readable_copy(path: str, data: Buffer | None) -> Iterator[str]:
    """Where to open the export: the file itself, or, when a reader would have to write beside it, a private copy
    that is removed after. A -wal file with pages not yet in the database needs a -shm file to be read (SQLite made
    one beside the user's file, or rewrote theirs), and a hot -journal must be rolled back first (read-only, that
    was "attempt to write a readonly database"). The copy holds the database and that file, nothing else."""
    side = next((f"{path}{suffix}" for suffix in ("-wal", "-journal") if data is None and _pages_in(f"{path}{suffix}")),
                None)
    if side is None:
        yield path
        return
    folder = tempfile.mkdtemp(prefix="attntrace-sqlite-")
    try:
        copy = os.path.join(folder, "export.sqlite")
        try:
            shutil.copyfile(path, copy)
            shutil.copyfile(side, copy + side[len(path):])
        except OSError as exc:
            raise TraceError("unreadable", f"cannot copy it with its {side[len(path):]} file to read it "
                             f"({exc.strerror or exc})") from None
        yield copy
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _pages_in(side_file: str) -> bool:
    try:
        return os.path.getsize(side_file) > 0
    except OSError:
        return False


def _connect(path: str, data: Buffer | None, private: bool = False) -> sqlite3.Connection:
    if private:  # attntrace's own copy: SQLite may write beside it (its -shm, a journal's rollback)
        connection = sqlite3.connect(path, timeout=LOCK_WAIT_S, check_same_thread=False)
    elif data is None:
        # mode=ro: the user's file is never written (no journal, no index, no lock beyond a reader's).
        immutable = "&immutable=1" if _wal_without_pending_pages(path) else ""
        connection = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro{immutable}", uri=True,
                                     timeout=LOCK_WAIT_S, check_same_thread=False)
    else:
        connection = sqlite3.connect(":memory:", check_same_thread=False)
        connection.deserialize(bytes(data))
    connection.execute("PRAGMA query_only = ON")
    return connection


def _wal_without_pending_pages(path: str) -> bool:
    """Whether the file is in WAL mode (its header's read and write versions are 2) with no pages in a -wal file
    beside it. Read as immutable, it gets no -shm and -wal files made beside it (a reader of a WAL file makes them,
    and is refused in a read-only folder). Only then: immutable reads no -wal file's pages, and takes no locks (a
    rollback-journal export being written is reported locked)."""
    try:
        with open(path, "rb") as file:
            header = file.read(20)
        return len(header) == 20 and header[18:20] == b"\x02\x02" and not _pages_in(f"{path}-wal")
    except OSError:
        return False


def _sqlite_problem(exc: sqlite3.Error) -> tuple[str, str]:
    text = " ".join(str(exc).split())
    if "locked" in text or "busy" in text:
        return "unreadable", f"the SQLite file is locked by another program ({text}); read it once that is done"
    if "not a database" in text or "malformed" in text or "disk image" in text:
        return "bad-trace", f"a damaged or truncated SQLite file ({text})"
    return "unreadable", f"cannot read this SQLite file ({text})"


def _columns(connection: sqlite3.Connection) -> dict[str, set[str]]:
    """Each table's columns."""
    names = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    # A quote in a table's name (an extra table a user added) is doubled, as SQL quotes it.
    return {name: {row[1] for row in connection.execute(f'PRAGMA table_info("{name.replace(chr(34), chr(34) * 2)}")')}
            for name in names}


def schema_version(connection: sqlite3.Connection, tables: dict[str, set[str]]) -> str:
    """The export's schema version, refused (TraceError) when the file is no Nsight Systems export or of a schema
    this reader does not know."""
    activity = [t for t in tables if t.startswith("CUPTI_ACTIVITY_KIND_") or t == "NVTX_EVENTS"]
    if "StringIds" not in tables or not activity:
        raise TraceError("not-a-trace", "a SQLite database, not an Nsight Systems export (no StringIds, "
                         "CUPTI_ACTIVITY_KIND_* or NVTX_EVENTS tables)")
    version = None
    if "META_DATA_EXPORT" in tables and {"name", "value"} <= tables["META_DATA_EXPORT"]:
        found = connection.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_SCHEMA_VERSION'").fetchone()
        version = str(found[0]) if found and found[0] is not None else None
    if version is None:
        raise TraceError("unsupported", "an Nsight Systems export without a schema version (no "
                         "EXPORT_SCHEMA_VERSION in META_DATA_EXPORT): export it again with nsys 2021 or later")
    major = version.split(".", 1)[0]
    # ASCII digits, few of them: str.isdigit takes "³", which int() refuses, and int() refuses 5,000 digits.
    if not (major.isascii() and major.isdigit() and len(major) <= 9) or int(major) != KNOWN_SCHEMA_MAJOR:
        raise TraceError("unsupported", f"an Nsight Systems export of schema version {version[:40]}, which this reader "
                         f"does not know (it reads schema {KNOWN_SCHEMA_MAJOR}.x)")
    return version


# The tables whose rows are timed events: each needs both times (SQLite reads "end" of a table without that column as
# the text 'end', which was "a value of the wrong type", where the column is what is missing).
TIMED_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                "CUPTI_ACTIVITY_KIND_RUNTIME")


def _missing_times(tables: dict[str, set[str]]) -> str | None:
    for table in TIMED_TABLES:
        missing = [column for column in ("start", "end") if table in tables and column not in tables[table]]
        if missing:
            return (f"an Nsight Systems export whose {table} table has no {' or '.join(missing)} column, which "
                    "Nsight always writes; export it again")
    return None


def _read(connection: sqlite3.Connection, path: str, size: int) -> RawTrace:
    tables = _columns(connection)
    problem = _missing_times(tables)
    if problem:
        raise TraceError("bad-trace", problem)
    version = schema_version(connection, tables)
    strings = _frame(connection, "SELECT id, value FROM StringIds", {"id": pl.Int64, "value": pl.String})
    devices = _devices(connection, tables)
    by_process = _by_process(tables)
    gpu = pl.concat([_with_blocks_per_sm(_kernels(connection, tables, strings, by_process), devices),
                     _memcpys(connection, tables, by_process), _memsets(connection, tables, by_process)],
                    how="vertical_relaxed")
    ops, op_inputs = _ops(connection, tables)
    notes = [f"read from an Nsight Systems export (schema {version})"]
    if not ops.height:
        notes.append("no NVTX op ranges: ops are unknown (capture with torch.autograd.profiler.emit_nvtx())")
    notes.extend(_overhead_notes(connection, tables))
    document = Document(traceEvents=[], deviceProperties=devices,
                        record_shapes=bool((op_inputs["input_dims"].bin.size() > 0).any()) or None)
    empty_host = pl.DataFrame(schema=HOST_SCHEMA)
    frames = {"ops": ops, "launches": _launches(connection, tables, strings, by_process), "gpu": gpu,
              "flows": pl.DataFrame(schema={"ph": pl.String, "cat": pl.String, "id": pl.String, "ts": pl.Float64,
                                            "tid": pl.String}),
              "gpu_annotations": empty_host, "python": empty_host, "op_args": op_inputs}
    notes.extend(_drop_untimed(frames))
    if not any(frame.height for name, frame in frames.items() if name in ("ops", "launches", "gpu")):
        raise TraceError("empty", "an Nsight Systems export with no kernels, copies, runtime calls or NVTX ranges")
    return RawTrace(path, size, document, notes=notes, frames=frames, profiler="nsys")


def _drop_untimed(frames: dict[str, Any]) -> list[str]:
    """Rows without a start or an end (NULL: Nsight writes none) left out, as a Kineto event without a time is;
    a note says how many. A table of them all ended in "internal error (TypeError ...)" on the first min()."""
    dropped = 0
    for name in ("ops", "launches", "gpu"):
        frame = frames[name]
        timed = frame.filter(pl.col("ts").is_not_null() & pl.col("dur").is_not_null())
        if timed.height != frame.height:
            if name == "ops":  # op_args is in the ops' order
                keep = (frame["ts"].is_not_null() & frame["dur"].is_not_null())
                frames["op_args"] = frames["op_args"].filter(keep)
            dropped += frame.height - timed.height
            frames[name] = timed
    return [f"{dropped} row(s) without a start or an end ignored"] if dropped else []


def _frame(connection: sqlite3.Connection, query: str, schema: dict[str, Any]) -> pl.DataFrame:
    """A query's rows as a typed frame, fetched BATCH_ROWS at a time."""
    cursor = connection.execute(query)
    parts = []
    while rows := cursor.fetchmany(BATCH_ROWS):
        try:
            parts.append(pl.DataFrame(rows, schema=schema, orient="row"))
        except (pl.exceptions.PolarsError, TypeError, OverflowError) as exc:
            # SQLite keeps any value in any column: a hand-edited or damaged export's text where Nsight writes
            # integers. Polars' own message (a builder's schema advice) would read as this program's bug.
            # The table of the outer query (the last FROM): NVTX_EVENTS' query names StringIds in a sub-query.
            table = query.rsplit(" FROM ", 1)[1].split()[0] if " FROM " in query else "a table"
            raise TraceError("bad-trace", f"{table} holds a value of the wrong type for an Nsight Systems export "
                             f"({str(exc).splitlines()[0].split(';')[0][:120]})") from None
        del rows
    if not parts:
        return pl.DataFrame(schema=schema)
    return parts[0] if len(parts) == 1 else pl.concat(parts, rechunk=True)


def _col(columns: set[str], *names: str, combine: str = " + ") -> str:
    """SQL for a column (or the combination of several) where the table has them all, else NULL: exports that
    left columns out (a stripped file) are read with what they have."""
    if all(n in columns for n in names):
        return combine.join(f'"{n}"' for n in names)
    return "NULL"


# CUPTI counts correlation ids per process (32 bits): two processes in one export reuse each other's, and a GPU
# event of one was linked to the other's runtime call (16 of 2,108 on a two-GPU export, up to 0.9 s after them).
# Where both sides name their process, the id read is the process's and its own: pid * 2**32 + id.
PROCESS_ID_SHIFT = 1 << 32


def _by_process(tables: dict[str, set[str]]) -> bool:
    """Whether runtime calls and every GPU activity table of the export name their process."""
    gpu = [tables[t] for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                               "CUPTI_ACTIVITY_KIND_MEMSET") if t in tables]
    return "globalTid" in tables.get("CUPTI_ACTIVITY_KIND_RUNTIME", set()) and all("globalPid" in c for c in gpu)


def _process_correlation(process: pl.Expr) -> pl.Expr:
    return pl.when(process.is_not_null()).then(process * PROCESS_ID_SHIFT + pl.col("correlation")) \
        .otherwise(pl.col("correlation")).alias("correlation")


def _ns_to_us(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns((pl.col("start") / 1000.0).alias("ts"),
                              ((pl.col("end") - pl.col("start")) / 1000.0).alias("dur"))


def _named(frame: pl.DataFrame, strings: pl.DataFrame, key: str) -> pl.DataFrame:
    """The name of each row's string id (a join on the few distinct ids, not a lookup per row)."""
    return frame.join(strings.rename({"id": key, "value": "name"}), on=key, how="left", maintain_order="left")


def _kernels(connection: sqlite3.Connection, tables: dict[str, set[str]], strings: pl.DataFrame,
             by_process: bool) -> pl.DataFrame:
    columns = tables.get("CUPTI_ACTIVITY_KIND_KERNEL")
    if columns is None:
        return pl.DataFrame(schema=GPU_SCHEMA)
    name_id = "COALESCE(demangledName, shortName)" if {"demangledName", "shortName"} <= columns else _col(
        columns, "demangledName") if "demangledName" in columns else _col(columns, "shortName")
    query = (f'SELECT start, "end", {_col(columns, "deviceId")}, {_col(columns, "streamId")}, '
             f'{_col(columns, "correlationId")}, {name_id}, {_col(columns, "registersPerThread")}, '
             f'{_col(columns, "staticSharedMemory", "dynamicSharedMemory")}, '
             f'{_col(columns, "gridX", "gridY", "gridZ", combine=" * ")}, '
             f'{_col(columns, "blockX", "blockY", "blockZ", combine=" * ")}, '
             f'{_col(columns, "globalPid") if by_process else "NULL"} FROM CUPTI_ACTIVITY_KIND_KERNEL')
    raw = _frame(connection, query, {"start": pl.Int64, "end": pl.Int64, "device": pl.Int64, "stream": pl.Int64,
                                     "correlation": pl.Int64, "name_id": pl.Int64, "registers": pl.Int64,
                                     "shared_memory": pl.Int64, "grid_blocks": pl.Int64, "block_threads": pl.Int64,
                                     "global_pid": pl.Int64})
    named = _named(_with_process_correlation(raw), strings, "name_id")
    return _ns_to_us(named).select(
        pl.col("name").fill_null("(unnamed kernel)"), pl.lit("kernel").alias("cat"), pl.col("device").alias("pid"),
        pl.col("stream").alias("tid"), "ts", "dur", pl.lit(None, pl.Int64).alias("external_id"), "correlation",
        "registers", "shared_memory", pl.lit(None, pl.Float64).alias("blocks_per_sm"),
        pl.lit(None, pl.Float64).alias("occupancy"), "device", "stream", pl.lit(None, pl.Int64).alias("bytes"),
        "grid_blocks", "block_threads").cast(GPU_SCHEMA)  # type: ignore[arg-type]


def _with_process_correlation(raw: pl.DataFrame) -> pl.DataFrame:
    """GPU activity's correlation ids made its process's own (globalPid holds the pid as globalTid does)."""
    return raw.with_columns(_process_correlation(_pid_of("global_pid")))


def _with_blocks_per_sm(kernels: pl.DataFrame, devices: list[dict[str, Any]]) -> pl.DataFrame:
    """Kineto's `blocks per SM` (the grid over the device's SMs: under 1, most SMs idle), where the export gives
    the device's SM count."""
    sms = {d["id"]: d["numSms"] for d in devices if isinstance(d.get("numSms"), int) and d["numSms"] > 0}
    if not sms or not kernels.height:
        return kernels
    per_device = pl.col("device").replace_strict(sms, default=None, return_dtype=pl.Float64)
    return kernels.with_columns((pl.col("grid_blocks") / per_device).alias("blocks_per_sm"))


def _copies(connection: sqlite3.Connection, table: str, columns: set[str], kind: str, name: pl.Expr,
            extra: list[str], by_process: bool) -> pl.DataFrame:
    query = (f'SELECT start, "end", {_col(columns, "deviceId")}, {_col(columns, "streamId")}, '
             f'{_col(columns, "correlationId")}, {_col(columns, "bytes")}, '
             f'{_col(columns, "globalPid") if by_process else "NULL"}, '
             + ", ".join(_col(columns, c) for c in extra) + f" FROM {table}")
    raw = _frame(connection, query, {"start": pl.Int64, "end": pl.Int64, "device": pl.Int64, "stream": pl.Int64,
                                     "correlation": pl.Int64, "bytes": pl.Int64, "global_pid": pl.Int64,
                                     **{c: pl.Int64 for c in extra}})
    return _ns_to_us(_with_process_correlation(raw)).select(
        name.alias("name"), pl.lit(kind).alias("cat"), pl.col("device").alias("pid"),
        pl.col("stream").alias("tid"), "ts", "dur", pl.lit(None, pl.Int64).alias("external_id"), "correlation",
        *(pl.lit(None, dtype).alias(c) for c, dtype in (("registers", pl.Int64), ("shared_memory", pl.Int64),
                                                          ("blocks_per_sm", pl.Float64), ("occupancy", pl.Float64))),
        "device", "stream", "bytes", pl.lit(None, pl.Int64).alias("grid_blocks"),
        pl.lit(None, pl.Int64).alias("block_threads")).cast(GPU_SCHEMA)  # type: ignore[arg-type]


def _memory_kind(column: str) -> pl.Expr:
    return pl.col(column).replace_strict(MEMORY_KINDS, default="Unknown", return_dtype=pl.String).fill_null("Unknown")


def _memcpys(connection: sqlite3.Connection, tables: dict[str, set[str]], by_process: bool) -> pl.DataFrame:
    columns = tables.get("CUPTI_ACTIVITY_KIND_MEMCPY")
    if columns is None:
        return pl.DataFrame(schema=GPU_SCHEMA)
    # Kineto's name: "Memcpy HtoD (Pageable -> Device)".
    name = pl.format("Memcpy {} ({} -> {})",
                     pl.col("copyKind").replace_strict(COPY_KINDS, default="Unknown", return_dtype=pl.String)
                     .fill_null("Unknown"), _memory_kind("srcKind"), _memory_kind("dstKind"))
    return _copies(connection, "CUPTI_ACTIVITY_KIND_MEMCPY", columns, "gpu_memcpy", name,
                   ["copyKind", "srcKind", "dstKind"], by_process)


def _memsets(connection: sqlite3.Connection, tables: dict[str, set[str]], by_process: bool) -> pl.DataFrame:
    columns = tables.get("CUPTI_ACTIVITY_KIND_MEMSET")
    if columns is None:
        return pl.DataFrame(schema=GPU_SCHEMA)
    name = pl.format("Memset ({})", _memory_kind("memKind"))  # Kineto's: "Memset (Device)"
    return _copies(connection, "CUPTI_ACTIVITY_KIND_MEMSET", columns, "gpu_memset", name, ["memKind"], by_process)


def _pid_of(column: str) -> pl.Expr:
    """The pid in a serialized globalTid or globalPid (nsys: pid in bits 24-47, tid in bits 0-23)."""
    return (pl.col(column) // (1 << 24)) % (1 << 24)


def _thread(frame: pl.DataFrame) -> pl.DataFrame:
    """pid and tid of a serialized globalTid."""
    return frame.with_columns(_pid_of("global_tid").alias("pid"), (pl.col("global_tid") % (1 << 24)).alias("tid"))


def _launches(connection: sqlite3.Connection, tables: dict[str, set[str]], strings: pl.DataFrame,
              by_process: bool) -> pl.DataFrame:
    schema = {**HOST_SCHEMA, "external_id": pl.Int64, "correlation": pl.Int64}
    columns = tables.get("CUPTI_ACTIVITY_KIND_RUNTIME")
    if columns is None or "nameId" not in columns:
        return pl.DataFrame(schema=schema)
    query = (f'SELECT start, "end", {_col(columns, "globalTid")}, {_col(columns, "correlationId")}, nameId '
             "FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    raw = _frame(connection, query, {"start": pl.Int64, "end": pl.Int64, "global_tid": pl.Int64,
                                     "correlation": pl.Int64, "name_id": pl.Int64})
    # nsys names a call by its CUPTI callback: cudaLaunchKernel_v7000; Kineto without the version.
    names = strings.select(pl.col("id").alias("name_id"),
                           pl.col("value").str.replace(r"_v\d+$", "").alias("name"))
    named = raw.join(names, on="name_id", how="left", maintain_order="left")
    driver = pl.col("name").str.starts_with("cu") & ~pl.col("name").str.starts_with("cuda")
    threads = _thread(named)
    if by_process:
        threads = threads.with_columns(_process_correlation(pl.col("pid")))
    return _ns_to_us(threads).select(
        pl.col("name").fill_null("(unnamed call)"),
        pl.when(driver).then(pl.lit("cuda_driver")).otherwise(pl.lit("cuda_runtime")).alias("cat"),
        "pid", "tid", "ts", "dur", pl.lit(None, pl.Int64).alias("external_id"), "correlation").cast(schema)  # type: ignore[arg-type]


def _ops(connection: sqlite3.Connection, tables: dict[str, set[str]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """NVTX ranges as CPU ops, and each op's input fields (Input Dims from emit_nvtx's sizes)."""
    schema = {**HOST_SCHEMA, "external_id": pl.Int64}
    inputs_schema = {"input_dims": pl.Binary, "input_types": pl.Binary, "concrete_inputs": pl.Binary,
                     "input_strides": pl.Binary}
    columns = tables.get("NVTX_EVENTS")
    if columns is None or not {"start", "end", "eventType"} <= columns:
        return pl.DataFrame(schema=schema), pl.DataFrame(schema=inputs_schema)
    text = "n.text" if "text" in columns else "NULL"
    if "textId" in columns:
        text = f"COALESCE({text}, (SELECT value FROM StringIds s WHERE s.id = n.textId))"
    kinds = ", ".join(map(str, _range_types(connection, tables)))
    thread = 'n."globalTid"' if "globalTid" in columns else "NULL"
    query = (f'SELECT n.start, n."end", {thread}, {text} '
             f'FROM NVTX_EVENTS n WHERE n.eventType IN ({kinds}) AND n."end" IS NOT NULL')
    raw = _frame(connection, query, {"start": pl.Int64, "end": pl.Int64, "global_tid": pl.Int64, "text": pl.String})
    parsed = raw.with_columns(pl.col("text").fill_null("").str.extract_groups(NVTX_OP_TEXT).alias("parts")).unnest(
        "parts")
    ops = _ns_to_us(_thread(parsed)).with_columns(pl.col("name").fill_null(pl.col("text")))
    frame = ops.select(
        "name", pl.when(pl.col("name").str.contains(OP_NAMESPACE)).then(pl.lit("cpu_op"))
        .otherwise(pl.lit("user_annotation")).alias("cat"),
        "pid", "tid", "ts", "dur", pl.lit(None, pl.Int64).alias("external_id")).cast(schema)  # type: ignore[arg-type]
    empty = pl.lit(b"", pl.Binary)
    inputs = ops.select(pl.col("sizes").fill_null("").cast(pl.Binary).alias("input_dims"),
                        empty.alias("input_types"), empty.alias("concrete_inputs"), empty.alias("input_strides"))
    return frame, inputs


def _range_types(connection: sqlite3.Connection, tables: dict[str, set[str]]) -> tuple[int, ...]:
    """The event types of NVTX ranges, as the export's own enum numbers them (NVTX_RANGE_TYPES where it has none)."""
    if {"id", "name"} <= tables.get("ENUM_NSYS_EVENT_TYPE", set()):
        found = connection.execute("SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name IN ('NvtxPushPopRange', "
                                   "'NvtxStartEndRange') ORDER BY id").fetchall()
        numbers = tuple(row[0] for row in found if isinstance(row[0], int) and not isinstance(row[0], bool))
        if numbers:  # text, NULL or a blob in place of an id: the ids Nsight gives them
            return numbers
    return NVTX_RANGE_TYPES


def _devices(connection: sqlite3.Connection, tables: dict[str, set[str]]) -> list[dict[str, Any]]:
    columns = tables.get("TARGET_INFO_GPU")
    if columns is None or "id" not in columns:
        return []
    wanted = [c for c in DEVICE_PROPERTIES if c in columns]
    extra = [c for c in ("maxWarpsPerSm", "threadsPerWarp") if c in columns and c not in wanted]
    rows = connection.execute(f"SELECT {', '.join(chr(34) + c + chr(34) for c in wanted + extra)} "
                              "FROM TARGET_INFO_GPU ORDER BY id").fetchall()
    devices: dict[int, dict[str, Any]] = {}
    for row in rows:
        values = dict(zip(wanted + extra, row, strict=True))
        props = {DEVICE_PROPERTIES[c]: values[c] for c in wanted if values[c] is not None}
        warps, warp = values.get("maxWarpsPerSm"), values.get("threadsPerWarp")
        if isinstance(warps, int) and isinstance(warp, int):
            props["maxThreadsPerMultiprocessor"] = warps * warp
        devices.setdefault(values["id"], props)  # one row per VM and device: the first
    return list(devices.values())


# ENUM_CUPTI_OVERHEAD_TYPE: the profiler's own (CUPTI's buffers, instrumentation, resources), and CUDA's (JIT,
# module and function loading, a full command buffer: launches that waited for the GPU to drain its queue).
PROFILER_OVERHEAD_TYPES = {3: "buffer flush", 4: "instrumentation", 5: "resource creation"}
CUDA_OVERHEAD_TYPES = {2: "JIT compilation", 6: "module loading", 7: "lazy function loading",
                       8: "command buffer full (launches waited for the GPU's queue)"}


def _overhead_notes(connection: sqlite3.Connection, tables: dict[str, set[str]]) -> Iterator[str]:
    """nsys's own time, and CUDA's that CUPTI reports beside it, as the export recorded them: said, so that a reader
    knows what the capture cost and why launches may have waited. The replay without the profiler (model/replay.py)
    models torch.profiler's per-event cost, not nsys's: its figures for an export are rougher."""
    if "PROFILER_OVERHEAD" in tables and {"start", "end"} <= tables["PROFILER_OVERHEAD"]:
        count, total = connection.execute('SELECT COUNT(*), SUM("end" - start) FROM PROFILER_OVERHEAD').fetchone()
        if count:
            yield f"nsys's own work: {count} range(s), {(total or 0) / 1e6:.3f} ms of CPU (PROFILER_OVERHEAD)"
    if "CUPTI_ACTIVITY_KIND_OVERHEAD" in tables and {"start", "end", "overheadType"} <= tables[
            "CUPTI_ACTIVITY_KIND_OVERHEAD"]:
        rows = connection.execute('SELECT overheadType, COUNT(*), SUM("end" - start) FROM CUPTI_ACTIVITY_KIND_OVERHEAD '
                                  "GROUP BY overheadType ORDER BY overheadType").fetchall()
        for kind, count, total in rows:
            if kind in PROFILER_OVERHEAD_TYPES:
                yield (f"CUPTI's own work: {count} {PROFILER_OVERHEAD_TYPES[kind]} range(s), "
                       f"{(total or 0) / 1e6:.3f} ms of CPU")
            elif kind in CUDA_OVERHEAD_TYPES:
                yield f"CUDA: {count} {CUDA_OVERHEAD_TYPES[kind]} range(s), {(total or 0) / 1e6:.3f} ms of CPU"
    yield ("the estimate without the profiler uses torch.profiler's per-event costs; nsys's own per-event cost is "
           "not modelled, so for this export it is rough")
