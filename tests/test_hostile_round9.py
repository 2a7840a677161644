"""Hostile inputs, round 9 (issue 43, reliability): files truncated while read, workers that outlive a killed
parent, temporary files left by SIGINT/SIGTERM, diff on too few steady steps, and files that are something else
than a trace (bz2, zstd, xz, zip, tar, procfs, a URL without its extra). Each test failed before its fix."""

from __future__ import annotations

import ast
import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, as_a_shell_starts_it, sample

from attntrace.cores import ONE_THREAD_CORES, polars_threads


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


# A parent that starts the fork server, asks it for a worker, and is gone while the server still imports polars
# (as one killed then is).
_GONE_WHILE_THE_SERVER_STARTS = """
import multiprocessing.forkserver as forkserver, os, threading, time
from attntrace.read import workers
workers.warm_up()
print(forkserver._forkserver._forkserver_pid, flush=True)
threading.Timer(0.05, os._exit, (0,)).start()
workers.SharingPool(1, 1).submit(time.sleep, 60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_the_fork_server_ends_when_its_parent_went_while_it_started():
    # Killed while the server still imported polars (before it could ask to die with its parent), the parent left
    # the server, a worker and the resource tracker running for good, holding the parent's stdout open: a CI step
    # that waited for the output hung.
    pytest.importorskip("polars")
    done = subprocess.run([sys.executable, "-c", _GONE_WHILE_THE_SERVER_STARTS], env=_env(), capture_output=True,
                          text=True, timeout=60)
    server = int(done.stdout.split()[0])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _running(server):
            time.sleep(0.1)
        assert not _running(server)
    finally:
        with contextlib.suppress(OSError):
            os.kill(server, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_ctrl_c_while_a_worker_starts_stops_the_run(tmp_path: Path):
    # SIGINT was ignored while a pool started a worker, and that start waits for the fork server's imports (up to a
    # second on a busy machine): a Ctrl-C then was lost, and the run went on to its end. Here the server takes 3 s
    # to start (a sitecustomize in its environment), and the Ctrl-C comes while the run waits for its worker.
    pytest.importorskip("polars")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get('ATTNTRACE_SERVER_SPAWNER'):\n    time.sleep(3)\n")
    proc = subprocess.Popen([sys.executable, "-m", "attntrace", "lint", sample("bf16_causal_fwd/naive"),
                             sample("bf16_causal_fwd/sdpa_flash"), "--jobs", "2", "--format", "json"],
                            env={**_env(), "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=as_a_shell_starts_it)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_descendants(proc.pid)) < 2:  # the tracker and the server
            time.sleep(0.02)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        assert b"Traceback" not in proc.stderr.read()
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)


# A parent whose fork server is up and has forked a worker, killed by SIGKILL: nothing of it runs at its end.
_KILLED_WITH_A_SERVER = """
import os, signal
from attntrace.read import workers
workers.warm_up()
workers.SharingPool(1, 1).submit(abs, 1).result()
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_parent_leaves_no_folder_of_its_workers():
    # multiprocessing's folder of the parent (/tmp/pymp-*, the fork server's socket) is removed by the parent's own
    # exit: a SIGKILL left one behind at every kill.
    pytest.importorskip("polars")
    import tempfile

    temp = Path(tempfile.mkdtemp(prefix="at", dir="/tmp"))  # short: the socket's path must fit 108 bytes
    try:
        done = subprocess.run([sys.executable, "-c", _KILLED_WITH_A_SERVER], env={**_env(), "TMPDIR": str(temp)},
                              capture_output=True, timeout=60)
        assert done.returncode == -signal.SIGKILL, done.stderr
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and os.listdir(temp):
            time.sleep(0.1)
        assert os.listdir(temp) == []
    finally:
        subprocess.run(["rm", "-rf", str(temp)], check=False)


# In the fork server alone (its environment names its parent), every fork fails as under `ulimit -u`.
_SERVER_CANNOT_FORK = """
import os
if os.environ.get("ATTNTRACE_SERVER_SPAWNER"):
    def fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")
    os.fork = fork
"""


