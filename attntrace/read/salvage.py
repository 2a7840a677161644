"""Salvage of a cut-off file (--salvage): the document closed after each of its last complete events in turn,
for the decoder to try, and the note that says how many events were kept."""

from __future__ import annotations

from collections.abc import Iterator

from attntrace.read.errors import TraceError
from attntrace.read.events import TraceEvent
from attntrace.read.raw import Buffer, RawTrace

SALVAGE_ATTEMPTS = 64


def closed_candidates(data: Buffer, start: int) -> Iterator[bytes]:
    """The cut-off document closed after each of its last SALVAGE_ATTEMPTS "}" in turn, last first: the event
    list ends there and the document with it. The decoder takes the first that reads as a trace."""
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
            return
        yield data[:cut + 1] + closing


def note_salvaged(raw: RawTrace, size: int) -> None:
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
