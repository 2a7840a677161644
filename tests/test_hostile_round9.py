"""Hostile inputs, round 9 (issue 43, reliability): files truncated while read, workers that outlive a killed
parent, temporary files left by SIGINT/SIGTERM, diff on too few steady steps, and files that are something else
than a trace (bz2, zstd, xz, zip, tar, procfs, a URL without its extra). Each test failed before its fix."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, sample


def _naive_doc() -> dict:
    return json.loads(gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes()))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _running(pid: int) -> bool:
    """Whether the process is there and not a zombie (an orphan's zombie may wait for a reaper that never comes)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_workers_die_with_a_killed_parent(tmp_path: Path):
    # The workers, the fork server and the resource tracker ran on for minutes after SIGKILL of their parent.
    doc = _naive_doc()
    text = json.dumps({**doc, "traceEvents": doc["traceEvents"] * 40})  # seconds of work each
    paths = [tmp_path / f"rank{i}.json" for i in range(2)]
    for path in paths:
        path.write_text(text)
    proc = subprocess.Popen([sys.executable, "-m", "attntrace", "lint", "--jobs", "2", *map(str, paths)],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        children: list[int] = []
        while time.monotonic() < deadline and proc.poll() is None:
            children = _descendants(proc.pid)
            if len(children) >= 4:  # the resource tracker, the fork server and two workers
                break
            time.sleep(0.02)
        assert len(children) >= 4 and proc.poll() is None, "the workers never started, or the run ended first"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(map(_running, children)):
            time.sleep(0.1)
        assert not [pid for pid in children if _running(pid)]
    finally:
        proc.kill()
        for pid in _descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)


# Run as the console script does, with the replace of each output's finished temporary file preceded by a signal:
# the process is stopped while the temporary file is there.
_SIGNAL_BEFORE_REPLACE = """
import os, signal, sys, time
real_replace = os.replace
def replace_after_a_signal(src, dst):
    if str(src).endswith(".tmp"):
        os.kill(os.getpid(), getattr(signal, os.environ["SIGNAL"]))
        time.sleep(30)
    return real_replace(src, dst)
os.replace = replace_after_a_signal
sys.argv = ["attntrace", *sys.argv[1:]]
from attntrace.__main__ import entry
entry()
"""


@pytest.mark.parametrize(("signame", "option"), [("SIGTERM", ["-o", "OUT/report.json", "--format", "json"]),
                                                 ("SIGTERM", ["-o", "OUT/report.parquet", "--format", "parquet"]),
                                                 ("SIGTERM", ["--annotate", "OUT/annotated.json"]),
                                                 ("SIGINT", ["--annotate", "OUT/annotated.json"]),
                                                 ("SIGINT", ["--write-baseline", "OUT/baseline.json"])])
def test_a_signal_removes_the_temporary_file_of_every_output(tmp_path: Path, signame: str, option: list[str]):
    # The handler ended with os._exit, which skipped output.replacing()'s clean-up: a .tmp file stayed beside the
    # output (32 MiB for an --annotate).
    pytest.importorskip("polars")
    out = tmp_path / "out"
    out.mkdir()
    args = [arg.replace("OUT", str(out)) for arg in option]
    done = subprocess.run([sys.executable, "-c", _SIGNAL_BEFORE_REPLACE, "lint", sample("bf16_causal_fwd/naive"),
                           "--jobs", "1", *args], env={**_env(), "SIGNAL": signame}, capture_output=True,
                          timeout=60)
    assert done.returncode == 128 + getattr(signal, signame), done.stderr
    assert sorted(os.listdir(out)) == []


# Each file named ...cut.json is cut to nothing as soon as its bytes are had, as a trace rewritten while it is read
# is, in every process (a sitecustomize: the --jobs workers start from a fresh interpreter too). Pieces are 64 KiB,
# so that the reader of before mapped the file (it mapped files over one piece).
_CUT_AFTER_LOAD = """
import os
import attntrace.read as read
import attntrace.read.buffers as buffers
buffers.CHUNK_BYTES = 1 << 16
loaded = read.load_bytes
def load_then_cut(path, *args, **kwargs):
    data = loaded(path, *args, **kwargs)
    if path.endswith("cut.json"):
        os.truncate(path, 0)
    return data
read.load_bytes = load_then_cut
"""


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_file_cut_short_while_read_is_not_the_end_of_the_run(tmp_path: Path, jobs: str):
    # The file was mapped: cut shorter while read, it ended the process with SIGBUS (rc 135, no message), every
    # other input of the run lost (with --jobs 2, the worker died, and the file was said to have killed it).
    doc = _naive_doc()
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps({**doc, "traceEvents": doc["traceEvents"] * 4}))  # 330 KB: several pieces
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(doc))
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_CUT_AFTER_LOAD)
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", "--jobs", jobs, "--format", "json",
                           "--fail-on", "never", str(cut), str(whole)],
                          env={**_env(), "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}"}, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # The bytes read are the run's own copy: the file is analysed as it was read, and the other file too.
    assert [t["path"] for t in report["traces"]] == [str(cut), str(whole)]
    assert cut.stat().st_size == 0
