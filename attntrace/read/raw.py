"""What reading a trace gives: its bytes' type, the decoded trace (RawTrace), a large trace's pieces, and the
options and limits a read works under. Every other module of the read layer builds or fills these."""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from attntrace.read.events import Document, TraceEvent

# A trace's bytes: read into memory, or a large file mapped copy-on-write (see buffers._mapped).
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


UNPHASED_NOTE = 'events without a phase ("ph") the Trace Event Format knows ignored'
DROPPED_NOTE = "malformed events ignored"


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
    unphased_events: int = 0  # events without a phase the Trace Event Format knows, left out
    seen_events: int = 0  # items of the event list decoded in pieces (a document in one piece holds its own)
    # Tables already in columns (an Nsight Systems export, read/nsys.py): ops, launches, gpu, flows,
    # gpu_annotations, python (polars frames of the columns model/tables.py takes from events) and op_args.
    frames: dict[str, Any] | None = field(default=None, repr=False)
    profiler: str = "torch.profiler"  # the tool that recorded it: "nsys" for an Nsight Systems export
    file: FileIdentity | None = None  # the regular file read, as it was then (buffers.load_bytes)

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
            self._counted_notes()

    def count_unphased(self, unphased: int) -> None:
        if unphased:
            self.unphased_events += unphased
            self._counted_notes()

    def _counted_notes(self) -> None:
        """The counts' notes last, in one order (malformed, then without a phase), however the pieces held them:
        a document gives the same report decoded whole or in pieces."""
        self.notes[:] = [n for n in self.notes if not n.endswith((DROPPED_NOTE, UNPHASED_NOTE))]
        if self.dropped_events:
            self.notes.append(f"{self.dropped_events} {DROPPED_NOTE}")
        if self.unphased_events:
            self.notes.append(f"{self.unphased_events} {UNPHASED_NOTE}")

    def count_piece(self, seen: int, dropped: int, unphased: int) -> None:
        """One piece's items: all of them, the malformed ones and those without a phase."""
        self.seen_events += seen
        self.count_dropped(dropped)
        self.count_unphased(unphased)

    def counts(self) -> tuple[int, int, int, list[str]]:
        return self.seen_events, self.dropped_events, self.unphased_events, list(self.notes)

    def restore(self, counts: tuple[int, int, int, list[str]]) -> None:
        self.seen_events, self.dropped_events, self.unphased_events, self.notes[:] = counts

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


CHUNK_BYTES = 16 << 20  # measured on a 218 MiB trace: 16 MiB pieces gave the lowest peak at full speed


class FileIdentity(NamedTuple):
    """A local file as it was when read: a piece read from it later is from the same file, unchanged, only if
    all of these still hold (a file renamed over it has another inode; one rewritten in place, another mtime)."""
    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int


@dataclass
class Pieces:
    """A large trace's event list cut where one event ends and the next begins: `spans` are data[lo:hi] ("{" to
    "}"), in file order. `source` is the file whose bytes `data` is, unchanged, when it is one: this process and
    the workers then read each piece from there, and `data` is let go."""
    data: Buffer
    spans: list[tuple[int, int]]
    source: FileIdentity | None = None

    def __len__(self) -> int:
        return len(self.spans)