def test_a_fork_server_that_cannot_fork_leaves_the_traces_to_the_main_process(tmp_path: Path):
    # The fork server died with a traceback when a process limit refused its fork, and the run ended with
    # "Aborted!" (its socket's EOF) or "error: stdout: Connection refused": no trace reported.
    pytest.importorskip("polars")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SERVER_CANNOT_FORK)
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", sample("bf16_causal_fwd/naive"),
                           sample("bf16_causal_fwd/sdpa_flash"), "--jobs", "2", "--format", "json", "--fail-on",
                           "never"], env={**_env(), "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}"}, capture_output=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert [t["error"] for t in json.loads(done.stdout)["traces"]] == [None, None]
    assert b"Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 1, done.stderr


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
                                                 ("SIGINT", ["--write-baseline", "OUT/baseline.json"]),
                                                 # a closed terminal or SSH session: ended by the default action
                                                 ("SIGHUP", ["-o", "OUT/report.json", "--format", "json"])])
def test_a_signal_removes_the_temporary_file_of_every_output(tmp_path: Path, signame: str, option: list[str]):
    # The handler ended with os._exit, which skipped output.replacing()'s clean-up: a .tmp file stayed beside the
    # output (32 MiB for an --annotate).
    pytest.importorskip("polars")
    out = tmp_path / "out"
    out.mkdir()
    args = [arg.replace("OUT", str(out)) for arg in option]
    done = subprocess.run([sys.executable, "-c", _SIGNAL_BEFORE_REPLACE, "lint", sample("bf16_causal_fwd/naive"),
                           "--jobs", "1", *args], env={**_env(), "SIGNAL": signame}, capture_output=True,
                          timeout=60, preexec_fn=as_a_shell_starts_it)
    assert done.returncode == 128 + getattr(signal, signame), done.stderr
    assert sorted(os.listdir(out)) == []


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_leaves_no_directory_of_the_workers_behind(tmp_path: Path, signame: str):
    # multiprocessing's directory for the fork server's socket (/tmp/pymp-*) is removed by a finaliser that the
    # handler's os._exit skipped: every interrupted run with workers left one.
    pytest.importorskip("polars")
    import tempfile

    # A short one of its own: the fork server's socket path must fit AF_UNIX's 108 bytes.
    temp = Path(tempfile.mkdtemp(prefix="at", dir="/tmp"))
    try:
        done = subprocess.run([sys.executable, "-c", _SIGNAL_BEFORE_REPLACE, "lint", sample("bf16_causal_fwd/naive"),
                               sample("bf16_causal_fwd/sdpa_flash"), "--jobs", "2", "-o", str(tmp_path / "r.json")],
                              env={**_env(), "SIGNAL": signame, "TMPDIR": str(temp)}, capture_output=True, timeout=60,
                              preexec_fn=as_a_shell_starts_it)
        assert done.returncode == 128 + getattr(signal, signame), done.stderr
        assert sorted(os.listdir(temp)) == []
        assert sorted(os.listdir(tmp_path)) == []
    finally:
        subprocess.run(["rm", "-rf", str(temp)], check=False)


def test_a_temporary_folder_too_long_for_the_workers_socket_lints_in_this_process(tmp_path: Path):
    # The fork server's socket lives in TMPDIR, and AF_UNIX paths end at 108 bytes: `--jobs 2` failed with
    # "error: stdout: AF_UNIX path too long" and exit 2, no trace analysed.
    pytest.importorskip("polars")
    temp = tmp_path / ("t" * 60) / ("u" * 60)
    temp.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", sample("bf16_causal_fwd/naive"),
                           sample("bf16_causal_fwd/sdpa_flash"), "--jobs", "2", "--format", "json",
                           "--fail-on", "never"], env={**_env(), "TMPDIR": str(temp)}, capture_output=True, timeout=120)
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    assert [t["error"] for t in json.loads(done.stdout)["traces"]] == [None, None]


# In every process (the --jobs workers too): a worker about to put an annotated copy in place interrupts the run
# (Ctrl-C to the process group: the parent answers it and stops its workers), and waits to be stopped.
_INTERRUPT_BEFORE_REPLACE = """
import os, signal, time
real_replace = os.replace
def replace_after_ctrl_c(src, dst):
    if str(src).endswith(".tmp") and os.getpgrp() != os.getpid():
        os.killpg(os.getpgrp(), getattr(signal, os.environ["SIGNAL"]))
        time.sleep(30)
    return real_replace(src, dst)
os.replace = replace_after_ctrl_c
"""


