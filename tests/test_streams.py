"""Inputs only this process holds (a /dev/fd descriptor, stdin) beside files, with worker processes about."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
from pathlib import Path

from conftest import sample


def test_a_descriptor_beside_a_file_is_read_here_not_by_a_worker() -> None:
    # `attntrace lint <(zcat t.json.gz) other.json.gz`: workers cannot open this process's /dev/fd/N.
    read_end, write_end = os.pipe()
    data = gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes())
    writer = threading.Thread(target=lambda: (os.write(write_end, data), os.close(write_end)))
    writer.start()
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", f"/dev/fd/{read_end}",
                           sample("bf16_causal_fwd/sdpa"), "--jobs", "2", "--format", "json"],
                          pass_fds=(read_end,), capture_output=True, text=True, timeout=300)
    os.close(read_end)
    writer.join(timeout=60)
    assert done.returncode == 1, done.stderr  # the naive trace's warnings, read from the pipe
    assert "unreadable" not in done.stderr and done.stderr == ""


def test_a_closed_stdin_is_one_line_and_the_other_input_is_analysed() -> None:
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", "-", sample("bf16_causal_fwd/naive")],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: os.close(0))
    assert done.returncode == 2 and done.stderr.strip() == "error: -: stdin is closed"
    assert "AT101" in done.stdout
