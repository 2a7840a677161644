"""Ctrl-C in the first half second of a run: the handler must not import anything. A Ctrl-C while
`import multiprocessing` ran found it half initialised in sys.modules, and the handler's own `from multiprocessing
import forkserver` raised ImportError: a traceback and exit 1 (2 of 30 tries at random times in the first 0.5 s
of `lint`), instead of a quiet 130."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

# The state the handler met: `multiprocessing` registered, its body not yet run (no forkserver, no
# active_children), as while its import runs. The Ctrl-C comes then.
HALF_IMPORTED = """
import os, signal, sys, types
from attntrace.__main__ import _interrupted
signal.signal(signal.SIGINT, _interrupted)
sys.modules["multiprocessing"] = types.ModuleType("multiprocessing")
os.kill(os.getpid(), signal.SIGINT)
signal.pause()
"""


def test_ctrl_c_while_multiprocessing_is_half_imported_exits_130_quietly():
    done = subprocess.run([sys.executable, "-c", HALF_IMPORTED], capture_output=True, cwd=ROOT, timeout=60,
                          check=False)
    assert done.returncode == 130, done.stderr.decode(errors="replace")
    assert done.stderr == b""
