"""Hostile inputs, round 10 (issue 43, reliability): what the lint path answered in one line but the commands of
one trace (summary's API, whatif) did not, and environments that polars refuses. Each test failed before its
fix."""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, sample

from attntrace import api


def _naive_doc() -> dict:
    return json.loads(gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes()))


def _attntrace(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attntrace", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _deeply_nested(tmp_path: Path) -> Path:
    """A trace one of whose args holds arrays 10,000 deep: msgspec stops with RecursionError."""
    doc = _naive_doc()
    text = json.dumps(doc).replace('"Record function id": 0', '"Record function id": ' + "[" * 10000 + "]" * 10000, 1)
    path = tmp_path / "deep.json"
    path.write_text(text)
    return path


def test_whatif_of_a_trace_nested_too_deeply_is_one_line(tmp_path: Path):
    # It was a RecursionError traceback with exit 1; lint, summary and diff said it in one line.
    path = _deeply_nested(tmp_path)
    result = _attntrace("whatif", str(path))
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"error: {path}: JSON nested too deeply for this reader\n"


def test_the_api_of_one_trace_raises_one_line_for_a_trace_nested_too_deeply(tmp_path: Path):
    path = _deeply_nested(tmp_path)
    for call in (api.summarize, api.whatif):
        with pytest.raises(api.TraceReadError) as raised:
            call(path)
        assert str(raised.value) == f"{path}: JSON nested too deeply for this reader"


@pytest.mark.parametrize("threads", ["0", "100000"])
def test_a_thread_count_polars_cannot_run_is_one_line_before_any_work(threads: str):
    # 0 was a Rust panic and a Python traceback with exit 1; 100000 never finished a 36 KB trace (SIGTERM ignored
    # while polars started its threads).
    result = _attntrace("lint", sample("bf16_causal_fwd/naive"), env={"POLARS_MAX_THREADS": threads}, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: POLARS_MAX_THREADS={threads} is not a number of threads polars can run")
    assert result.stderr.count("\n") == 1 and not result.stdout


@pytest.mark.parametrize("threads", ["1", "3", "auto"])
def test_a_thread_count_polars_runs_or_passes_over_is_left_to_it(threads: str):
    result = _attntrace("lint", sample("bf16_causal_fwd/naive"), "--format", "json",
                        env={"POLARS_MAX_THREADS": threads})
    assert result.returncode in (0, 1), result.stderr
    assert json.loads(result.stdout)["summary"]["traces"] == 1


def test_whatif_with_a_bad_config_or_a_bad_pyproject_is_one_line(tmp_path: Path):
    # A traceback with exit 1 for --config; the nearest pyproject.toml was not read at all.
    bad = tmp_path / "bad.toml"
    bad.write_text("[tool.attntrace.profiler_cost]\ncpu_op_us = -1.0\n")
    result = _attntrace("whatif", sample("bf16_causal_fwd/naive"), "--config", str(bad))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {bad}: ")
    (tmp_path / "pyproject.toml").write_text("[tool.attntrace\n")
    result = subprocess.run([sys.executable, "-m", "attntrace", "whatif", sample("bf16_causal_fwd/naive")],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "pyproject.toml" in result.stderr


@pytest.mark.parametrize("factor", ["nan", "inf", "1e400"])
def test_whatif_refuses_a_speed_up_that_is_no_number(factor: str):
    # nan was accepted, and a 1.2 ms step came out at 0.037 ms.
    result = _attntrace("whatif", sample("bf16_causal_fwd/naive"), "--speedup", f"gemm_fp32_simt={factor}")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "the factor must be a finite number" in result.stderr


def _export(tmp_path: Path, name: str, *statements: str) -> Path:
    from nsys_build import TF32_GEMM, Export, Kernel

    path = Export(kernels=[Kernel(TF32_GEMM, 100.0 * (i + 1), 50.0) for i in range(4)]).write(
        tmp_path / name)
    with sqlite3.connect(path) as export:
        for statement in statements:
            export.execute(statement)
    return path


def test_a_wal_mode_export_is_read_without_files_made_beside_it(tmp_path: Path):
    # A WAL export got -shm and -wal files made beside it, and in a read-only folder it was refused.
    folder = tmp_path / "exports"
    folder.mkdir()
    path = _export(folder, "w.sqlite")
    with sqlite3.connect(path) as export:
        export.execute("PRAGMA journal_mode=WAL")
    before = sorted(os.listdir(folder))
    result = _attntrace("lint", str(path), "--format", "json")
    assert result.returncode in (0, 1), result.stderr
    assert json.loads(result.stdout)["traces"][0]["error"] is None
    assert sorted(os.listdir(folder)) == before == ["w.sqlite"]


@pytest.mark.parametrize(("edit", "said"), [
    ("UPDATE TARGET_INFO_GPU SET id = 'x'", "an Nsight Systems export holding a value Nsight does not write"),
    ("UPDATE META_DATA_EXPORT SET value = '³.24' WHERE name = 'EXPORT_SCHEMA_VERSION'", "schema version ³.24"),
    ("UPDATE META_DATA_EXPORT SET value = '" + "9" * 5000 + "' WHERE name = 'EXPORT_SCHEMA_VERSION'",
     "schema version 9999"),
])
def test_odd_values_in_an_export_are_the_files_problem_not_an_internal_error(tmp_path: Path, edit: str, said: str):
    # Each was "internal error (ValueError/KeyError/InvalidOperationError ...); please report it".
    bad = _export(tmp_path, "edited.sqlite", edit)
    good = _export(tmp_path, "good.sqlite")
    result = _attntrace("lint", str(bad), str(good), "--format", "json", "--fail-on", "never")
    assert result.returncode == 2
    errors = result.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"error: {bad}: ") and said in errors[0], errors
    assert "internal error" not in errors[0] and len(errors[0]) < 400
    assert [t["error"] is None for t in json.loads(result.stdout)["traces"]] == [False, True]


def test_text_in_an_nvtx_event_type_id_is_passed_over(tmp_path: Path):
    # ENUM_NSYS_EVENT_TYPE.id = 'abc' was "internal error (ValueError: invalid literal for int() ...)".
    from nsys_build import TF32_GEMM, Export, Kernel

    path = Export(kernels=[Kernel(TF32_GEMM, 20.0, 50.0)],
                  ranges=[("ProfilerStep#1", 0.0, 100.0), ("aten::mm, op_id = 1", 10.0, 80.0)]).write(
        tmp_path / "enum.sqlite")
    with sqlite3.connect(path) as export:
        export.execute("DROP TABLE ENUM_NSYS_EVENT_TYPE")  # remade without its INTEGER id, as a hand edit may
        export.execute("CREATE TABLE ENUM_NSYS_EVENT_TYPE (id, name)")
        export.execute("INSERT INTO ENUM_NSYS_EVENT_TYPE (id, name) VALUES ('abc', 'NvtxPushPopRange')")
    result = _attntrace("lint", str(path), "--format", "json")
    assert result.returncode in (0, 1), result.stderr
    assert json.loads(result.stdout)["traces"][0]["error"] is None


GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}


def _cpu_only(doc: dict) -> dict:
    """The same capture as a CPU-only one: no GPU events, no device properties."""
    return {**{k: v for k, v in doc.items() if k != "deviceProperties"},
            "traceEvents": [e for e in doc["traceEvents"] if e.get("cat") not in GPU_CATS]}


@pytest.mark.parametrize("cpu_only_side", ["new", "base"])
def test_diff_gives_no_verdict_between_an_estimate_and_a_recording(tmp_path: Path, cpu_only_side: str):
    # A GPU trace against the same program's CPU-only capture: its step without the profiler against the other's
    # step as recorded, called "+82.9% ... REGRESSION" (exit 1), and the other way round "-47.7% a real change".
    from click.testing import CliRunner

    from attntrace.cli import main

    doc = _naive_doc()
    gpu, cpu = tmp_path / "gpu.json", tmp_path / "cpu.json"
    gpu.write_text(json.dumps(doc))
    cpu.write_text(json.dumps(_cpu_only(doc)))
    base, new = (gpu, cpu) if cpu_only_side == "new" else (cpu, gpu)
    result = CliRunner().invoke(main, ["diff", str(base), str(new), "--fail-over", "5", "--format", "json"])
    assert result.exit_code == 0, result.output
    comparison, = json.loads(result.stdout)["comparisons"]
    step = comparison["step"]
    assert sorted(step["basis"].values()) == ["estimated", "recorded"]
    assert step["not_compared"].startswith("not compared: the ")
    assert f"the {cpu_only_side} trace's only as recorded with it" in step["not_compared"]
    assert "to compare, capture both the same way" in step["not_compared"]
    assert step["confidence_slower"] is None and not comparison["regression"] and not comparison["outside_noise"]


def test_diff_says_when_the_gpus_differ(tmp_path: Path):
    # A trace stretched 1.3x and relabelled as an A100 was a REGRESSION whose only cause named was "the GPU's work
    # changed": no device name anywhere in the output.
    from click.testing import CliRunner

    from attntrace.cli import main

    doc = _naive_doc()
    other = json.loads(json.dumps(doc))
    for props in other["deviceProperties"]:
        props["name"] = "NVIDIA A100-SXM4-80GB"
    base, new, same = tmp_path / "h200.json", tmp_path / "a100.json", tmp_path / "h200_again.json"
    base.write_text(json.dumps(doc))
    new.write_text(json.dumps(other))
    same.write_text(json.dumps(doc))
    text = CliRunner().invoke(main, ["diff", str(base), str(new)]).stdout
    assert "the GPUs differ (NVIDIA H200 -> NVIDIA A100-SXM4-80GB)" in text
    assert "the GPUs differ" not in CliRunner().invoke(main, ["diff", str(base), str(same)]).stdout
    result = CliRunner().invoke(main, ["diff", str(base), str(new), "--format", "json"])
    comparison, = json.loads(result.stdout)["comparisons"]
    assert comparison["devices"] == {"base": ["NVIDIA H200"], "new": ["NVIDIA A100-SXM4-80GB"]}
    # ... and no verdict: stretched 3x on the other GPU, it was a REGRESSION that failed the gate (exit 1).
    slower = json.loads(json.dumps(other))
    for event in slower["traceEvents"]:
        for key in ("ts", "dur"):
            if isinstance(event.get(key), (int, float)):
                event[key] *= 3
    new.write_text(json.dumps(slower))
    result = CliRunner().invoke(main, ["diff", str(base), str(new), "--fail-over", "5", "--format", "json"])
    assert result.exit_code == 0, result.output
    comparison, = json.loads(result.stdout)["comparisons"]
    assert comparison["step"]["not_compared"] == ("not compared: the GPUs differ (NVIDIA H200 -> NVIDIA "
                                                  "A100-SXM4-80GB); to judge the code, capture both on the same GPUs")
    assert not comparison["regression"] and comparison["step"]["confidence_slower"] is None


@pytest.mark.parametrize("pattern", ["{root}/**/*.json", "{root}/locked/*.json"])
def test_a_pattern_names_the_folders_it_could_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       pattern: str):
    # A recursive pattern passed over an unreadable folder in silence (exit 1, as if searched), and a pattern
    # into one said "no trace file matches this pattern"; given as a directory, the same folder was an error.
    from attntrace import read

    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "t.json").write_text(json.dumps(_naive_doc()))
    (tmp_path / "locked").mkdir()
    real_scandir = os.scandir

    def scandir(path: object = "."):  # what a search meets in a folder it may not read
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    found = list(read.discover([pattern.format(root=tmp_path)]))
    errors = [f for f in found if isinstance(f, read.TraceError)]
    assert len(errors) == 1 and errors[0].path.endswith("locked"), found
    assert errors[0].message == "cannot read this directory (Permission denied)"
    if "**" in pattern:
        assert (str(tmp_path / "ok" / "t.json"), pattern.format(root=tmp_path)) in found


