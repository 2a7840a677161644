"""An unreadable trace's error, on a terminal where stdout and stderr are one screen: the text report says it,
and the stderr line said it again. Once there; in a pipe stderr keeps its line (a CI log, `2>errors.txt`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, sample

MESSAGE = "JSON is cut off"


def _on_a_terminal(args: list[str]) -> str:
    """What a user sees: stdout and stderr on one pseudo-terminal."""
    controller, terminal = os.openpty()
    process = subprocess.Popen([sys.executable, "-m", "attntrace", *args], stdout=terminal, stderr=terminal,
                               stdin=subprocess.DEVNULL, cwd=ROOT, env={**os.environ, "TERM": "xterm"})
    os.close(terminal)
    seen = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        seen += chunk
    os.close(controller)
    process.wait(timeout=120)
    return seen.decode(errors="replace")


def test_an_error_is_shown_once_on_a_terminal(tmp_path: Path):
    broken = tmp_path / "broken.json"
    broken.write_bytes(b'{"traceEvents": [')
    seen = _on_a_terminal(["lint", str(broken), sample("bf16_causal_fwd/sdpa")])
    assert seen.count(MESSAGE) == 1, seen
    piped = subprocess.run([sys.executable, "-m", "attntrace", "lint", str(broken)], capture_output=True,
                           text=True, cwd=ROOT, check=False)
    assert MESSAGE in piped.stderr and MESSAGE in piped.stdout


def test_a_diff_error_is_shown_once_on_a_terminal(tmp_path: Path):
    broken = tmp_path / "broken.json"
    broken.write_bytes(b'{"traceEvents": [')
    seen = _on_a_terminal(["diff", str(broken), sample("bf16_causal_fwd/sdpa")])
    assert seen.count(MESSAGE) == 1, seen
