"""Getting a trace's bytes: regular files (read, not mapped: see load_bytes), stdin,
pipes and FIFOs (bounded reads, a FIFO without a writer refused after a wait), URLs through attntrace.read.sources,
the size limit (--max-size), and the memory guard that refuses a trace the memory left cannot analyse."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from attntrace.read import workers
from attntrace.read.encodings import GZIP_MAGIC, gunzip, may_be_a_trace, other_format, wide_codec
from attntrace.read.errors import NUL_IN_PATH, TraceError
from attntrace.read.raw import DEFAULT_MAX_BYTES, Buffer, FileIdentity

STREAM_CHUNK = 1 << 20


HEAD_BYTES = 4096  # what a regular file's first read sniffs: JSON, gzip, another format, or nothing attntrace reads
FIFO_WAIT_S = 10.0  # how long a named FIFO may wait for its writer before it is refused


def load_bytes(path: str, max_bytes: int = DEFAULT_MAX_BYTES, salvage: bool = False
               ) -> tuple[Buffer, bool, FileIdentity | None]:
    """The file's bytes (private and mutable: a copy), gunzipped when they
    are gzip, refusing more than max_bytes decompressed, whether the gzip stream was cut off (only returned,
    not refused, with salvage), and the regular file they were read from as it was then (None for a stream or a
    URL): what reads the file again later (--annotate's copy) checks that it is still that file.

    A regular file's size is checked before it is read; a stream (stdin, a pipe, a FIFO, process
    substitution) is read to its end and refused as soon as it passes the limit. A URL is read through
    attntrace.read.sources with the same limit."""
    from attntrace.read import sources

    identity = None
    try:
        if path == "-":
            if sys.stdin is None:  # started with stdin closed (<&-)
                raise TraceError("unreadable", "stdin is closed")
            data = _read_stream(sys.stdin.buffer, max_bytes)
        elif sources.is_url(path):
            data = sources.read_bytes(path, max_bytes, may_be_a_trace)
        elif "\0" in path:
            raise TraceError("unreadable", NUL_IN_PATH)
        else:
            fh, first = _open(path)
            with fh:
                info = os.fstat(fh.fileno())
                if stat.S_ISDIR(info.st_mode):
                    raise TraceError("unreadable", "is a directory")
                if stat.S_ISREG(info.st_mode) and info.st_size == 0:
                    # Size 0 is no promise of no content: procfs and sysfs files (/proc/cpuinfo) say 0 and
                    # have text to read. Read as a stream: to its end, bounded, sniffed.
                    data = _read_stream(fh, max_bytes, first)
                elif stat.S_ISREG(info.st_mode):
                    # gzip a little over the limit may hold less once decompressed, never far less.
                    if info.st_size > max_bytes + (1 << 20):
                        raise TraceError("too-large", f"{info.st_size} bytes is over the limit of {max_bytes} "
                                         "bytes (--max-size)")
                    # Read, never mapped: a mapped file cut shorter while it is read (a trace being rewritten, a
                    # quota, a network file system) ended the whole process with SIGBUS, every other input lost
                    # and no word said (Python cannot make SIGBUS an exception). Read, a file cut short is that
                    # file's error, and no later change reaches the copy. Against mapping, on a 61 MB trace: the
                    # same peak (the copy goes before the pieces' tables are joined, the peak).
                    head = os.pread(fh.fileno(), HEAD_BYTES, 0)
                    if may_be_a_trace(head) or wide_codec(head[:4]) is not None:
                        data = _read_regular(fh, info.st_size)
                        _unchanged_since(info, os.fstat(fh.fileno()))
                        identity = _identity(path, info)
                    else:  # what it is, or that it is no JSON, shows in its first bytes: the rest is not read
                        data = bytearray(head)  # (a 4 GiB file of zeros took 20 s and 4.25 GB to be refused)
                else:
                    data = _read_stream(fh, max_bytes, first)
    except IsADirectoryError as exc:
        raise TraceError("unreadable", "is a directory") from exc
    except OSError as exc:
        raise TraceError("unreadable", _what_it_is(path) or exc.strerror or str(exc)) from exc
    name = "FILE" if path == "-" or sources.is_url(path) else path  # what an extracting command names
    other = other_format(bytes(data[:512]), name)
    if other is not None:
        raise other
    if data[:2] == GZIP_MAGIC or data == GZIP_MAGIC[:1]:  # one byte of gzip's magic: a gzip stream cut at once
        return (*gunzip(data, max_bytes, salvage, name), identity)
    if len(data) > max_bytes:
        raise TraceError("too-large", f"{len(data)} bytes is over the limit of {max_bytes} bytes (--max-size)")
    return data, False, identity


def _what_it_is(path: str) -> str | None:
    """What a path that could not be opened as a file is, where that says more than the error: a socket's open
    fails with ENXIO, "No such device or address", which names neither."""
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(os.stat(path).st_mode):
            return "a socket, not a file (a trace is a file, a pipe, or '-' for stdin)"
    return None


SIDE_FILE_MAX_BYTES = 256 << 20  # a settings, baseline or results file: far more than any of them holds


def read_small_file(path: str | Path) -> bytes:
    """A file the user gives beside the traces (--config, --baseline, --measured): a regular file, or a pipe or FIFO
    (process substitution), read whole up to SIDE_FILE_MAX_BYTES, a UTF-8 byte order mark left out. What cannot
    be one (a directory, /dev/zero, a FIFO with no writer, anything larger) raises OSError with a one-line
    reason, as a missing file does."""
    try:
        fh, first = _open(str(path))
    except TraceError as exc:
        raise OSError(errno.ENXIO, exc.message) from None
    with fh:
        info = os.fstat(fh.fileno())
        if stat.S_ISDIR(info.st_mode):
            raise OSError(errno.EISDIR, "is a directory")
        if _is_devnull(info):  # the usual way to say "empty": a config of no settings, an empty baseline file
            return b""
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
            raise OSError(errno.EINVAL, "not a file or a pipe")
        try:
            # Without a UTF-8 byte order mark, which editors on Windows write and JSON and TOML parsers refuse (a
            # trace with one is read).
            return bytes(_read_stream(fh, SIDE_FILE_MAX_BYTES, first, sniff=False)).removeprefix(b"\xef\xbb\xbf")
        except TraceError:  # too large
            raise OSError(errno.EFBIG, f"larger than {SIDE_FILE_MAX_BYTES >> 20} MiB") from None


def _is_devnull(info: os.stat_result) -> bool:
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(info.st_mode) and (info.st_rdev, info.st_dev, info.st_ino) == (null.st_rdev, null.st_dev,
                                                                                       null.st_ino)


def let_go(data: Buffer, lo: int, hi: int) -> None:
    """Drop the resident pages of a mapped file's bytes lo..hi once decoded. The mapping holds the file's bytes
    unchanged (a piece's brackets are put back), so a page read again (an op's raw inputs, an open-ended
    event) comes back from the file the same."""
    if isinstance(data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        start = lo - lo % mmap.PAGESIZE
        with contextlib.suppress(OSError, ValueError):
            data.madvise(mmap.MADV_DONTNEED, start, max(0, min(hi, len(data)) - start))


_SPACE = re.compile(rb"\s*")


def read_span(source: FileIdentity, lo: int, hi: int) -> bytearray | None:
    """ "[" + the file's bytes lo..hi + "]", or None when the file is not the one read (renamed over, rewritten,
    cut) or holds no run of events there: a piece of a large trace, read where it is rather than held in a copy
    of the whole file."""
    piece = bytearray(hi - lo + 2)
    try:
        with open(source.path, "rb", buffering=0) as fh:
            if _identity(source.path, os.fstat(fh.fileno())) != source:
                return None
            fh.seek(lo)
            with memoryview(piece) as view:
                got = fh.readinto(view[1:-1])
    except OSError:
        return None
    # A run of events: "{" first (after the layout's whitespace: the first piece starts after the list's "["),
    # "}" last; or nothing but whitespace (an empty list).
    first = _SPACE.match(piece, 1).end()  # type: ignore[union-attr]  # \s* always matches
    if got != hi - lo or (first < len(piece) - 1 and (piece[first] != 0x7B or piece[-2:-1].strip() not in (b"}", b""))):
        return None
    piece[0], piece[-1] = 0x5B, 0x5D
    return piece


def reread(source: FileIdentity) -> bytearray:
    """The whole file again, for a trace decoded from its file piece by piece that must now be decoded whole;
    TraceError when it is no longer the file that was read."""
    try:
        with open(source.path, "rb", buffering=0) as fh:
            if _identity(source.path, os.fstat(fh.fileno())) != source:
                raise TraceError("unreadable", "the file changed while it was read")
            data = _read_regular(fh, source.size)
            if _identity(source.path, os.fstat(fh.fileno())) != source:
                raise TraceError("unreadable", "the file changed while it was read")
    except OSError as exc:
        raise TraceError("unreadable", exc.strerror or str(exc)) from exc
    if len(data) != source.size:
        raise TraceError("unreadable", "the file changed while it was read")
    return data


def unchanged(source: FileIdentity, info: os.stat_result) -> bool:
    """Whether an open file (its fstat) is `source` as it was read."""
    return stat.S_ISREG(info.st_mode) and _identity(source.path, info) == source


def _identity(path: str, info: os.stat_result) -> FileIdentity:
    return FileIdentity(path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _unchanged_since(before: os.stat_result, after: os.stat_result) -> None:
    """A file written while it was read (a profiler still exporting, a trace rewritten in place) gives bytes of
    both versions: that file's error, not a report of a file that never was. Its size or modification time tells
    (on file systems whose times are finer than the write's interval; a change of the same size within one tick
    passes)."""
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise TraceError("unreadable", "the file changed while it was read")


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


def _open(path: str) -> tuple[Any, bytes]:
    """Open for reading without blocking on a FIFO that has no writer yet: wait for one a while, then refuse.
    A writer that is connected but has not written yet is waited for, as a pipe on stdin is. Telling the two
    apart takes a read, so the bytes it may have read come back beside the file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        first = b""
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            import select

            poller = select.poll()
            poller.register(fd, select.POLLIN | select.POLLHUP)
            if not poller.poll(int(FIFO_WAIT_S * 1000)):
                # Without a writer, Linux reports no event and a read finds the end; with a silent one, a
                # non-blocking read finds nothing to read yet (EAGAIN), and the blocking reads then wait for it.
                with contextlib.suppress(BlockingIOError):
                    first = os.read(fd, 1)
                    if not first:
                        raise TraceError("unreadable", f"FIFO with no writer (waited {FIFO_WAIT_S:g} s)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0), first
    except BaseException:
        os.close(fd)
        raise


def _read_stream(fh: Any, max_bytes: int, first: bytes = b"", sniff: bool = True) -> bytearray:
    """Read to the end, in bounded pieces, after `first` (bytes already read from it). Gzip may be up to the limit
    compressed; it is bounded again when it is decompressed. With `sniff`, a stream whose first piece cannot start
    a trace stops there (a settings file is not sniffed: TOML starts with anything)."""
    data = bytearray(first)
    first_piece = sniff
    while True:
        piece = fh.read(STREAM_CHUNK)
        if not piece:
            return data
        data += piece
        if first_piece and not may_be_a_trace(bytes(data)):
            return data  # not JSON, gzip or UTF-16 (/dev/zero): the first piece says why, no need for the rest
        first_piece = False
        if len(data) > max_bytes + (1 << 20) or (len(data) > max_bytes and data[:2] != b"\x1f\x8b"):
            raise TraceError("too-large", f"the stream is over the limit of {max_bytes} bytes (--max-size)")


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


def file_identity(path: str, data: Buffer) -> FileIdentity | None:
    """The local file `data` was read from, when it still holds those bytes as they are (not gunzipped, not a
    stream or URL, the same length); None otherwise."""
    from attntrace.read import sources

    if path == "-" or sources.is_url(path):
        return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size != len(data) or data[:2] == b"\x1f\x8b":
        return None
    return _identity(path, info)
