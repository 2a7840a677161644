"""Whether a process still runs, for clean-ups of what a killed run left (its temporary outputs, its
multiprocessing folder), which only the process that made them may remove while it runs."""

from __future__ import annotations

import os


def running(pid: int) -> bool:
    """Whether a process of this number runs (another user's counts: it cannot be signalled, but it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):  # no process has such a number
        return False
    return True
