"""The read layer: from what the user named to decoded events, in one module per concern.

- inputs: finding the inputs (files, directories, globs, stdin, URLs);
- buffers: getting the bytes (read into a private copy, never mapped; streams, FIFOs, size limits, the memory guard);
- encodings: gzip and text encodings;
- decoding: JSON into typed events, whole or in pieces, tolerant of odd events;
- salvage: the complete events of a cut-off file;
- nsys: Nsight Systems SQLite exports, read into the same tables (recognised by their content);
- raw: what they build (RawTrace, Pieces, ReadOptions).
"""

from __future__ import annotations

from attntrace.read.buffers import check_memory, file_identity, let_go, load_bytes
from attntrace.read.decoding import decode, salvaged
from attntrace.read.errors import TraceError
from attntrace.read.inputs import discover, input_roots
from attntrace.read.nsys import is_sqlite, is_sqlite_file, read_export
from attntrace.read.raw import CHUNK_BYTES, DEFAULT_MAX_BYTES, RawTrace, ReadOptions

__all__ = ["CHUNK_BYTES", "DEFAULT_MAX_BYTES", "RawTrace", "ReadOptions", "TraceError", "discover", "input_roots",
           "read"]


def read(path: str, options: ReadOptions | None = None) -> RawTrace:
    """One trace, read and decoded (in pieces when large); TraceError with a one-line reason otherwise."""
    options = options or ReadOptions()
    if is_sqlite_file(path):  # an Nsight Systems export, opened where it is (read-only), not read into memory
        return read_export(path)
    data, cut, identity = load_bytes(path, options.max_bytes, options.salvage)
    if is_sqlite(data):  # one from stdin or a URL
        return read_export(path, data)
    check_memory(len(data))
    if not cut:
        raw = decode(path, data, options.salvage)
        if raw.pieces is not None and raw.pieces.data is data and not raw.rewritten:
            raw.pieces.source = file_identity(path, data)
        let_go(data, 0, len(data))  # what the checks over the whole file read in: pieces are read again as decoded
    else:
        try:
            raw = decode(path, data, salvage=False)
            raw.incomplete = True
            raw.notes.append("incomplete trace: the gzip stream was cut off")
        except TraceError:
            raw = salvaged(path, data)
    raw.file = identity
    return raw