@pytest.mark.parametrize("beneath", [None, "unreachable"])
def test_a_url_whose_host_cannot_be_reached_says_so(beneath: str | None):
    # fsspec's HTTP backend wraps every failed request in FileNotFoundError: a failed name lookup (no DNS) or no
    # route to the host was "no such object, bucket or prefix".
    import errno
    import socket

    from attntrace.read.sources import _failure

    cause: OSError = (socket.gaierror(-3, "Temporary failure in name resolution") if beneath is None
                      else OSError(errno.ENETUNREACH, "Network is unreachable"))
    try:
        try:
            raise cause
        except OSError as exc:
            raise FileNotFoundError("https://example.com/t.json.gz") from exc
    except FileNotFoundError as wrapped:
        error = _failure(wrapped, "https://example.com/t.json.gz", "reading")
    assert error.message.startswith("cannot connect (")
    assert _failure(FileNotFoundError("https://example.com/t.json.gz"), "https://example.com/t.json.gz",
                    "reading").message == "no such object, bucket or prefix"


@pytest.mark.parametrize(("name", "data", "said"), [
    ("double.json.gz", "gzip-twice", "the gzip stream holds another gzip stream (compressed twice): gunzip -c "),
    ("frame.json", "lz4", "lz4-compressed data, not a trace (attntrace reads JSON and gzip): lz4 -dc "),
])
def test_a_trace_compressed_twice_or_with_lz4_is_named(tmp_path: Path, name: str, data: str, said: str):
    # Both said "not a JSON object or list (starts with ...)" or "the gzip stream does not hold JSON".
    trace = Path(sample("bf16_causal_fwd/naive")).read_bytes()
    path = tmp_path / name
    # An lz4 frame's magic and header as the lz4 tool writes them (the content is not read).
    path.write_bytes(gzip.compress(trace) if data == "gzip-twice" else b"\x04\x22\x4d\x18\x64\x40\xa7" + trace[:64])
    result = _attntrace("lint", str(path), sample("bf16_causal_fwd/naive"), "--format", "json")
    assert result.returncode == 2
    errors = result.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"error: {path}: {said}"), errors
    assert [t["error"] is None for t in json.loads(result.stdout)["traces"]] == [False, True]