@pytest.mark.parametrize("signame", ["SIGINT", "SIGHUP"])  # SIGHUP: the terminal or SSH session closed
def test_a_worker_stopped_while_it_writes_leaves_no_temporary_file(tmp_path: Path, signame: str):
    # The workers write --annotate's copies; stopped by the parent (SIGTERM), they died by the default action and
    # their .tmp files stayed beside the outputs.
    pytest.importorskip("polars")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_INTERRUPT_BEFORE_REPLACE)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", sample("bf16_causal_fwd/naive"),
                           sample("bf16_causal_fwd/sdpa_flash"), "--jobs", "2", "--annotate", str(out)],
                          env={**_env(), "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}", "SIGNAL": signame},
                          capture_output=True, timeout=60, start_new_session=True, preexec_fn=as_a_shell_starts_it)
    assert done.returncode == 128 + getattr(signal, signame), done.stderr
    time.sleep(0.5)  # the workers' handlers run as they are stopped
    assert [name for name in os.listdir(out) if name.endswith(".tmp")] == []


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


def _lint_with_hook(tmp_path: Path, hook_code: str, jobs: str) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """`lint --jobs JOBS cut.json whole.json` with `hook_code` run in every process (a sitecustomize); cut.json
    is 330 KB, several pieces."""
    doc = _naive_doc()
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps({**doc, "traceEvents": doc["traceEvents"] * 4}))
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(doc))
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(hook_code)
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", "--jobs", jobs, "--format", "json",
                           "--fail-on", "never", str(cut), str(whole)],
                          env={**_env(), "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}"}, capture_output=True, timeout=120)
    return cut, whole, done


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_file_cut_short_while_read_is_not_the_end_of_the_run(tmp_path: Path, jobs: str):
    # The file was mapped: cut shorter while read, it ended the process with SIGBUS (rc 135, no message), every
    # other input of the run lost (with --jobs 2, the worker died, and the file was said to have killed it).
    cut, whole, done = _lint_with_hook(tmp_path, _CUT_AFTER_LOAD, jobs)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # The bytes read are the run's own copy: the file is analysed as it was read, and the other file too.
    assert [t["path"] for t in report["traces"]] == [str(cut), str(whole)]
    assert cut.stat().st_size == 0


# The file rewritten in place, its size kept, while its bytes are read (a second later, as a slow read would see it).
_REWRITE_WHILE_READ = """
import os
import attntrace.read.buffers as buffers
read_regular = buffers._read_regular
def read_then_rewrite(fh, size):
    data = read_regular(fh, size)
    path = os.readlink(f"/proc/self/fd/{fh.fileno()}")
    if path.endswith("cut.json"):
        with open(path, "r+b") as out:
            out.write(b" " * 8)
        later = os.stat(path).st_mtime_ns + 1_000_000_000
        os.utime(path, ns=(later, later))
    return data
buffers._read_regular = read_then_rewrite
"""


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_file_rewritten_in_place_while_read_is_that_files_error(tmp_path: Path, jobs: str):
    # Only the size was compared, after the read: bytes of two versions of the file were reported as one trace.
    cut, whole, done = _lint_with_hook(tmp_path, _REWRITE_WHILE_READ, jobs)
    assert done.returncode == 2, done.stderr
    assert done.stderr.decode().strip().splitlines() == [f"error: {cut}: the file changed while it was read"]
    traces = json.loads(done.stdout)["traces"]
    assert [(t["path"], bool(t["error"])) for t in traces] == [(str(cut), True), (str(whole), False)]


