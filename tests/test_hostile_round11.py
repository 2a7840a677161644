"""Hostile inputs, round 11 (issue 43, reliability): remote protocols whose backends no extra installs, and the
ends of a run that signals and dead parents reach. Each test failed before its fix."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, sample

from attntrace import api


def _attntrace(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attntrace", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.mark.parametrize(("url", "module"), [("hf://datasets/org/name/rank0.json", "huggingface_hub"),
                                             ("sftp://host/traces/rank0.json", "paramiko")])
def test_a_protocol_no_extra_covers_names_its_backend_not_the_remote_extra(url: str, module: str):
    # It said "pip install 'attntrace[remote]'", which installs fsspec and aiohttp but not the backend, so the
    # same error came back after the install.
    if importlib.util.find_spec("fsspec") is None:
        pytest.skip("fsspec is not installed")
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed")
    result = _attntrace("lint", url)
    assert result.returncode == 2
    line = result.stderr.splitlines()[0]
    protocol = url.split("://")[0]
    assert line.startswith(f"error: {url}: {protocol}:// needs a package that is not installed (")
    assert "[remote]" not in line and f"backend for {protocol}:// (the module {module!r})" in line


def test_without_fsspec_a_protocol_no_extra_covers_says_the_backend_is_needed_too(monkeypatch: pytest.MonkeyPatch):
    from click.testing import CliRunner

    from attntrace.cli import main

    monkeypatch.setitem(sys.modules, "fsspec", None)  # import raises ImportError
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", "hf://datasets/org/name/rank0.json"])
    assert result.exit_code == 2
    line = result.stderr.splitlines()[0]
    assert "needs fsspec and its hf:// backend, which no extra of attntrace installs" in line


# A polars query that stays in Rust for minutes (each step ranks 4M rows, 0.25 s here): the main thread does not
# come back to Python, where a signal handler runs, until it ends.
_LONG_QUERY = """
import signal, sys
import polars as pl
from attntrace import late_signals
from attntrace.__main__ import _interrupted
from attntrace.formats import output

late_signals.answer([signal.SIGTERM, signal.SIGINT], _interrupted)
unfinished = output.replacing(sys.argv[1])
unfinished.__enter__()  # a temporary file beside the output, as --output writes
lf = pl.LazyFrame({"x": pl.int_range(0, 4_000_000, eager=True)})
for _ in range(600):
    lf = lf.with_columns((pl.col("x") * 7919 % 4_000_037).rank("ordinal").cast(pl.Int64))
print("ready", flush=True)
lf.collect()
"""


@pytest.mark.parametrize("signum", [15, 2])
def test_a_signal_ends_the_run_while_a_long_polars_query_holds_the_main_thread(tmp_path: Path, signum: int):
    # A summary of a 3.3 GB Nsight export with 200 KB NVTX texts ignored SIGTERM for 13 minutes: Python runs a
    # handler between bytecodes, and the regex ran in Rust. The output's temporary file stayed as long.
    target = tmp_path / "report.json"
    process = subprocess.Popen([sys.executable, "-c", _LONG_QUERY, str(target)], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT), "POLARS_MAX_THREADS": "1"})
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        time.sleep(0.5)  # into the query
        process.send_signal(signum)
        code = process.wait(timeout=60)  # the query alone runs for minutes
    finally:
        process.kill()
        process.wait()
    assert code == 128 + signum
    assert list(tmp_path.iterdir()) == []


def test_a_second_signal_while_the_first_is_answered_still_ends_the_run(tmp_path: Path):
    # The handler waits for the workers it stops; a second SIGTERM in that wait runs the handler again, inside the
    # first. It must end the process as the first would, not wait for a thread that is itself.
    script = """
import os, signal, sys, time
from attntrace import late_signals

def ending(signum, frame):
    print("answering", flush=True)
    time.sleep(0.5)  # a second signal comes in here
    os._exit(128 + signum)

