"""Read trace files into typed events, fast, decoding only the fields the model uses.

The fast path decodes the whole document with msgspec into structs in one call. A trace whose events
break the expected types (a string duration, a string External id) is decoded again event by event,
coercing what can be coerced and counting what cannot, so one odd event does not lose the trace.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import mmap
import os
import re
import stat
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from attntrace import workers
from attntrace.errors import TRACE_SUFFIXES, TraceError
from attntrace.events import (
    READ_PHASES,
    SKIPPED_PHASES,
    AnyEvent,
    Args,
    Document,
    Metadata,
    Outline,
    TraceEvent,
    Unphased,
)

# A trace's bytes: read into memory, or a large file mapped copy-on-write (see _mapped).
Buffer = bytes | bytearray | mmap.mmap


def default_max_bytes() -> int:
    """16 GiB, or the memory available now when that is less: a larger trace could not be analysed anyway."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return min(16 * 2**30, int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return 16 * 2**30


DEFAULT_MAX_BYTES = default_max_bytes()  # decompressed size refused beyond this (--max-size)


@dataclass
class RawTrace:
    path: str
    size: int  # bytes after decompression
    document: Document  # metadata, and the events when they were decoded in one piece
    dropped_events: int = 0
    notes: list[str] = field(default_factory=list)
    incomplete: bool = False  # salvaged from a cut-off file: the last events are missing
    rewritten: bool = False  # the bytes decoded differ from the input's (re-encoded, surrogates replaced)
    chunks: Callable[[], Iterator[list[TraceEvent]]] | None = None  # events decoded piece by piece, once
    pieces: Pieces | None = field(default=None, repr=False)

    def take_pieces(self) -> Pieces | None:
        """The pieces, for a caller that decodes them itself (in other processes); the events are then not
        decoded here. None when the trace is not in pieces."""
        pieces = self.pieces
        if pieces is not None:
            self.pieces = self.chunks = None
        return pieces

    def count_dropped(self, dropped: int) -> None:
        if dropped:
            self.dropped_events += dropped
            self.notes[:] = [n for n in self.notes if not n.endswith("malformed events ignored")]
            self.notes.append(f"{self.dropped_events} malformed events ignored")

    def event_chunks(self) -> Iterator[list[TraceEvent]]:
        """The events, in file order, as lists; a large Kineto file is decoded 16 MiB at a time so that only
        one piece's Python objects live at once."""
        if self.chunks is None:
            yield self.document.traceEvents
        else:
            yield from self.chunks()


@dataclass(frozen=True)
class ReadOptions:
    max_bytes: int = DEFAULT_MAX_BYTES
    salvage: bool = False  # analyse the complete events of a cut-off file instead of refusing it
    roots: tuple[str, ...] = ()  # the directories given, which name the traces found in them (model/identity.py)


_NON_SPACE = re.compile(rb"[^ \t\r\n]")
_EVENTS = msgspec.json.Decoder(list[AnyEvent])
_DOCUMENT = msgspec.json.Decoder(Document)
_OUTLINE = msgspec.json.Decoder(Outline)
_ANY = msgspec.json.Decoder()


_GLOB = re.compile(r"[*?\[]")


def input_roots(paths: list[str]) -> tuple[str, ...]:
    """The inputs that name a set of traces (directories, URL prefixes, quoted patterns' folders): a trace
    found under one is known by its name and the path below it (model/identity.py)."""
    roots = []
    for given in paths:
        magic = _GLOB.search(given)
        if given == "-":
            continue
        if magic:
            roots.append(given[:magic.start()].rsplit("/", 1)[0] or ".")
        elif "://" in given:
            if not given.endswith(TRACE_SUFFIXES):
                roots.append(given)
        else:
            with contextlib.suppress(OSError):
                if Path(given).is_dir():
                    roots.append(given)
    return tuple(roots)


def discover(paths: list[str]) -> Iterator[tuple[str, bool] | TraceError]:
    """Expand directories into their JSON files, sorted; yield (path, found in a directory) for each input,
    or why the input is unusable. A directory scan takes regular files only (a FIFO there would block);
    a FIFO or pipe named on the command line is read as a stream."""
    stdin_seen = False
    from attntrace import sources  # URLs: a small module; fsspec itself is imported only for a URL

    for given in paths:
        if given == "-":
            if stdin_seen:
                yield TraceError("usage", "stdin ('-') can be read only once", path=given)
            else:
                stdin_seen = True
                yield given, False
            continue
        if sources.is_url(given):
            yield from sources.discover(given)
            continue
        path = Path(given)
        try:
            is_dir = path.is_dir()
            exists = is_dir or os.path.lexists(path)  # a broken or looping link is named by open()'s own error
        except OSError as exc:  # a parent directory that cannot be searched
            yield TraceError("unreadable", exc.strerror or str(exc), path=given)
            continue
        if is_dir:
            found, problems = _walk_traces(path)
            if not found and not problems:
                yield TraceError("not-found", "no trace files (*.json, *.json.gz) in this directory", path=given)
            yield from ((p, True) for p in found)
            yield from problems
        elif exists:
            yield given, False
        elif _GLOB.search(given):  # a quoted pattern ('traces/rank*.json.gz'), as for URLs
            matches = sorted(glob.glob(given, recursive=True))
            files = [m for m in matches if os.path.isfile(m)]
            for folder in (m for m in matches if os.path.isdir(m)):  # a matched directory is searched as one
                found, problems = _walk_traces(Path(folder))
                files += found
                yield from problems
            if not files:
                yield TraceError("not-found", "no trace file matches this pattern", path=given)
            yield from ((match, True) for match in sorted(set(files)))
        else:
            yield TraceError("not-found", "no such file or directory", path=given)