# Small pieces (a large trace's are 2-16 MiB), and the file cut in half once read, before its pieces are decoded.
_CUT_BEFORE_DECODE = """
import os
import attntrace.model as model
import attntrace.model.tables as tables
import attntrace.read.decoding as decoding
decoding.CHUNK_BYTES = 1 << 16
decoding.MIN_PIECE_BYTES = 1 << 14
split = tables.split_trace
def cut_then_split(raw):
    if raw.path.endswith("cut.json"):
        os.truncate(raw.path, os.path.getsize(raw.path) // 2)
    return split(raw)
tables.split_trace = model.split_trace = cut_then_split
"""


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_file_cut_while_its_pieces_are_decoded_is_that_files_error(tmp_path: Path, jobs: str):
    """A large trace's pieces are read from its file as they are decoded, not from a copy of all of it held to
    the end (that copy made the peak 2.2x the file): a file cut meanwhile is that file's one-line error, and the
    other inputs are reported."""
    cut, whole, done = _lint_with_hook(tmp_path, _CUT_BEFORE_DECODE, jobs)
    assert done.returncode == 2, done.stderr
    assert done.stderr.decode().strip().splitlines() == [f"error: {cut}: the file changed while it was read"]
    traces = json.loads(done.stdout)["traces"]
    assert [(t["path"], bool(t["error"])) for t in traces] == [(str(cut), True), (str(whole), False)]


def test_the_pieces_of_a_file_are_read_from_it_not_held_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from attntrace import model, read
    from attntrace.read import decoding, workers

    doc = _naive_doc()
    path = tmp_path / "big.json"
    path.write_text(json.dumps({**doc, "traceEvents": doc["traceEvents"] * 4}))
    monkeypatch.setattr(decoding, "CHUNK_BYTES", 1 << 16)
    monkeypatch.setattr(workers, "read_workers", lambda pieces: 1)  # this process decodes every piece
    spans: list[tuple[int, int]] = []
    monkeypatch.setattr(decoding, "read_span", lambda p, lo, hi: spans.append((lo, hi)) or read_span(p, lo, hi))
    from attntrace.read.buffers import read_span

    raw = read.read(str(path))
    pieces = raw.pieces
    assert pieces is not None and len(pieces) > 2
    expected = model.build(raw)
    assert spans == pieces.spans and pieces.data == b""  # every piece read from the file, the copy let go
    # The same tables as from the copy in memory.
    monkeypatch.setattr(decoding, "read_span", read_span)
    copied = read.read(str(path))
    assert copied.pieces is not None
    copied.pieces.source = None
    again = model.build(copied)
    assert expected.ops.equals(again.ops) and expected.gpu.equals(again.gpu)


_TRACE_TEXT = b'{"traceEvents": []}'
# What `printf '{"traceEvents":[]}' | zstd -c` writes (zstd is not in Python's standard library before 3.14).
_ZSTD_FRAME = b'(\xb5/\xfd\x04X\x91\x00\x00{"traceEvents":[]}lk\x9d\xdd'


def _zip(path: Path) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("rank0.json", _TRACE_TEXT)


def _tar(path: Path, mode: str) -> None:
    import io
    import tarfile

    with tarfile.open(path, mode) as archive:
        info = tarfile.TarInfo("rank0.json")
        info.size = len(_TRACE_TEXT)
        archive.addfile(info, io.BytesIO(_TRACE_TEXT))


def _analysed(report: str) -> list[str]:
    return [t["path"] for t in json.loads(report)["traces"] if not t["error"]]


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


@pytest.mark.parametrize(("name", "make", "said"), [
    ("bz.json.gz", lambda p: _write(p, __import__("bz2").compress(_TRACE_TEXT)),
     "bz2-compressed data, not a trace (attntrace reads JSON and gzip): bunzip2 -c {path} > bz.json"),
    ("zs.json.gz", lambda p: _write(p, _ZSTD_FRAME),
     "zstd-compressed data, not a trace (attntrace reads JSON and gzip): zstd -dc {path} > zs.json"),
    ("xz.json", lambda p: _write(p, __import__("lzma").compress(_TRACE_TEXT)),
     "xz-compressed data, not a trace (attntrace reads JSON and gzip): xz -dc {path} > xz.unpacked.json"),
    ("ranks.json", _zip, "a zip archive, not a trace (attntrace reads JSON and gzip): unzip {path} -d ranks, then "
     "lint ranks"),
    ("ranks.json", lambda p: _tar(p, "w"), "a tar archive, not a trace: mkdir ranks && tar -xf {path} -C ranks, then "
     "lint ranks"),
    ("ranks.json.gz", lambda p: _tar(p, "w:gz"), "a tar archive (gzip-compressed), not a trace: mkdir ranks && "
     "tar -xzf {path} -C ranks, then lint ranks"),
    # A tar in bz2 or xz was "bz2-compressed data" with a command that made it a .json holding a tar.
    ("ranks.tar.bz2", lambda p: _tar(p, "w:bz2"), "a tar archive (bzip2-compressed), not a trace: mkdir ranks && "
     "tar -xjf {path} -C ranks, then lint ranks"),
    ("ranks.txz", lambda p: _tar(p, "w:xz"), "a tar archive (xz-compressed), not a trace: mkdir ranks && "
     "tar -xJf {path} -C ranks, then lint ranks"),
])
def test_a_compressed_file_or_archive_is_named_with_the_command_that_extracts_it(tmp_path: Path, name: str,
                                                                                make, said: str):
    # A bz2 or zstd file named .gz was "not a JSON object or list (starts with b'BZh91...')"; a tar.gz was "the gzip
    # stream does not hold JSON (it starts with b'rank0.json')".
    from click.testing import CliRunner

    from attntrace.cli import main

    path = tmp_path / name
    make(path)
    good = sample("bf16_causal_fwd/naive")
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", "--format", "json", str(path), good])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {path}: {said.format(path=path)}"]
    assert _analysed(result.stdout) == [good]  # the other input still reported


