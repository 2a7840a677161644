"""Hostile inputs, round 4 (a probe of ~700 generated cases): what broke the contract, each from a real trace
where the case allows it. Each test failed on the code before its fix."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import sample
from test_shared_timestamps import PEAK_LIMIT_MB, _peak_mb

from attntrace.cli import main
from attntrace.model.loading import load

NAIVE, GOOD = sample("bf16_causal_fwd/naive"), sample("bf16_causal_fwd/sdpa")


def lint_json(*paths: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(main, ["lint", "--format", "json", "-j1", "--fail-on", "never", *paths])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, orjson.loads(result.stdout), result.stderr


def _naive_document() -> dict[str, Any]:
    return json.loads(gzip.decompress(Path(NAIVE).read_bytes()))


@pytest.mark.parametrize("where", [b'"name": "NVIDIA ', b'"cat": "kernel", "name": "'])
def test_a_surrogate_written_as_utf8_bytes_is_replaced_not_a_traceback(tmp_path: Path, where: bytes):
    # Bytes ED A0 80 (a lone surrogate encoded as UTF-8) in the device name: the JSON report could not be written
    # (traceback, no output, the good trace beside it lost); in a kernel name the trace was an internal error.
    text = json.dumps(_naive_document()).encode()
    assert where in text
    path = tmp_path / "raw_surrogate.json"
    path.write_bytes(text.replace(where, where + b"\xed\xa0\x80", 1))
    code, report, stderr = lint_json(str(path), GOOD)
    assert code == 0 and "Traceback" not in stderr
    assert [t["error"] for t in report["traces"]] == [None, None]
    assert any("written as UTF-8 bytes replaced with U+FFFD" in note for note in load(str(path)).meta.notes)


@pytest.mark.parametrize(("key", "value"), [("warpSize", -1), ("warpSize", 4096), ("warpSize", 0.5),
                                            ("maxThreadsPerMultiprocessor", 16), ("maxThreadsPerMultiprocessor", True),
                                            ("maxThreadsPerMultiprocessor", "2048"), ("sharedMemPerBlockOptin", [1]),
                                            ("regsPerMultiprocessor", "abc"), ("computeMajor", "abc"),
                                            ("computeMinor", [1])])
def test_device_properties_that_are_not_counts_are_ignored(tmp_path: Path, key: str, value: Any):
    # AT401's occupancy divided by them: a ZeroDivisionError or TypeError turned the whole trace into an internal
    # error. A property that is not a positive whole number is now missing: the occupancy is not computed from it.
    document = _naive_document()
    document["deviceProperties"][0][key] = value
    path = tmp_path / "device.json"
    path.write_text(json.dumps(document, allow_nan=True))
    code, report, stderr = lint_json(str(path), GOOD)
    assert code == 0, stderr
    assert [t["error"] for t in report["traces"]] == [None, None]


def _one_correlation_id(pairs: int) -> dict[str, Any]:
    """`pairs` launches and kernels that all carry correlation id 1 (a writer that never counts)."""
    events: list[dict[str, Any]] = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1,
                                     "tid": 1, "ts": 0.0, "dur": 10.0 * pairs}]
    for i in range(pairs):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": i * 10.0, "dur": 1.0, "args": {"correlation": 1}})
        events.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": i * 10.0 + 2, "dur": 5.0,
                       "args": {"correlation": 1, "device": 0, "stream": 7}})
    return {"traceEvents": events}


@pytest.mark.slow
def test_launches_that_share_one_correlation_id_keep_memory_bounded(tmp_path: Path):
    # Every kernel was joined to every launch of its id: 5,000 pairs took 25 s and 9.7 GB. Each kernel now goes
    # to the nearest launch of its id before it: its own here.
    path = tmp_path / "one_correlation.json"
    path.write_text(json.dumps(_one_correlation_id(5000)))
    assert _peak_mb(path) < PEAK_LIMIT_MB
    linked = load(str(path)).gpu_linked.sort("ts")
    assert linked["launch"].to_list() == list(range(5000))  # the launches table's rows, in order


@pytest.mark.slow
def test_many_steps_with_many_graph_captures_keep_memory_bounded(tmp_path: Path):
    # Step windows were cross-joined with capture windows: 6,000 of each took 2.5 GB (20,000: 24 GB, killed).
    events: list[dict[str, Any]] = []
    for i in range(6000):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
                       "ts": i * 10.0, "dur": 9.0})
        if i % 2:  # every other step records a capture
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamBeginCapture", "pid": 1, "tid": 1,
                           "ts": i * 10.0 + 1, "dur": 1.0})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamEndCapture", "pid": 1, "tid": 1,
                           "ts": i * 10.0 + 3, "dur": 1.0})
    path = tmp_path / "captures.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert _peak_mb(path) < PEAK_LIMIT_MB
    windows = load(str(path)).steps.sort("step")
    assert windows["capture"].to_list() == [bool(i % 2) for i in range(6000)]


@pytest.mark.slow
def test_many_steps_on_many_devices_keep_memory_bounded(tmp_path: Path):
    # The step table held every step for every device: 5,000 steps on 500 devices that each worked in one step
    # were 2.5M rows, 4 GB and 1.1 GB of summary JSON. A device now has a row for the steps it worked in; a step
    # where none worked keeps one row.
    steps, devices = 5000, 500
    events: list[dict[str, Any]] = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1,
                                     "tid": 1, "ts": i * 10.0, "dur": 9.0} for i in range(steps)]
    events += [{"ph": "X", "cat": "kernel", "name": "k", "pid": d, "tid": 7, "ts": d * 10.0 + 1, "dur": 5.0,
                "args": {"device": d, "stream": 7}} for d in range(devices)]
    path = tmp_path / "steps_by_devices.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert _peak_mb(path) < PEAK_LIMIT_MB
    table = load(str(path)).step_table
    assert table.height == steps
    assert table.filter(pl.col("kernels") > 0).select("step", "device").rows() == [(d, d) for d in range(devices)]