def _walk_traces(root: Path) -> tuple[list[str], list[TraceError]]:
    """The trace files under root, sorted, and the folders that could not be read."""
    problems: list[TraceError] = []

    def unreadable(exc: OSError) -> None:
        problems.append(TraceError("unreadable", f"cannot read this directory ({exc.strerror or exc})",
                                   path=exc.filename or str(root)))

    found: list[str] = []
    # followlinks=False: a symlink loop cannot trap the walk.
    for folder, dirs, files in os.walk(root, followlinks=False, onerror=unreadable):
        dirs.sort()
        for name in files:
            if not name.endswith(TRACE_SUFFIXES):
                continue
            full = os.path.join(folder, name)
            try:
                mode = os.stat(full).st_mode
            except OSError:
                found.append(full)  # a dangling link or one we may not stat: open() names the problem
                continue
            if stat.S_ISREG(mode):
                found.append(full)
    return sorted(found), sorted(problems, key=lambda e: e.path or "")


STREAM_CHUNK = 1 << 20
FIFO_WAIT_S = 10.0  # how long a named FIFO may wait for its writer before it is refused


def load_bytes(path: str, max_bytes: int = DEFAULT_MAX_BYTES, salvage: bool = False) -> tuple[Buffer, bool]:
    """The file's bytes (private and mutable: a copy, or a large file mapped copy-on-write), gunzipped when they
    are gzip, refusing more than max_bytes decompressed, and whether the gzip stream was cut off (only returned,
    not refused, with salvage).

    A regular file's size is checked before it is read; a stream (stdin, a pipe, a FIFO, process
    substitution) is read to its end and refused as soon as it passes the limit. A URL is read through
    attntrace.sources with the same limit."""
    from attntrace import sources

    try:
        if path == "-":
            if sys.stdin is None:  # started with stdin closed (<&-)
                raise TraceError("unreadable", "stdin is closed")
            data = _read_stream(sys.stdin.buffer, max_bytes)
        elif sources.is_url(path):
            data = sources.read_bytes(path, max_bytes)
        else:
            with _open(path) as fh:
                info = os.fstat(fh.fileno())
                if stat.S_ISDIR(info.st_mode):
                    raise TraceError("unreadable", "is a directory")
                if stat.S_ISREG(info.st_mode):
                    # gzip a little over the limit may hold less once decompressed, never far less.
                    if info.st_size > max_bytes + (1 << 20):
                        raise TraceError("too-large", f"{info.st_size} bytes is over the limit of {max_bytes} "
                                         "bytes (--max-size)")
                    data = _mapped(fh, info.st_size) or _read_regular(fh, info.st_size)
                else:
                    data = _read_stream(fh, max_bytes)
    except IsADirectoryError as exc:
        raise TraceError("unreadable", "is a directory") from exc
    except OSError as exc:
        raise TraceError("unreadable", exc.strerror or str(exc)) from exc
    if data[:2] == b"\x1f\x8b":
        return _gunzip(data, max_bytes, salvage)
    if len(data) > max_bytes:
        raise TraceError("too-large", f"{len(data)} bytes is over the limit of {max_bytes} bytes (--max-size)")
    return data, False


def _mapped(fh: Any, size: int) -> mmap.mmap | None:
    """A large file mapped copy-on-write, or None to read it. The pages are the page cache's, so there is no
    copy to allocate and fill (0.2 s per 200 MB), and the pieces already decoded are let go (let_go): the bytes
    held stay at the pieces in hand rather than the whole file. Writes (the brackets around a piece, put back
    after) stay private to this process. A file cut shorter while it is read ends the process (SIGBUS), as in
    any tool that maps files; a trace still being written only grows, and is read up to its size here."""
    if size <= CHUNK_BYTES:  # decoded in one piece: nothing would be let go
        return None
    try:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):  # a file system that cannot map files
        return None


