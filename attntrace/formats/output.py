"""Writing what the user asked for (--output, --write-baseline, --annotate) without harming what is there."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from attntrace.liveness import abandoned, hold

FIFO_WAIT_S = 10.0  # how long an output FIFO may wait for its reader, as an input FIFO waits for its writer


class WouldOverwriteInput(OSError):
    """The output is one of the command's inputs: never written over."""


# The temporary files being written now (replacing): a SIGINT, SIGTERM or SIGHUP handler that ends the process at once
# (attntrace.__main__) removes them first, as the clean-up below would have.
_unfinished: set[str] = set()


# A temporary file is named ".NAME.attntrace.XXXXXXXX.tmp" and its writer holds it (liveness.hold) while it writes.
# A run killed with SIGKILL (every process of its group: `timeout -s KILL`, the OOM killer) can remove nothing; the
# next run that writes to the same folder removes what no one holds (_left_by_the_dead).
TMP_TAG = "attntrace"
LEFT_BEHIND = re.compile(r"^\..*\.attntrace\.[a-z0-9_]{8}\.tmp$", re.DOTALL)
# Untouched for a minute too: between its creation and its lock, and between its last write and its rename, a file
# is not held.
STALE_AFTER_S = 60.0
_swept: set[str] = set()  # folders this process has cleaned already: once each, not once per file


def _left_by_the_dead(folder: str) -> None:
    """Remove the temporary files that writers which no longer run left in `folder` (see TMP_TAG)."""
    if folder in _swept:
        return
    _swept.add(folder)
    try:
        names = os.listdir(folder or ".")
    except OSError:
        return
    now = time.time()
    for name in names:
        if not LEFT_BEHIND.match(name):
            continue
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            if now - os.lstat(path).st_mtime > STALE_AFTER_S and abandoned(path):
                os.unlink(path)


# Outputs that other processes of this run write (--annotate's copies, written by the workers): a worker stopped
# mid-write by an interrupted run removes nothing (a Dask worker has no handler of ours), so the run's own handler
# removes what they left once they have ended (remove_left_by_workers).
_expected: set[str] = set()


def expect(targets: Iterable[str]) -> None:
    """Note outputs that this run's workers write, for remove_left_by_workers."""
    _expected.update(os.path.realpath(target) for target in targets)


def _tmp_prefix(real: str) -> str:
    """The start of the name of `real`'s temporary file, in its folder. It holds at most 100 bytes of the target's
    name: a name near the 255-byte limit is valid, the same name with a prefix and suffix around it is not."""
    stem = os.fsencode(os.path.basename(real))[:100].decode(errors="ignore")
    return f".{stem}.{TMP_TAG}."


def remove_left_by_workers() -> None:
    """Remove the temporary files beside the `expect`ed outputs that no process holds any more: those of the
    workers an interrupted run has stopped. For the handler of SIGINT and SIGTERM, once the workers are gone."""
    prefixes: dict[str, set[str]] = {}
    for target in _expected:
        prefixes.setdefault(os.path.dirname(target), set()).add(_tmp_prefix(target))
    for folder, starts in prefixes.items():
        try:
            names = os.listdir(folder or ".")
        except OSError:
            continue
        for name in names:
            if LEFT_BEHIND.match(name) and name.startswith(tuple(starts)):
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    if abandoned(path):
                        os.unlink(path)


def remove_unfinished() -> None:
    """Remove every temporary file still being written; safe to call from a signal handler (unlink only)."""
    for tmp in list(_unfinished):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _unfinished.discard(tmp)


def _created(folder: str, prefix: str) -> tuple[int, str]:
    """A new temporary file, listed as unfinished before a signal can act: SIGINT, SIGTERM and SIGHUP are held
    back from its creation to its listing (a signal between the two left the .tmp file beside the output)."""
    held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    can_hold = hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held) if can_hold else None
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".tmp")
        _unfinished.add(tmp)
        hold(fd)  # while it is written: the next run's clean-up leaves it alone
    finally:
        if before is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
    return fd, tmp


@contextlib.contextmanager
def replacing(target: str, inputs: Iterable[str] = ()) -> Iterator[BinaryIO]:
    """A file to write `target`'s new content to. A regular file (or a new one) is written beside it and renamed
    over it once complete: a write that fails half way (disk full, ulimit -f) leaves the old file whole, and
    two runs never interleave in one file. A symlink is written through (the link stays, its file changes); a
    device, FIFO or terminal (/dev/null, /dev/stdout) is written to, never replaced. Raises
    WouldOverwriteInput when the target is one of `inputs`."""
    try:
        existing: os.stat_result | None = os.stat(target)  # through symlinks
    except FileNotFoundError:
        existing = None
    if existing is not None and stat.S_ISFIFO(existing.st_mode):
        with os.fdopen(_fifo_with_a_reader(target), "wb") as fh:
            yield fh
        return
    if existing is not None and not stat.S_ISREG(existing.st_mode) and not stat.S_ISDIR(existing.st_mode):
        with open(target, "wb") as fh:  # /dev/stdout resolves to no path of its own: opened as named
            yield fh
        return
    real = os.path.realpath(target)
    if existing is not None and any(_same(path, real) for path in inputs):
        raise WouldOverwriteInput("it is one of the inputs: not overwritten")
    _left_by_the_dead(os.path.dirname(real))
    fd, tmp = _created(os.path.dirname(real), _tmp_prefix(real))
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
        if existing is not None:
            os.chmod(tmp, existing.st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        _unfinished.discard(tmp)


def _fifo_with_a_reader(target: str) -> int:
    """A FIFO opened for writing once a reader has it open: waited for a while, as a FIFO given as input waits for
    its writer, then refused. A plain open waits for ever: `-o fifo` with no reader hung, with no word."""
    deadline = time.monotonic() + FIFO_WAIT_S
    while True:
        try:
            fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            if time.monotonic() >= deadline:
                raise OSError(errno.ENXIO, f"FIFO with no reader (waited {FIFO_WAIT_S:g} s)") from None
            time.sleep(0.05)
            continue
        os.set_blocking(fd, True)
        return fd


def write_bytes(target: str, data: bytes, inputs: Iterable[str] = ()) -> None:
    with replacing(target, inputs) as fh:
        fh.write(data)


def _same(path: str, real: str) -> bool:
    try:
        if path == "-":  # stdin redirected from a file (-o /dev/stdin < trace.json)
            held, there = os.fstat(0), os.stat(real)
            return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)
        return os.path.samefile(path, real)
    except (OSError, ValueError):  # a URL, a closed stdin, a path gone since
        return False
