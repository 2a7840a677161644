"""Inputs only this process holds (a /dev/fd descriptor, stdin) beside files, with worker processes about."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
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


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to see the run's processes")
def test_sigterm_takes_the_workers_with_it(tmp_path: Path) -> None:
    # kill (or a CI job's timeout) stops the run with 143, and no worker, fork server or tracker stays behind.
    import json
    import signal
    import time

    events = json.loads(gzip.decompress(Path(sample("workloads/gpt2_eager_train")).read_bytes()))["traceEvents"]
    big = tmp_path / "big.json"
    with big.open("w") as fh:  # ~40 MB: long enough to be killed while its pieces are decoded
        fh.write('{"traceEvents": [')
        fh.write(",".join([json.dumps(e) for e in events] * max(1, 40_000_000 // len(json.dumps(events)))))
        fh.write("]}")
    semaphores = _semaphores()
    run = subprocess.Popen([sys.executable, "-m", "attntrace", "lint", str(big), str(big), "--jobs", "2"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 30
    while not _others_in_group(run.pid) and time.monotonic() < deadline:  # the fork server or a worker started
        time.sleep(0.05)
    time.sleep(0.5)
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(run.pid, 0)  # anything left in the run's process group?
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("processes of the run outlived it")
    assert run.stderr.read() == b""
    # The pool's, unlinked by the resource tracker after the run. Waited for: a test beside this one (pytest -n)
    # may hold a pool's for a moment too, while a leaked one stays.
    deadline = time.monotonic() + 20
    while not _semaphores() <= semaphores and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _semaphores() <= semaphores


def _semaphores() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("sem.mp-*")} if shm.is_dir() else set()


def _others_in_group(group: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != group:
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group:  # pgrp
                return True
    return False