def let_go(data: Buffer, lo: int, hi: int) -> None:
    """Drop the resident pages of a mapped file's bytes lo..hi once decoded. The mapping holds the file's bytes
    unchanged (a piece's brackets are put back), so a page read again (an op's raw inputs, an open-ended
    event) comes back from the file the same."""
    if isinstance(data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        start = lo - lo % mmap.PAGESIZE
        with contextlib.suppress(OSError, ValueError):
            data.madvise(mmap.MADV_DONTNEED, start, max(0, min(hi, len(data)) - start))


def _read_regular(fh: Any, size: int) -> bytearray:
    data = bytearray(size)
    view, read = memoryview(data), 0
    while read < len(data):  # one read() returns at most ~2 GiB
        got = fh.readinto(view[read:])
        if not got:
            break
        read += got
    view.release()
    if read < len(data):  # the file shrank since fstat
        del data[read:]
    return data


def _open(path: str) -> Any:
    """Open for reading without blocking on a FIFO that has no writer yet: wait for one a while, then refuse."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            import select

            poller = select.poll()
            poller.register(fd, select.POLLIN | select.POLLHUP)
            if not poller.poll(int(FIFO_WAIT_S * 1000)):
                raise TraceError("unreadable", f"FIFO with no writer (waited {FIFO_WAIT_S:g} s)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def _read_stream(fh: Any, max_bytes: int) -> bytearray:
    """Read to the end, in bounded pieces. Gzip may be up to the limit compressed; it is bounded again when
    it is decompressed."""
    data = bytearray()
    while True:
        piece = fh.read(STREAM_CHUNK)
        if not piece:
            return data
        data += piece
        if len(data) == len(piece) and not _may_be_a_trace(piece):
            return data  # not JSON, gzip or UTF-16 (/dev/zero): the first piece says why, no need for the rest
        if len(data) > max_bytes + (1 << 20) or (len(data) > max_bytes and data[:2] != b"\x1f\x8b"):
            raise TraceError("too-large", f"the stream is over the limit of {max_bytes} bytes (--max-size)")


def _may_be_a_trace(head: bytes) -> bool:
    """Whether a stream's first bytes could begin a trace: gzip, a byte-order mark, or JSON's { or [ after
    whitespace (all whitespace so far counts as could)."""
    if head.startswith((b"\x1f\x8b", b"\xef\xbb\xbf", *_UTF16_BOMS, *_UTF32_BOMS)):
        return True
    first = _NON_SPACE.search(head)
    return first is None or head[first.start():first.start() + 1] in (b"{", b"[")


def _gunzip(data: Buffer, max_bytes: int, salvage: bool) -> tuple[bytearray, bool]:
    # Decompress in bounded chunks so that a gzip bomb is stopped at the limit, not after it fills memory,
    # and garbage is refused after the first chunk, not after all of it.
    out = bytearray()
    decomp = zlib.decompressobj(wbits=47)
    pending: Buffer = data
    if isinstance(data, bytearray):  # a stream's buffer, which grows: let it go for a copy of its bytes
        pending = bytes(data)
        del data[:]
    try:
        while pending:
            chunk = decomp.decompress(pending, 1 << 24)
            if not out:
                _sniff_json(chunk)
            out += chunk
            if len(out) > max_bytes:
                raise TraceError("too-large", f"gzip expands past the limit of {max_bytes} bytes (--max-size)")
            pending = decomp.unconsumed_tail
            if decomp.eof and decomp.unused_data:
                pending = decomp.unused_data
                if not pending.startswith(b"\x1f\x8b"):
                    # Zero padding (tape blocks) or other bytes after the last member: gzip -d and Python's
                    # gzip ignore them too.
                    break
                # A second gzip member follows (concatenated gzip files are valid gzip).
                decomp = zlib.decompressobj(wbits=47)
    except zlib.error as exc:
        if not (salvage and out):
            raise TraceError("bad-gzip", f"not a valid gzip stream ({exc})") from exc
        return out, True
    if not decomp.eof:
        if not salvage:
            raise TraceError("truncated", "gzip stream is cut off (--salvage analyses the complete events)")
        return out, True
    return out, False


def _sniff_json(head: bytes) -> None:
    body = head.removeprefix(b"\xef\xbb\xbf")
    first = _NON_SPACE.search(body)
    if first is not None and body[first.start():first.start() + 1] not in b"{[":
        raise TraceError("not-json", "the gzip stream does not hold JSON (it starts with "
                         f"{body[first.start():first.start() + 12]!r})")


_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
_UTF32_BOMS = (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")


def _utf16_to_utf8(data: Buffer) -> bytearray | None:
    """UTF-16 or UTF-32 text (as Windows tools write it) re-encoded as UTF-8, or None when it is not."""
    head = bytes(data[:4])
    if head.startswith(_UTF32_BOMS):
        codec = "utf-32"
    elif head.startswith(_UTF16_BOMS):
        codec = "utf-16"
    elif len(head) == 4 and head[1:2] == head[3:4] == b"\x00" and head[:1] in b"{[ \t\r\n":
        codec = "utf-16-le"
    elif len(head) == 4 and head[0:1] == head[2:3] == b"\x00" and head[1:2] in b"{[ \t\r\n":
        codec = "utf-16-be"
    else:
        return None
    try:
        return bytearray(bytes(data).decode(codec).encode("utf-8", "surrogatepass"))
    except UnicodeError as exc:
        raise TraceError("not-json", f"{codec.upper()} text that does not decode ({exc.reason} at byte "
                         f"{exc.start})") from exc


# A \uD800-\uDFFF escape: half of a surrogate pair. Alone it is not a character (polars and UTF-8 refuse it).
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _replace_lone_surrogates(data: bytearray) -> int:
    """Replace each \\uD800-\\uDFFF escape that is not half of a pair with \\uFFFD, in place (same length,
    so offsets stay); return how many. Pairs (emoji) are kept."""
    count = 0
    skip_until = -1
    for match in _SURROGATE.finditer(data):
        start = match.start()
        if start < skip_until:
            continue
        before = start
        while before > 0 and data[before - 1] == 0x5C:  # backslashes before this one
            before -= 1
        if (start - before) % 2:
            continue  # an escaped backslash followed by the text "ud800"
        high = match.group()[3:4].lower() in b"89ab"
        follower = data[start + 6:start + 12]
        if high and _SURROGATE.fullmatch(follower) and follower[3:4].lower() in b"cdef":
            skip_until = start + 12
            continue
        data[start:start + 6] = b"\\ufffd"
        count += 1
    return count


def decode(path: str, data: Buffer, salvage: bool = False, whole: bool = False) -> RawTrace:
    """Decode trace JSON into events; raise TraceError with a one-line reason when it is not a trace."""
    notes: list[str] = []
    wide = _utf16_to_utf8(data)
    if wide is not None:
        data = wide
        notes.append("read as UTF-16/UTF-32 text")
    # A backslash first (memchr, ~10 ms for 140 MB): most traces have none, and the regex costs ten times that.
    if data.find(b"\\") >= 0 and _SURROGATE.search(data):
        if not isinstance(data, bytearray):
            data = bytearray(data)
        fixed = _replace_lone_surrogates(data)
        if fixed:
            notes.append(f"{fixed} lone UTF-16 surrogate(s) in strings replaced with U+FFFD")
    raw = _decode(path, data, salvage, whole)
    if raw.chunks is None and not raw.document.traceEvents:  # (events in pieces are counted as decoded)
        if raw.dropped_events:
            raise TraceError("not-a-trace", f"none of its {raw.dropped_events} items is a trace event (an object "
                             "with a phase, \"ph\")")
        raise TraceError("empty", "no trace events (an empty event list)")
    raw.notes[:0] = notes
    raw.rewritten = raw.rewritten or bool(notes)
    return raw


def _decode(path: str, data: Buffer, salvage: bool = False, whole: bool = False) -> RawTrace:
    if data[:3] == b"\xef\xbb\xbf":
        if isinstance(data, bytearray):
            data[:3] = b"   "  # our own copy: blank the BOM out rather than copy the rest (offsets stay)
        else:
            data = data[3:]
    # Look past leading whitespace without copying the buffer (data.lstrip() would double peak memory).
    first = _NON_SPACE.search(data)
    if first is None:
        raise TraceError("empty", "file is empty")
    start = first.start()
    head = data[start:start + 1]
    try:
        if head == b"[":
            return _checked_list(RawTrace(path, len(data), Document(traceEvents=_EVENTS.decode(data))))
        if head == b"{":
            chunked = None
            if len(data) > CHUNK_BYTES and not whole:
                chunked = _chunked(path, data)
            return chunked or RawTrace(path, len(data), _DOCUMENT.decode(data))
    except msgspec.ValidationError:
        return _decode_tolerant(path, data)
    except msgspec.DecodeError as exc:
        if head == b"[" and "truncated" in str(exc):
            closed = _closed_array(path, data)
            if closed is not None:
                return closed
        if salvage and "truncated" in str(exc):
            return _salvage(path, data, start)
        offset = _error_offset(exc)
        if offset >= 0 and _NONFINITE.match(data, offset):
            return _decode_nonfinite(path, data, salvage)
        return _decode_nonstandard(path, data, exc)
    raise TraceError("not-json", f"not a JSON object or list (starts with {bytes(data[start:start + 12])!r})")


def _closed_array(path: str, data: Buffer) -> RawTrace | None:
    """The array form with no closing ']' after its last complete event, as a process that died leaves it: the
    Trace Event Format makes that ']' optional, so the trace is read as it is, with a note. None when the array
    ends inside an event (that is a cut-off file: --salvage)."""
    end = len(data)
    while end and data[end - 1:end] in (b" ", b"\t", b"\r", b"\n", b","):
        end -= 1
    if data[end - 1:end] != b"}":
        return None
    try:
        raw = _checked_list(RawTrace(path, len(data), Document(traceEvents=_EVENTS.decode(bytes(data[:end]) + b"]"))))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    raw.notes.append("the event array has no closing ']' (the Trace Event Format allows that): read as it is")
    return raw


def _checked_list(raw: RawTrace) -> RawTrace:
    """A bare JSON list is a trace only when its items are trace events (they have a "ph")."""
    events = raw.document.traceEvents
    if events and not any(e.ph for e in events):
        raise TraceError("not-a-trace", f"a JSON list of {len(events)} items, none of them a trace event "
                         "(no \"ph\" field)")
    return raw


# NaN and Infinity as Python's json writes them: a bare token after ":", "," or "[" (not inside a string).
_NONFINITE = re.compile(rb"(-?Infinity|NaN)(?=\s*[,}\]])")
_NONFINITE_TOKEN = re.compile(rb"(?<=[:,\[])(\s*)(?:-?Infinity|NaN)(?=\s*[,}\]])")
_BYTE_OFFSET = re.compile(r"\(byte (\d+)\)")


def _error_offset(exc: Exception) -> int:
    found = _BYTE_OFFSET.search(str(exc))
    return int(found.group(1)) if found else -1


def _decode_nonfinite(path: str, data: Buffer, salvage: bool) -> RawTrace:
    """Python's json writes NaN and Infinity, which JSON does not allow: read them as missing values (null)."""
    cleaned, count = _NONFINITE_TOKEN.subn(rb"\1null", data)
    if isinstance(data, bytearray):
        with contextlib.suppress(BufferError):  # views of it may still live (a piece decoded before)
            del data[:]  # our own copy: free it before decoding the cleaned one
    raw = decode(path, bytearray(cleaned), salvage)
    raw.notes.append(f"{count} NaN/Infinity values read as missing")
    return raw


CHUNK_BYTES = 16 << 20  # measured on a 218 MiB trace: 16 MiB pieces gave the lowest peak at full speed
MIN_PIECE_BYTES = 2 << 20  # smaller pieces cost more in fixed per-piece work than they spread
PIECES_PER_PROCESS = 3  # with several processes decoding: enough pieces each that none waits long for the last


def piece_bytes(size: int) -> int:
    """How large a piece of a `size`-byte trace is: CHUNK_BYTES, or less when several processes decode it, so
    that each has a few pieces."""
    processes = workers.read_processes()
    if processes <= 1:
        return CHUNK_BYTES
    return min(CHUNK_BYTES, max(MIN_PIECE_BYTES, size // (PIECES_PER_PROCESS * processes)))


_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
# Between two events: "}," then "{", with or without whitespace (Kineto indents, PyTorch's compact layout and
# most other writers do not).
_EVENT_GAP = re.compile(rb"\},\s*\{")
TAIL_ATTEMPTS = 4


@dataclass
class Pieces:
    """A large trace's event list cut where one event ends and the next begins: `spans` are data[lo:hi] ("{" to
    "}"), in file order. `source` names the file whose bytes `data` is, unchanged, when it is one (a worker
    process may then read its piece from there instead of being sent it)."""
    data: Buffer
    spans: list[tuple[int, int]]
    source: str | None = None

    def __len__(self) -> int:
        return len(self.spans)


class _PhaseOnly(msgspec.Struct, gc=False):
    ph: str


_PHASES = msgspec.json.Decoder(list[_PhaseOnly])


def _chunked(path: str, data: Buffer) -> RawTrace | None:
    """Set up a piece-by-piece decode of a large object trace, or None to decode it whole.

    The list is cut where one event ends and the next begins ("},{" with or without whitespace). Every cut is
    checked without a pass over the whole document: the fields before the list are decoded with an empty list
    in its place, the part after the last cut is decoded as a document of its own (which gives the list's end
    and the fields after it), and the piece before that last cut must be a list of events, so the cut is not
    past the list's end (in a list such as deviceProperties that follows it) nor inside a string. Any doubt
    falls back to one pass of msgspec over the whole document (tokens only) for the list's exact extent. A
    middle cut inside a string shows up as a piece that does not parse; it is then joined to the next one."""
    key = _EVENTS_KEY.search(data)
    if key is None:
        return None
    if data.find(b'"traceEvents"', key.end()) >= 0:
        # A second traceEvents key (or the name inside a string): one whole decode, where the last key wins as
        # it does for a small document, so that the answer does not depend on the size.
        return None
    begin = key.end() - 1  # the "[" of the first traceEvents key
    starts, stops = _cuts(data, begin, len(data))
    try:
        head = _OUTLINE.decode(bytes(data[:begin]) + b"[]}")
    except msgspec.MsgspecError:
        return _outlined(path, data)
    view = memoryview(data)
    for _ in range(TAIL_ATTEMPTS):
        if len(starts) < 2:
            break
        try:
            tail = _OUTLINE.decode(b'{"traceEvents":[' + view[starts[-1]:])
            _PHASES.decode(bracketed(view, starts[-2], stops[-1]))
        except msgspec.MsgspecError:
            starts.pop()
            stops.pop()
            continue
        # Each field is before the list or after it: the tail's where it has one (a repeated key's last value).
        meta = {name: getattr(head, name) if getattr(tail, name) in (None, []) else getattr(tail, name)
                for name in Metadata.__struct_fields__}
        # The tail's list is "[" + the last events + "]": the last piece ends where that "]" is in data.
        stops.append(starts[-1] + len(tail.traceEvents) - 2)
        return _in_pieces(RawTrace(path, len(data), Document(traceEvents=[], **meta)),
                          Pieces(data, list(zip(starts, stops, strict=True))))
    return _outlined(path, data)


def _cuts(data: Buffer, begin: int, end: int) -> tuple[list[int], list[int]]:
    """Where pieces of the list opened at `begin` start ("{") and where all but the last stop (after "}"),
    cutting at the first gap between two events past each piece's size, before `end`."""
    starts, stops = [begin + 1], []
    step = piece_bytes(len(data))
    pos = begin + step
    while pos < end:
        gap = _EVENT_GAP.search(data, pos, end)
        if gap is None:
            break
        stops.append(gap.start() + 1)
        starts.append(gap.end() - 1)
        pos = gap.end() + step
    return starts, stops


def _in_pieces(raw: RawTrace, pieces: Pieces) -> RawTrace:
    raw.chunks = lambda: decode_pieces(raw, pieces)
    raw.pieces = pieces
    return raw


def _outlined(path: str, data: Buffer) -> RawTrace | None:
    """The event list's exact extent from one pass of msgspec over the whole document, then cut as _chunked
    does; None to decode it whole."""
    outline = _OUTLINE.decode(data)
    key = _EVENTS_KEY.search(data)
    if key is None:
        return None
    begin = key.end() - 1  # the "[" of traceEvents
    end = begin + len(outline.traceEvents) - 1
    # The first "traceEvents" key is the document's own when its list is the one msgspec found (a memcmp).
    if data[end:end + 1] != b"]" or not _holds_at(data, memoryview(outline.traceEvents), begin):
        return None
    meta = Document(traceEvents=[], **{name: getattr(outline, name) for name in Metadata.__struct_fields__})
    del outline
    starts, stops = _cuts(data, begin, end)
    stops.append(end)
    return _in_pieces(RawTrace(path, len(data), meta), Pieces(data, list(zip(starts, stops, strict=True))))


def _holds_at(data: Buffer, part: memoryview, at: int) -> bool:
    """Whether data has `part` at offset `at` (a memcmp: mmap has no startswith, and its find is one)."""
    if isinstance(data, mmap.mmap):
        return data.find(part, at, at + len(part)) == at
    return data.startswith(part, at)


def decode_pieces(raw: RawTrace, pieces: Pieces) -> Iterator[list[TraceEvent]]:
    """The events of each piece in turn; a piece that does not parse (cut inside an event) is joined to the
    next."""
    raw.chunks = raw.pieces = None  # read once: the file's buffer goes with the last piece, not with the trace
    data, spans = pieces.data, pieces.spans
    i = 0
    while i < len(spans):
        lo, hi = spans[i]
        j = i
        while True:
            try:
                events = decode_span(raw, data, lo, hi)
                break
            except msgspec.DecodeError:
                # A cut inside an event: join the next piece (the cuts around it were checked).
                if j + 1 >= len(spans):
                    raise Undecodable(pieces) from None
                j += 1
                hi = spans[j][1]
        yield events
        del events
        let_go(data, spans[i][0], hi)
        i = j + 1


class Undecodable(Exception):
    """A trace in pieces whose pieces do not parse even joined: the whole document must be decoded again the
    careful way (redecode), which finds NaN, numbers out of range or the offset of the JSON error."""

    def __init__(self, pieces: Pieces) -> None:
        super().__init__("pieces that do not parse")
        self.pieces = pieces


def redecode(raw: RawTrace, pieces: Pieces) -> RawTrace:
    """The trace decoded again from its bytes as one document, keeping the notes made before it was cut. (Its
    tail parsed, so it is not cut off: nothing to salvage.)"""
    again = decode(raw.path, pieces.data, whole=True)
    again.notes[:0] = [n for n in raw.notes if n not in again.notes and not n.endswith("malformed events ignored")]
    again.incomplete = again.incomplete or raw.incomplete
    return again


def decode_span(raw: RawTrace, data: Buffer, lo: int, hi: int) -> list[TraceEvent]:
    """The events in data[lo:hi] ("{" to "}"). In our own buffer the bytes either side are turned into "[" and
    "]" for the call and put back after, rather than copying the piece."""
    if not isinstance(data, (bytearray, mmap.mmap)) or lo < 1 or hi >= len(data):
        return decode_piece(raw, bracketed(memoryview(data), lo, hi))
    before, after = data[lo - 1], data[hi]
    data[lo - 1], data[hi] = 0x5B, 0x5D
    try:
        return decode_piece(raw, memoryview(data)[lo - 1:hi + 1])
    finally:
        data[lo - 1], data[hi] = before, after


def bracketed(view: memoryview, lo: int, hi: int) -> bytearray:
    """ "[" + the events in view[lo:hi] + "]": a copy of one piece, so that the file's buffer stays as it is."""
    piece = bytearray(hi - lo + 2)
    piece[0] = 0x5B
    piece[1:-1] = view[lo:hi]
    piece[-1] = 0x5D
    return piece


def decode_piece(raw: RawTrace, piece: bytes | bytearray | memoryview) -> list[TraceEvent]:
    """One piece's events; malformed ones are dropped and counted on `raw`. DecodeError when it is not JSON."""
    try:
        return _EVENTS.decode(piece)
    except msgspec.ValidationError:
        items = _ANY.decode(piece)
        kept = [e for e in map(_coerce_event, items) if e is not None]
        raw.count_dropped(len(items) - len(kept))
        return kept


def _decode_tolerant(path: str, data: Buffer) -> RawTrace:
    try:
        document = _ANY.decode(data)
    except msgspec.DecodeError as exc:
        if "out of range" in str(exc):
            return _decode_out_of_range(path, data)
        offset = _error_offset(exc)
        if offset >= 0 and _NONFINITE.match(data, offset):  # as _decode does: Python's json writes them
            return _decode_nonfinite(path, data, False)
        raise TraceError("not-json", _json_problem(exc)) from exc
    return _from_builtins(path, len(data), document)


# A number too large for a float, by its exponent (1e999) or its digits (over 308 of them, which msgspec also
# refuses past Python's 4300-digit integers): JSON allows it.
_HUGE_NUMBER = re.compile(rb"(?<=[:,\[])(\s*)(-?\d+(?:\.\d+)?[eE]\+?\d{3,}|-?\d{309,}(?:\.\d+)?)(?=\s*[,}\]])")


def _decode_out_of_range(path: str, data: Buffer) -> RawTrace:
    """Read numbers beyond a float's range as missing values (null) and count them."""
    count = 0

    def missing(match: re.Match[bytes]) -> bytes:
        nonlocal count
        if math.isfinite(float(match.group(2))):
            return match.group(0)
        count += 1
        return match.group(1) + b"null"

    cleaned = _HUGE_NUMBER.sub(missing, data)
    if not count:
        raise TraceError("not-json", "a number is out of range (beyond a 64-bit float)")
    try:
        document = _ANY.decode(cleaned)
    except msgspec.DecodeError as exc:
        raise TraceError("not-json", _json_problem(exc)) from exc
    raw = _from_builtins(path, len(data), document)
    raw.notes.append(f"{count} number(s) beyond a 64-bit float read as missing")
    return raw


NONSTANDARD_MAX_BYTES = 256 << 20  # the standard library's json needs several times the file in memory


def _decode_nonstandard(path: str, data: Buffer, exc: msgspec.DecodeError) -> RawTrace:
    """Python's json accepts NaN and Infinity, which some writers emit; anything else is refused. A cut-off
    file or a very large one is refused at once with msgspec's reason."""
    if "truncated" in str(exc) or len(data) > NONSTANDARD_MAX_BYTES:
        raise TraceError("not-json", _json_problem(exc)) from exc
    try:
        document = json.loads(data if isinstance(data, (bytes, bytearray)) else bytes(data))
    except (ValueError, RecursionError):
        raise TraceError("not-json", _json_problem(exc)) from exc
    return _from_builtins(path, len(data), document)


def _json_problem(exc: Exception) -> str:
    text = str(exc)
    if "truncated" in text:
        return f"JSON is cut off ({text}); --salvage analyses the complete events"
    return f"not valid JSON ({text})"


def _from_builtins(path: str, size: int, document: Any) -> RawTrace:
    if isinstance(document, list):
        events, meta = document, {}
    elif isinstance(document, dict):
        if "traceEvents" not in document:
            raise TraceError("not-a-trace", _what_is_it(document))
        events, meta = document["traceEvents"], document
    else:
        raise TraceError("not-a-trace", f"JSON {type(document).__name__} is not a trace")
    if not isinstance(events, list):
        raise TraceError("not-a-trace", f"traceEvents is a {type(events).__name__}, not a list")
    kept: list[TraceEvent] = []
    dropped = 0
    for item in events:
        event = _coerce_event(item)
        if event is None:
            dropped += 1
        else:
            kept.append(event)
    meta = {k: v for k, v in meta.items() if k != "traceEvents"}
    try:
        doc = msgspec.convert({**meta, "traceEvents": []}, Document, strict=False)
    except msgspec.ValidationError:
        doc = Document(traceEvents=[])
    doc.traceEvents = kept
    notes = [f"{dropped} malformed events ignored"] if dropped else []
    raw = RawTrace(path, size, doc, dropped, notes)
    return _checked_list(raw) if isinstance(document, list) else raw


_RAW_FIELDS = {"Input Dims": "input_dims", "Input type": "input_types", "Concrete Inputs": "concrete_inputs"}


def _coerce_event(item: Any) -> TraceEvent | None:
    """An event from decoded JSON, or None when it is not an object or a field the model reads will not
    convert. An unknown or missing phase gives an event that no table takes, as any unread phase does."""
    if not isinstance(item, dict):
        return None
    phase = item.get("ph")
    kind = READ_PHASES.get(phase) if isinstance(phase, str) else None
    if kind is None:
        skipped = SKIPPED_PHASES.get(phase) if isinstance(phase, str) else None
        return skipped() if skipped is not None else Unphased()
    try:
        event = msgspec.convert({k: v for k, v in item.items() if k not in ("args", "ph")}, kind, strict=False)
    except msgspec.ValidationError:
        return None
    if isinstance(item.get("args"), dict):
        event.args = _coerce_args(item["args"])
    for name in ("ts", "dur"):
        value = getattr(event, name)
        if value is not None and not math.isfinite(value):
            setattr(event, name, None)
    return event


def _coerce_args(args: dict[str, Any]) -> Args:
    """Keep each field that converts; drop the ones that don't, rather than the whole event."""
    fields: dict[str, Any] = {}
    for key, value in args.items():
        if key in _RAW_FIELDS:
            continue
        try:
            msgspec.convert({key: value}, Args, strict=False)
        except msgspec.ValidationError:
            continue
        fields[key] = value
    out = msgspec.convert(fields, Args, strict=False)
    for key, attr in _RAW_FIELDS.items():
        if key in args:
            setattr(out, attr, msgspec.Raw(msgspec.json.encode(args[key])))
    return out


def _what_is_it(document: dict[str, Any]) -> str:
    keys = set(document)
    if {"nodes", "schema"} & keys or ("pid" in keys and "nodes" in keys):
        return "PyTorch execution trace (ET), not a Kineto profiler trace; it has no traceEvents"
    if "segments" in keys or "device_traces" in keys:
        return "memory snapshot, not a Kineto profiler trace; it has no traceEvents"
    shown = ", ".join(sorted(keys)[:5]) or "none"
    return f"JSON object without traceEvents (keys: {shown})"


DECODE_FACTOR = 2.5  # memory for events and tables, beyond the bytes themselves, per byte of trace (measured
# peaks run 2.5-4.5x the trace, bytes included)
ADDRESS_SPACE_FACTOR = 8.0  # address space the analysis maps per byte of trace (measured: 1.0 GB for 137 MB),
# which is what a ulimit -v counts: thread arenas and reservations, not only memory touched


def available_memory() -> int | None:
    """Bytes that can still be allocated: the least of the system's MemAvailable and the cgroup's headroom;
    None when neither can be read."""
    limits: list[int] = []
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            if limit != "max" and int(limit) < 2**60:
                limits.append(int(limit) - int(Path(usage_file).read_text().strip()))
                break
        except (OSError, ValueError):
            continue
    return max(0, min(limits)) if limits else None


def _address_space_left() -> int | None:
    """What RLIMIT_AS (ulimit -v) leaves this process, or None without such a limit."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmSize:"):
                    return max(0, soft - int(line.split()[1]) * 1024)
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return None


def check_memory(size: int) -> None:
    """Refuse, in one line, a trace that cannot be decoded in the memory left to this job: running out inside
    polars or msgspec aborts the process instead of raising MemoryError."""
    available = available_memory()
    gib = 2**30
    if available is not None:
        share = available // max(1, workers.CONCURRENT_JOBS)
        needed = int(size * DECODE_FACTOR)
        if needed > share:
            jobs = workers.CONCURRENT_JOBS
            each = f" for each of {jobs} jobs" if jobs > 1 else ""
            raise TraceError("too-large", f"needs about {needed / gib:.1f} GiB of memory to analyse and "
                             f"{share / gib:.1f} GiB is available{each}; free memory, use --jobs 1 or split "
                             "the trace")
    own = _address_space_left()  # a ulimit -v binds each process alone, not the jobs together
    if own is not None and size * ADDRESS_SPACE_FACTOR > own:
        raise TraceError("too-large", f"needs about {size * ADDRESS_SPACE_FACTOR / gib:.1f} GiB of address space "
                         f"to analyse and the limit (ulimit -v) leaves {own / gib:.1f} GiB; raise it or split "
                         "the trace")


def _is_file_of(path: str, data: Buffer) -> bool:
    """Whether `data` is the local file's bytes as they are (not gunzipped, not a stream or URL)."""
    from attntrace import sources

    if path == "-" or sources.is_url(path):
        return False
    try:
        info = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size == len(data) and data[:2] != b"\x1f\x8b"


def read(path: str, options: ReadOptions = ReadOptions()) -> RawTrace:
    data, cut = load_bytes(path, options.max_bytes, options.salvage)
    check_memory(len(data))
    if not cut:
        raw = decode(path, data, options.salvage)
        if raw.pieces is not None and raw.pieces.data is data and not raw.rewritten and _is_file_of(path, data):
            raw.pieces.source = path
        let_go(data, 0, len(data))  # what the checks over the whole file read in: pieces are read again as decoded
        return raw
    try:
        raw = decode(path, data, salvage=False)
    except TraceError:
        return _salvage(path, data, _NON_SPACE.search(data).start() if _NON_SPACE.search(data) else 0)
    raw.incomplete = True
    raw.notes.append("incomplete trace: the gzip stream was cut off")
    return raw


SALVAGE_ATTEMPTS = 64


def _salvage(path: str, data: bytes, start: int) -> RawTrace:
    """Keep the events that are complete in a cut-off file: close the event list after the last event that
    ends before the cut, and decode that. The report then says the trace is incomplete."""
    head = data[start:start + 1]
    if head == b"{":
        key = data.find(b'"traceEvents"', start)
        opening = data.find(b"[", key) if key >= 0 else -1
        closing = b"]}"
    else:
        opening, closing = start, b"]"
    if opening < 0:
        raise TraceError("truncated", "JSON is cut off before any event")
    cut = len(data)
    for _ in range(SALVAGE_ATTEMPTS):
        cut = data.rfind(b"}", opening, cut)
        if cut < 0:
            break
        try:
            raw = decode(path, data[:cut + 1] + closing)
        except TraceError:
            continue
        raw.incomplete = True
        _note_salvaged(raw, len(data))
        return raw
    raise TraceError("truncated", "JSON is cut off and no complete event could be recovered")


def _note_salvaged(raw: RawTrace, size: int) -> None:
    """Say how many events were kept; a large trace decoded piece by piece knows only once it is read."""
    def note(events: int) -> str:
        return (f"incomplete trace: the file is cut off at byte {size}; {events} complete events before the cut "
                "were analysed")

    if raw.chunks is None:
        raw.notes.append(note(len(raw.document.traceEvents)))
        return
    pieces = raw.chunks

    def counted() -> Iterator[list[TraceEvent]]:
        events = 0
        for piece in pieces():
            events += len(piece)
            yield piece
        raw.notes.append(note(events))

    raw.chunks = counted
    raw.pieces = None  # decoded here, counted, rather than handed to other processes


def decode_raw(raw: msgspec.Raw) -> Any:
    """Decode a field kept raw (shapes, types), or None when it is absent or malformed."""
    if not raw:
        return None
    try:
        return _ANY.decode(raw)
    except msgspec.DecodeError:
        return None

