"""Whether what a run made is still in use, for the clean-up of what a killed run left (its temporary outputs, its
multiprocessing folder). The run holds an exclusive flock on each such file while it uses it; the kernel lets go
when the last process holding it ends, however it ends (SIGKILL too), and the lock is seen from another PID
namespace or host sharing the folder, where a process id means nothing. A clean-up removes only what it can lock.
Where flock is missing (Windows), nothing is held and nothing is taken for abandoned."""

from __future__ import annotations

import contextlib
import os
import shutil

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]


def hold(fd: int) -> None:
    """Mark an open file in use for as long as `fd` (or a process that inherits it) stays open."""
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def abandoned(path: str) -> bool:
    """Whether no process holds the file at `path` (hold); False where that cannot be told (no flock, a link, a
    file that cannot be opened)."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its run goes on
        return False
    finally:
        os.close(fd)
    return True


# The file inside a folder a run made (its multiprocessing folder, a local cluster's scratch folder) that the run
# holds while it lives: a folder whose owner file no one holds was left by a killed run.
FOLDER_OWNER = "attntrace-owner"


def hold_folder(folder: str) -> int:
    """Create and hold `folder`'s owner file; returns its descriptor, held while it stays open. Raises OSError."""
    fd = os.open(os.path.join(folder, FOLDER_OWNER), os.O_RDONLY | os.O_CREAT, 0o600)
    hold(fd)
    return fd


def remove_abandoned_siblings(folder: str, prefix: str) -> None:
    """Remove the folders beside `folder` named prefix* whose owner file no one holds (never a link, never one
    without an owner file: a folder a run is still making, or one that is not attntrace's)."""
    try:
        entries = [e for e in os.scandir(os.path.dirname(folder)) if e.name.startswith(prefix) and e.path != folder]
    except OSError:
        return
    for entry in entries:
        if not entry.is_symlink() and entry.is_dir(follow_symlinks=False) and abandoned(
                os.path.join(entry.path, FOLDER_OWNER)):
            shutil.rmtree(entry.path, ignore_errors=True)