_GONE_WHILE_THE_SERVER_STARTS = """
import multiprocessing.forkserver as forkserver, multiprocessing.util as util, os, threading, time
from attntrace.read import workers
workers.warm_up()
print(forkserver._forkserver._forkserver_pid, util.get_temp_dir(), flush=True)
threading.Timer(0.05, os._exit, (0,)).start()
workers.SharingPool(1, 1).submit(time.sleep, 60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_a_parent_gone_while_its_server_started_leaves_no_folder(tmp_path: Path):
    # The server left at once, but the parent's /tmp/pymp-* folder (the server's socket) stayed: about one SIGKILL
    # in five of `lint --jobs 2` left one.
    import contextlib
    import signal
    import time

    pytest.importorskip("polars")
    done = subprocess.run([sys.executable, "-c", _GONE_WHILE_THE_SERVER_STARTS], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)})
    server, folder = done.stdout.split()[:2]
    assert Path(folder).parent == tmp_path
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (Path(f"/proc/{server}").exists() or Path(folder).exists()):
            time.sleep(0.1)
        assert not Path(folder).exists(), list(tmp_path.iterdir())
    finally:
        with contextlib.suppress(OSError):
            os.kill(int(server), signal.SIGKILL)


@pytest.mark.parametrize(("command", "said"), [(["whatif"], "send it to a file (> FILE)"),
                                               (["lint"], "give --output FILE")])
def test_a_closed_stdout_is_told_what_the_command_can_do(command: list[str], said: str):
    # whatif, which has no --output, said "give --output FILE".
    result = subprocess.run([sys.executable, "-m", "attntrace", *command, sample("bf16_causal_fwd/naive")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=lambda: os.close(1))
    assert result.returncode == 2
    assert result.stderr == f"error: stdout is closed: {said}\n"
