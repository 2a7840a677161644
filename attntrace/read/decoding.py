"""Decoding JSON text into typed events, fast, decoding only the fields the model uses.

The fast path decodes the whole document with msgspec into structs in one call; a large Kineto document is cut
into pieces between events and decoded piece by piece (in other processes when several decode it). A trace
whose events break the expected types (a string duration, a string External id) is decoded again event by
event, coercing what can be coerced and counting what cannot, so one odd event does not lose the trace. NaN,
Infinity and numbers beyond a float are read as missing, with a note."""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import re
from collections.abc import Iterator
from typing import Any

import msgspec

from attntrace.read import salvage, workers
from attntrace.read.buffers import let_go, read_span, reread
from attntrace.read.encodings import (
    NON_SPACE,
    RAW_SURROGATE,
    SURROGATE,
    replace_lone_surrogates,
    replace_raw_surrogates,
    utf16_to_utf8,
)
from attntrace.read.errors import TraceError
from attntrace.read.events import (
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
from attntrace.read.raw import CHUNK_BYTES, DROPPED_NOTE, UNPHASED_NOTE, Buffer, Pieces, RawTrace

_EVENTS = msgspec.json.Decoder(list[AnyEvent])


_DOCUMENT = msgspec.json.Decoder(Document)


_OUTLINE = msgspec.json.Decoder(Outline)


_ANY = msgspec.json.Decoder()


def decode(path: str, data: Buffer, salvage: bool = False, whole: bool = False) -> RawTrace:
    """Decode trace JSON into events; raise TraceError with a one-line reason when it is not a trace."""
    notes: list[str] = []
    wide = utf16_to_utf8(data)
    if wide is not None:
        data = wide
        notes.append("read as UTF-16/UTF-32 text")
    # A backslash first (memchr, ~10 ms for 140 MB): most traces have none, and the regex costs ten times that.
    if data.find(b"\\") >= 0 and SURROGATE.search(data):
        if not isinstance(data, bytearray):
            data = bytearray(data)
        fixed = replace_lone_surrogates(data)
        if fixed:
            notes.append(f"{fixed} lone UTF-16 surrogate(s) in strings replaced with U+FFFD")
    # Likewise a byte 0xED first: it leads only Hangul syllables and (invalid) surrogates.
    if data.find(b"\xed") >= 0 and RAW_SURROGATE.search(data):
        if not isinstance(data, bytearray):
            data = bytearray(data)
        fixed = replace_raw_surrogates(data)
        notes.append(f"{fixed} UTF-16 surrogate(s) written as UTF-8 bytes replaced with U+FFFD")
    raw = _decode(path, data, salvage, whole)
    if raw.chunks is None and not raw.document.traceEvents:  # (events in pieces are checked as decoded)
        raise TraceError(*empty_problem(raw.dropped_events))
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
    first = NON_SPACE.search(data)
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
        if head == b"[" and _cut_off(exc, data):
            closed = _closed_array(path, data)
            if closed is not None:
                return closed
        if salvage and _cut_off(exc, data):
            return salvaged(path, data, start)
        offset = _error_offset(exc)
        if offset >= 0 and _NONFINITE.match(data, offset):
            return _decode_nonfinite(path, data, salvage)
        return _decode_nonstandard(path, data, exc)
    raise TraceError("not-json", f"not a JSON object or list (starts with {bytes(data[start:start + 12])!r})")


def json_type(value: object) -> str:
    """A value's type as JSON names it (not Python's: "traceEvents is a NoneType" said nothing to a user)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "an object"
    return "a list" if isinstance(value, list) else type(value).__name__


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


def _cut_off(exc: Exception, data: Buffer) -> bool:
    """Whether the JSON error is the end of the data: msgspec says "truncated", except inside a number, where it
    says "invalid number" at the last byte (a file cut after `"dur": 11.` was "not valid JSON", and --salvage
    refused it)."""
    if "truncated" in str(exc):
        return True
    offset = _error_offset(exc)
    return offset >= 0 and len(data) - offset <= 64 and not bytes(data[offset:]).strip(b" \t\r\n0123456789.eE+-")


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
        if data.find(b'"traceEvents"', starts[-1]) >= 0:
            # A second traceEvents key (or the name inside a string): one whole decode, where the last key wins
            # as it does for a small document, so that the answer does not depend on the size. The piece before
            # the last cut is events, so the list goes on past it: a second key of the document is after it.
            # (Searched there only: the whole file took 0.1 s of a 185 MB trace's read.)
            return None
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
    next. A file's pieces are read from the file one at a time (Pieces.source), and the copy of the whole file
    goes first: held until the last piece was decoded, it was the peak of a large trace's analysis."""
    raw.chunks = raw.pieces = None  # read once: the file's buffer goes with the last piece, not with the trace
    if pieces.source:
        pieces.data = b""
    spans = pieces.spans
    i = 0
    while i < len(spans):
        lo, hi = spans[i]
        j = i
        while True:
            try:
                events = piece_events(raw, pieces, lo, hi)
                break
            except msgspec.DecodeError:
                # A cut inside an event: join the next piece (the cuts around it were checked).
                if j + 1 >= len(spans):
                    raise Undecodable(pieces) from None
                j += 1
                hi = spans[j][1]
        yield events
        del events
        let_go(pieces.data, spans[i][0], hi)
        i = j + 1


def piece_events(raw: RawTrace, pieces: Pieces, lo: int, hi: int) -> list[TraceEvent]:
    """The events of the pieces' bytes lo..hi: from the buffer when it is held, else read from the file. Where
    the file holds no run of events there (it changed, or its list holds other things than events), the whole
    file is read again (TraceError when it changed: it is no longer as long) and decoded from memory on."""
    if not pieces.data and pieces.source is not None:
        piece = read_span(pieces.source, lo, hi)
        if piece is not None:
            return decode_piece(raw, piece)
        pieces.data, pieces.source = reread(pieces.source), None
    return decode_span(raw, pieces.data, lo, hi)


class Undecodable(Exception):
    """A trace in pieces whose pieces do not parse even joined: the whole document must be decoded again the
    careful way (redecode), which finds NaN, numbers out of range or the offset of the JSON error."""

    def __init__(self, pieces: Pieces) -> None:
        super().__init__("pieces that do not parse")
        self.pieces = pieces


def redecode(raw: RawTrace, pieces: Pieces) -> RawTrace:
    """The trace decoded again from its bytes as one document, keeping the notes made before it was cut. (Its
    tail parsed, so it is not cut off: nothing to salvage.)"""
    data = pieces.data or (reread(pieces.source) if pieces.source else b"")  # its pieces were read from the file
    again = decode(raw.path, data, whole=True)
    # The first attempt's counts are made again by this one: only its other notes carry over.
    again.notes[:0] = [n for n in raw.notes if n not in again.notes and not n.endswith((DROPPED_NOTE, UNPHASED_NOTE))]
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
    """One piece's events; malformed ones and those without a phase are left out and counted on `raw`, as
    a document decoded whole counts them. DecodeError when it is not JSON."""
    try:
        events = _EVENTS.decode(piece)
        raw.count_piece(len(events), 0, 0)
        return events
    except msgspec.ValidationError:
        items = _ANY.decode(piece)
        coerced = [e for e in map(_coerce_event, items) if e is not None]
        kept = [e for e in coerced if not isinstance(e, Unphased)]
        raw.count_piece(len(items), len(items) - len(coerced), len(coerced) - len(kept))
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
        raise TraceError("not-json", _json_problem(exc, data)) from exc
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
    if isinstance(data, bytearray):
        with contextlib.suppress(BufferError):  # views of it may still live (a piece decoded before)
            del data[:]  # our own copy: free it before decoding the cleaned one
    # Decoded as any trace is (typed, in pieces), not into Python objects: one 1e999 in a 276 MB trace took 2.2 GB
    # and 33 s that way, against 0.6 GB and 4 s.
    raw = decode(path, bytearray(cleaned))
    raw.notes.append(f"{count} number(s) beyond a 64-bit float read as missing")
    return raw


NONSTANDARD_MAX_BYTES = 256 << 20  # the standard library's json needs several times the file in memory


def _decode_nonstandard(path: str, data: Buffer, exc: msgspec.DecodeError) -> RawTrace:
    """Python's json accepts NaN and Infinity, which some writers emit; anything else is refused. A cut-off
    file or a very large one is refused at once with msgspec's reason."""
    if _cut_off(exc, data) or len(data) > NONSTANDARD_MAX_BYTES:
        raise TraceError("not-json", _json_problem(exc, data)) from exc
    try:
        document = json.loads(data if isinstance(data, (bytes, bytearray)) else bytes(data))
    except (ValueError, RecursionError):
        raise TraceError("not-json", _json_problem(exc, data)) from exc
    return _from_builtins(path, len(data), document)


def _json_problem(exc: Exception, data: Buffer) -> str:
    text = str(exc)
    if _cut_off(exc, data):
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
        # A document that names its events is a trace that cannot be read, not other JSON beside the traces (a
        # directory scan passes over that one without a word).
        raise TraceError("bad-trace", f"traceEvents is {json_type(events)}, not a list")
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
    if dropped and not kept and isinstance(document, dict):
        # The document names its events and none can be read: a broken trace, not other JSON beside the traces.
        raise TraceError("bad-trace", empty_problem(dropped)[1])
    unphased = sum(isinstance(event, Unphased) for event in kept)
    if unphased and unphased == len(kept) and isinstance(document, dict):
        raise TraceError("bad-trace", no_phase_problem(unphased))
    raw = RawTrace(path, size, doc)
    if isinstance(document, list):
        _checked_list(raw)
    # Counted as pieces count them (their notes in one order); a bare list's events without a phase too.
    raw.count_dropped(dropped)
    raw.count_unphased(unphased)
    return raw


def no_phase_problem(unphased: int) -> str:
    return f"none of its {unphased} events has a phase (\"ph\") the Trace Event Format knows"


def empty_problem(dropped: int) -> tuple[str, str]:
    """(kind, reason) for an event list that holds no trace event: `dropped` items, none of them an event."""
    if dropped:
        return "not-a-trace", (f"none of its {dropped} items is a trace event (an object with a phase, \"ph\", "
                               "and fields of the format's types: numbers for ts and dur)")
    return "empty", "no trace events (an empty event list)"


_RAW_FIELDS = {"Input Dims": "input_dims", "Input type": "input_types", "Concrete Inputs": "concrete_inputs",
               "Input Strides": "input_strides"}


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


def decode_raw(raw: msgspec.Raw) -> Any:
    """Decode a field kept raw (shapes, types), or None when it is absent or malformed."""
    if not raw:
        return None
    try:
        return _ANY.decode(raw)
    except msgspec.DecodeError:
        return None


def salvaged(path: str, data: Buffer, start: int | None = None) -> RawTrace:
    """The complete events of a cut-off file (--salvage), marked incomplete with a note; `start` is the offset
    of the document's first byte (found when not given)."""
    if start is None:
        first = NON_SPACE.search(data)
        start = first.start() if first else 0
    for closed in salvage.closed_candidates(data, start):
        try:
            raw = decode(path, closed)
        except TraceError:
            continue
        raw.incomplete = True
        salvage.note_salvaged(raw, len(data))
        return raw
    raise TraceError("truncated", "JSON is cut off and no complete event could be recovered")