late_signals.answer([signal.SIGTERM], ending)
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        process.send_signal(15)
        assert process.stdout.readline() == "answering\n"
        process.send_signal(15)
        code = process.wait(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert code == 143


def _shares(value: object, path: str = "") -> list[tuple[str, float]]:
    """Every share (a key with "share" in it) in a report part, with where it is."""
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in _shares(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [s for i, item in enumerate(value) for s in _shares(item, f"{path}[{i}]")]
    if "share" in path.rsplit(".", 1)[-1] and isinstance(value, float):
        return [(path, value)]
    return []


def test_kernels_that_share_one_start_never_take_more_than_the_whole_step(tmp_path: Path):
    # Every kernel at one ts: their durations add up to far more than the GPU's busy time (the union of them). An
    # AT201 consequence read 539% of compute, AT101 104% of step GPU time; a saving read 113% of the step.
    doc = json.loads(gzip.decompress(Path(sample("bf16_causal_fwd/sdpa_math")).read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    start = min(e["ts"] for e in kernels)
    for event in kernels:
        event["ts"] = start
    path = tmp_path / "kernels_at_one_start.json"
    path.write_text(json.dumps(doc))
    findings = api.lint([path], fail_on="never").to_dict()["findings"]
    shares = _shares(findings)
    assert shares and all(0.0 <= share <= 1.0 for _, share in shares), [s for s in shares if s[1] > 1]
    assert any(share == 1.0 for _, share in shares)  # one at least was past the whole, and is the whole now


def test_a_real_trace_keeps_its_shares():
    # The cap changes nothing where kernels do not overlap: the sample's shares are all under 1, as before.
    findings = api.lint([sample("bf16_causal_fwd/sdpa_math")], fail_on="never").to_dict()["findings"]
    shares = _shares(findings)
    assert shares and all(0.0 <= share < 1.0 for _, share in shares)


def _numbers(value: object) -> list[float]:
    if isinstance(value, dict):
        return [n for item in value.values() for n in _numbers(item)]
    if isinstance(value, list):
        return [n for item in value for n in _numbers(item)]
    return [float(value)] if isinstance(value, int | float) and not isinstance(value, bool) else []


def test_a_step_marker_far_from_every_other_event_is_not_a_step(tmp_path: Path):
    # One ProfilerStep at ts 1e300: a step of 1e300 us, "3333...ms -> 3333...ms" for all fixes at once, and every
    # share of the step nothing, with exit 0 and no word.
    doc = _naive_doc()
    marker = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")][1]
    marker["ts"] = 1e300
    path = tmp_path / "far_step.json"
    path.write_text(json.dumps(doc))
    report = api.lint([path], fail_on="never").to_dict()
    trace = report["traces"][0]
    assert "1 ProfilerStep marker(s) more than 1e+11 us from the trace's ops ignored" in trace["summary"]["notes"]
    assert max(_numbers(trace["summary"]) + _numbers(report["findings"])) < 1e11


def _naive_doc() -> dict:
    return json.loads(gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes()))


def test_ops_whose_kernels_took_no_time_have_no_headroom_below_zero(tmp_path: Path):
    # Kernel durations a writer left negative (read as 0): the roofline kept each op's bound against no time, a
    # headroom of minus the bound (-749 us for the mask's DtoD copy).
    doc = _naive_doc()
    for event in doc["traceEvents"]:
        if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            event["dur"] = -1
    path = tmp_path / "no_kernel_time.json"
    path.write_text(json.dumps(doc))
    timeless = api.lint([path], fail_on="never").to_dict()["traces"][0]["roofline"]
    rows = timeless["ops"] + timeless["classes"]
    assert rows and all(row.get("headroom_us") is None and row.get("bound_us") is None for row in rows)
    timed = api.lint([sample("bf16_causal_fwd/naive")], fail_on="never").to_dict()["traces"][0]["roofline"]
    assert sorted(row["op"] for row in timed["ops"] if row["headroom_us"] is not None) == \
        sorted(row["op"] for row in timeless["ops"])  # the same ops, judged where they took time


def test_gpu_events_that_start_before_their_launch_are_named(tmp_path: Path):
    # Every ts negated: each launch found the wrong op by time, and an fp32 matmul "ran" at 1,171 TFLOP/s against
    # a roof of 67, with exit 0 and no word.
    doc = json.loads(gzip.decompress(Path(sample("bf16_causal_fwd/sdpa_math")).read_bytes()))
    for event in doc["traceEvents"]:
        if isinstance(event.get("ts"), int | float):
            event["ts"] = -event["ts"]
    path = tmp_path / "negated.json"
    path.write_text(json.dumps(doc))
    notes = api.lint([path], fail_on="never").to_dict()["traces"][0]["summary"]["notes"]
    early = "60 of 60 GPU event(s) start before the CPU call linked to them as their launch"
    assert any(n.startswith(early) for n in notes)
    for name in ("bf16_causal_fwd/sdpa_math", "bf16_causal_fwd/naive"):  # real captures: silent
        notes = api.lint([sample(name)], fail_on="never").to_dict()["traces"][0]["summary"]["notes"]
        assert not any("before the CPU call" in n for n in notes)