def test_a_procfs_file_is_read_for_what_it_holds():
    # /proc/cpuinfo has size 0 and text to read: it was "file is empty".
    from click.testing import CliRunner

    from attntrace.cli import main

    if not Path("/proc/cpuinfo").is_file():
        pytest.skip("no procfs here")
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", "--format", "json", "/proc/cpuinfo"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: /proc/cpuinfo: not a JSON object or list (starts with b'")
    assert "empty" not in result.stderr


@pytest.mark.parametrize("missing", ["fsspec", "aiohttp"])
def test_an_http_url_without_the_remote_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch, missing: str):
    # Without aiohttp (fsspec came with another package) it was "cannot list (ModuleNotFoundError: No module
    # named 'aiohttp')".
    from click.testing import CliRunner

    from attntrace.cli import main

    monkeypatch.setitem(sys.modules, missing, None)  # import raises ImportError
    good = sample("bf16_causal_fwd/naive")
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", "--format", "json", "http://127.0.0.1:9/t.json", good])
    assert result.exit_code == 2
    line, = result.stderr.splitlines()
    assert line.startswith("error: http://127.0.0.1:9/t.json: reading http:// URLs needs the [remote] extra (")
    # The install command names where this copy of attntrace came from (install.pip_install).
    assert "pip install" in line and "[remote]" in line.split("extra", 1)[1]
    assert _analysed(result.stdout) == [good]


def _without_steps(doc: dict, keep: int) -> dict:
    """The document with its ProfilerStep markers after the first `keep` taken out (the events stay)."""
    marked = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    dropped = {id(e) for e in marked if int(e["name"].split("#")[1]) > keep}
    return {**doc, "traceEvents": [e for e in doc["traceEvents"] if id(e) not in dropped]}


@pytest.mark.parametrize(("keep", "said"), [
    (0, "not compared: the new trace marks no steps (its one window is the whole trace), and the test needs 2 steady "
        "steps on each side; to compare, call prof.step() once per iteration so that steps are marked, and capture "
        "at least 3 steps"),
    (1, "not compared: the new trace has 1 steady step, and the test needs 2 steady steps on each side; to compare, "
        "capture at least 3 steps"),
])
def test_diff_gives_no_verdict_on_too_few_steady_steps(tmp_path: Path, keep: int, said: str):
    # The same events, the new side without its step markers: "+257%, 100% confident the new one is slower:
    # REGRESSION", exit 1 under --fail-over 5.
    from click.testing import CliRunner

    from attntrace.cli import main

    doc = _naive_doc()
    base, new = tmp_path / "base.json", tmp_path / "new.json"
    base.write_text(json.dumps(doc))
    new.write_text(json.dumps(_without_steps(doc, keep)))
    result = CliRunner().invoke(main, ["diff", str(base), str(new), "--fail-over", "5", "--format", "json"])
    assert result.exit_code == 0, result.output
    comparison, = json.loads(result.stdout)["comparisons"]
    step = comparison["step"]
    assert step["not_compared"].startswith(said)
    assert step["confidence_slower"] is None and not comparison["regression"] and not comparison["outside_noise"]
    assert step["base_median"] > 0 and step["new_median"] > 0 and step["change_pct"] is not None  # figures shown
    text = CliRunner().invoke(main, ["diff", str(base), str(new), "--fail-over", "5"])
    assert text.exit_code == 0 and "REGRESSION" not in text.stdout and said in text.stdout


def test_small_files_go_to_the_workers_in_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # One task, one message each way and one future per file: 10,000 small traces took 725 s with --jobs 2.
    # Batched, 48 files take 8 tasks (6 files each: 4 batches per worker at least), in input order, and a worker
    # that dies on one file of a batch is that file's error alone.
    from concurrent.futures import ProcessPoolExecutor

    from test_hostile_round2 import die_on_marked, small_trace

    from attntrace.model import loading

    names = [f"rank{i:02d}.json" for i in range(48)]
    for name in [*names, "rank20_die.json"]:
        small_trace(tmp_path / name)
    sent: list[int] = []
    submit = ProcessPoolExecutor.submit

    def counted(self: ProcessPoolExecutor, fn, *args, **kwargs):
        sent.append(len(args[0][0]) if fn is getattr(loading, "_call_batch", None) else 1)
        return submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", counted)
    assert list(loading.map_inputs([str(tmp_path / n) for n in names], die_on_marked, jobs=2)) == names
    assert sent == [6] * 8
    names[20] = "rank20_die.json"
    results = list(loading.map_inputs([str(tmp_path / n) for n in names], die_on_marked, jobs=2))
    assert results[:20] == names[:20] and results[21:] == names[21:]
    assert isinstance(results[20], loading.InputError) and results[20].path.endswith("rank20_die.json")
    assert results[20].message.startswith("out of memory while analysing")


def test_a_device_name_of_megabytes_is_ignored_not_matched_and_printed(tmp_path: Path) -> None:
    # A 50 MB deviceProperties name took lint 133 s: a regex per peaks.toml entry and one Python call per
    # character of every printed string. 5 MB took 6 s; now it is a note.
    doc = _naive_doc()
    doc["deviceProperties"][0]["name"] = "a" * 5_000_000
    path = tmp_path / "huge_name.json"
    path.write_text(json.dumps(doc))
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", str(path), "--fail-on", "never"],
                          capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    assert "ignored: deviceProperties name (over 1024 characters)" in done.stdout
    assert "aaaa" not in done.stdout and "AT102" in done.stdout


def test_the_workers_share_the_cores_as_polars_threads(tmp_path: Path):
    """Each worker of a --jobs pool runs on its own share of the cores the run started with, with polars threads
    for that share (one on a share of ONE_THREAD_CORES or fewer): a pool of every core in each worker made their
    threads preempt each other, and a pool thread on another core cost two cross-core wake-ups a query. The
    command line keeps itself to one core first; the workers still get every core's share (the server is started
    on all of them). Run in a process of its own: the fork server sizes polars' pool once, when it starts."""
    for name in "abcd":
        (tmp_path / f"{name}.json").write_text("{}")
    (tmp_path / "threads_of.py").write_text("import os\nimport polars\n\n\ndef threads_of(path):\n"
                                            "    return polars.thread_pool_size(), sorted(os.sched_getaffinity(0))\n")
    script = ("from attntrace.cores import keep_to_one_core, START_CORES\nkeep_to_one_core()\n"
              "from threads_of import threads_of\nfrom attntrace.model.loading import map_inputs\n"
              "if __name__ == '__main__':\n"
              "    inputs = ['a.json', 'b.json', 'c.json', 'd.json']\n"
              "    print(repr((list(START_CORES), sorted(set(map(repr, map_inputs(inputs, threads_of, jobs=2)))))))\n")
    env = {k: v for k, v in _env().items() if k != "POLARS_MAX_THREADS"}
    done = subprocess.run([sys.executable, "-c", script], env={**env, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    cores, seen = ast.literal_eval(done.stdout)
    share = max(1, len(cores) // 2)
    shares = [cores[:share], cores[share:2 * share]] if len(cores) >= 2 else [cores]
    for threads, affinity in map(ast.literal_eval, seen):
        assert threads == polars_threads(share)
        assert affinity in shares


def test_the_command_line_keeps_polars_to_one_core_where_cores_are_few():
    """With ONE_THREAD_CORES cores or fewer the command line runs polars on one thread on its first core (a small
    trace linted in 0.56 s, and 0.40 s so); with more it is left as it was, and so is a user's POLARS_MAX_THREADS."""
    script = ("import os\nfrom attntrace.cores import keep_to_one_core, START_CORES\nkeep_to_one_core()\n"
              "import polars\nprint(repr((list(START_CORES), sorted(os.sched_getaffinity(0)), "
              "polars.thread_pool_size())))\n")
    env = {k: v for k, v in _env().items() if k != "POLARS_MAX_THREADS"}
    for user_threads in (None, "3"):
        run_env = env if user_threads is None else {**env, "POLARS_MAX_THREADS": user_threads}
        done = subprocess.run([sys.executable, "-c", script], env=run_env, capture_output=True, text=True,
                              timeout=120, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        cores, affinity, threads = ast.literal_eval(done.stdout)
        if user_threads is None and len(cores) <= ONE_THREAD_CORES:
            assert (affinity, threads) == (cores[:1], 1)
        else:
            assert affinity == cores
            assert threads == (int(user_threads) if user_threads else len(cores))


def test_lint_on_the_command_line_runs_where_it_kept_itself(tmp_path: Path):
    """`attntrace lint` itself keeps to one core with one polars thread where cores are few (the tests above call
    keep_to_one_core directly): what the process has at its end, written by a hook."""
    seen = tmp_path / "seen.txt"
    hook = (f"import atexit, os\n"
            f"def _write():\n"
            f"    with open({str(seen)!r}, 'a') as out:\n"
            f"        kept = sorted(os.sched_getaffinity(0)), os.environ.get('POLARS_MAX_THREADS')\n"
            f"        out.write(repr(kept) + '\\n')\n"
            f"atexit.register(_write)\n")
    _, _, done = _lint_with_hook(tmp_path, hook, "1")
    assert done.returncode == 0, done.stderr
    affinity, threads = ast.literal_eval(seen.read_text().splitlines()[-1])
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= ONE_THREAD_CORES:
        assert (affinity, threads) == (cores[:1], "1")
    else:
        assert (affinity, threads) == (cores, None)


@pytest.mark.parametrize("processes", [1, 2])
def test_a_file_renamed_over_while_its_pieces_are_decoded_is_that_files_error(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch,
                                                                              processes: int):
    """Pieces are read from the file as it was read (its device, inode, size and mtime): another file of the same
    size renamed over it meanwhile (a trace being rewritten by a capture's atomic save) gave a report of both
    files' events mixed, with no word said."""
    from attntrace import model, read
    from attntrace.read import TraceError, decoding, workers

    doc = _naive_doc()
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({**doc, "traceEvents": doc["traceEvents"] * 4}))
    other = tmp_path / "other.json"
    other.write_text(path.read_text().replace('"ph": "X"', '"ph": "x"'))  # as long, other events
    assert other.stat().st_size == path.stat().st_size
    monkeypatch.setattr(decoding, "CHUNK_BYTES", 1 << 16)
    monkeypatch.setattr(decoding, "MIN_PIECE_BYTES", 1 << 14)
    monkeypatch.setattr(workers, "read_workers", lambda pieces: processes)
    raw = read.read(str(path))
    assert raw.pieces is not None and raw.pieces.source is not None
    os.replace(other, path)
    with pytest.raises(TraceError, match="the file changed while it was read"):
        model.build(raw)


def test_a_file_named_twice_is_analysed_and_reported_once(tmp_path: Path):
    # `lint a.json a.json ./a.json` reported the trace three times (and a bad file's error line twice).
    trace = tmp_path / "a.json"
    trace.write_text(json.dumps(_naive_doc()))
    empty = tmp_path / "empty.json"
    empty.write_text("")
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", "a.json", "a.json", "./a.json", "empty.json",
                           str(empty), ".", "--format", "json", "--fail-on", "never"], env=_env(), cwd=tmp_path,
                          capture_output=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == ["error: empty.json: file is empty"]
    assert [t["path"] for t in json.loads(done.stdout)["traces"] if not t["error"]] == ["a.json"]


def test_a_tree_too_deep_to_walk_is_one_error_and_the_rest_is_reported(tmp_path: Path):
    # os.walk and pathlib's ** recurse per level: 1,100 nested folders ended the run with a RecursionError traceback.
    trace = tmp_path / "good.json"
    trace.write_text(json.dumps(_naive_doc()))
    deep = tmp_path / "deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(1100):  # by folder descriptors: the path itself passes PATH_MAX
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    try:
        for pattern in (str(deep), f"{deep}/**/*.json"):
            done = subprocess.run([sys.executable, "-m", "attntrace", "lint", str(trace), pattern, "--format",
                                   "json", "--fail-on", "never"], env=_env(), capture_output=True, timeout=120)
            assert done.returncode == 2
            assert done.stderr.decode().splitlines() == [f"error: {pattern}: directories nested too deeply to search"]
            assert [t["path"] for t in json.loads(done.stdout)["traces"] if not t["error"]] == [str(trace)]
    finally:
        _flatten_away(deep)


def _flatten_away(deep: Path) -> None:
    """Remove a chain of folders named d too deep for shutil.rmtree (pytest's clean-up of old runs printed its
    RecursionError): a level at a time, the grandchild moved up in place of its parent."""
    moved = deep.parent / "moved"
    while (deep / "d").exists():
        if (deep / "d" / "d").exists():
            os.rename(deep / "d" / "d", moved)
            os.rmdir(deep / "d")
            os.rename(moved, deep / "d")
        else:
            os.rmdir(deep / "d")
    os.rmdir(deep)


def test_a_pattern_names_its_broken_links_as_a_folder_does(tmp_path: Path):
    # A quoted pattern kept only what os.path.isfile took: dangling and looping links went without a word.
    (tmp_path / "good.json").write_text(json.dumps(_naive_doc()))
    (tmp_path / "dangling.json").symlink_to(tmp_path / "missing.json")
    (tmp_path / "loop.json").symlink_to(tmp_path / "loop.json")
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", f"{tmp_path}/*.json", "--format", "json",
                           "--fail-on", "never"], env=_env(), capture_output=True, timeout=120)
    assert done.returncode == 2
    errors = done.stderr.decode().splitlines()
    assert [line.split(": ")[1] for line in errors] == [str(tmp_path / "dangling.json"), str(tmp_path / "loop.json")]


def test_a_directory_of_other_json_only_is_an_error_not_a_pass(tmp_path: Path):
    # A directory holding only other programs' JSON (run.json, configs) linted as "0 trace(s)" with exit 0: a CI
    # gate passed having analysed nothing, where an empty directory is an error.
    pytest.importorskip("polars")
    only = tmp_path / "only"
    only.mkdir()
    (only / "run.json").write_text('{"foo": 1}')
    (only / "x.json").write_text("{}")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "run.json").write_text('{"foo": 1}')
    (mixed / "t.pt.trace.json.gz").write_bytes(Path(sample("bf16_causal_fwd/naive")).read_bytes())
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", str(only), str(mixed), "--format", "json",
                           "--fail-on", "never"], env=_env(), capture_output=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.decode().splitlines() == [
        f"error: {only}: no traces in this directory: its 2 JSON file(s) are not traces (run.json, x.json)"]
    traces = json.loads(done.stdout)["traces"]
    assert [(t["error"] or {}).get("kind") for t in traces] == [None, "not-found"]


@pytest.mark.parametrize("command", [["diff", "CUT", "GOOD"], ["whatif", "CUT", "--graph"], ["summary", "CUT"],
                                     ["lint", "CUT"]])
def test_every_command_that_names_salvage_has_it(tmp_path: Path, command: list[str]):
    # A cut-off trace's error says "--salvage analyses the complete events"; diff and whatif had no such option
    # ("No such option: --salvage").
    from click.testing import CliRunner

    from attntrace.cli import main

    good = sample("bf16_causal_fwd/naive")
    cut = tmp_path / "cut.json"
    text = gzip.decompress(Path(good).read_bytes())
    cut.write_bytes(text[:len(text) // 2])
    args = [{"CUT": str(cut), "GOOD": good}.get(a, a) for a in command]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "--salvage" in refused.stderr
    salvaged = CliRunner().invoke(main, [*args, "--salvage"])
    assert "No such option" not in salvaged.stderr and "is cut off" not in salvaged.stderr, salvaged.stderr
