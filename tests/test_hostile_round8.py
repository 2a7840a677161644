"""Hostile inputs, round 8 (issue 26): a document gives the same answer at any size, and what is left out of it is
said. Each test failed before its fix."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import sample
from test_chunked import cut_into_pieces_of

from attntrace.cli import main
from attntrace.model.loading import load
from attntrace.read.errors import TraceError


def _naive_doc() -> dict:
    return json.loads(gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes()))


def _repeated(doc: dict, times: int) -> dict:
    """The sample's events `times` over: a document past the piece size of the tests."""
    return json.loads(json.dumps({**doc, "traceEvents": doc["traceEvents"] * times}))  # each event its own dict


@pytest.mark.parametrize("pieces", [False, True])
def test_an_event_list_without_phases_is_refused_at_any_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             pieces: bool):
    # Decoded in pieces (a trace over 16 MiB), events without "ph" were dropped without a word: "no findings",
    # exit 0; the same document decoded whole was refused.
    if pieces:
        cut_into_pieces_of(monkeypatch, 16 << 10)
    text = re.sub(r'"ph": "[A-Za-z]", ', "", json.dumps(_repeated(_naive_doc(), 4)))
    path = tmp_path / "noph.json"
    path.write_text(text)
    with pytest.raises(TraceError, match=r"none of its \d+ events has a phase"):
        load(str(path))


@pytest.mark.parametrize("pieces", [False, True])
def test_an_empty_or_eventless_list_is_refused_at_any_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           pieces: bool):
    if pieces:
        cut_into_pieces_of(monkeypatch, 16 << 10)
    empty = tmp_path / "empty.json"
    empty.write_bytes(b'{"traceEvents": []' + b" " * (64 << 10) + b"}")
    with pytest.raises(TraceError, match="no trace events"):
        load(str(empty))
    numbers = tmp_path / "numbers.json"
    numbers.write_bytes(b'{"traceEvents": [' + b",".join([b"12345678"] * 20000) + b"]}")
    with pytest.raises(TraceError, match="none of its 20000 items is a trace event"):
        load(str(numbers))


@pytest.mark.parametrize("form", ["list", "pieces"])
def test_events_of_an_unknown_phase_are_noted_in_every_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            form: str):
    # The kernels given "ph": "x" (lower case): the object form noted them, a bare list and a large trace did not.
    doc = _naive_doc()
    for event in doc["traceEvents"]:
        if event.get("cat") == "kernel":
            event["ph"] = "x"
    kernels = sum(e.get("cat") == "kernel" for e in doc["traceEvents"])
    path = tmp_path / "phx.json"
    if form == "list":
        path.write_text(json.dumps(doc["traceEvents"]))
    else:
        cut_into_pieces_of(monkeypatch, 16 << 10)
        doc = _repeated(doc, 4)
        kernels *= 4
        path.write_text(json.dumps(doc))
    trace = load(str(path))
    assert f'{kernels} events without a phase ("ph") the Trace Event Format knows ignored' in trace.meta.notes


def test_an_empty_argument_is_not_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # `attntrace lint "$TRACE"` with TRACE unset linted every trace under the current directory.
    (tmp_path / "a.pt.trace.json.gz").write_bytes(Path(sample("bf16_causal_fwd/naive")).read_bytes())
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["lint", ""])
    assert result.exit_code == 2
    assert "a.pt.trace.json.gz" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "empty" in result.stderr


@pytest.mark.parametrize("change", ["negative", "missing"])
def test_a_negative_or_missing_duration_is_said(tmp_path: Path, change: str):
    # Read as 0 without a word: GPU busy 0.77 ms instead of 8.4 ms and a false AT402 warning, with no note.
    doc = _naive_doc()
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    for event in kernels:
        if change == "negative":
            event["dur"] = -event["dur"]
        else:
            del event["dur"]
    path = tmp_path / "dur.json"
    path.write_text(json.dumps(doc))
    notes = load(str(path)).meta.notes
    assert f"{len(kernels)} event(s) with a negative or missing duration read as 0" in notes


def _begin_end_steps(zero_length_op: bool, close_last: bool = True) -> dict:
    """Three steps written as B/E pairs (0.9 ms each), a launch and a kernel in each; with a zero-length op
    (B and E at one time) inside each step."""
    events = []
    for i in range(3):
        t = i * 1000.0
        events += [{"ph": "B", "cat": "user_annotation", "name": f"ProfilerStep#{i + 1}", "pid": 1, "tid": 1, "ts": t},
                   {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 20,
                    "dur": 5, "args": {"correlation": i + 1}},
                   {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": t + 40, "dur": 400,
                    "args": {"correlation": i + 1, "device": 0, "stream": 7}}]
        if zero_length_op:
            events += [{"ph": "B", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": t + 500},
                       {"ph": "E", "pid": 1, "tid": 1, "ts": t + 500}]
        if close_last or i < 2:
            events.append({"ph": "E", "pid": 1, "tid": 1, "ts": t + 900})
    return {"traceEvents": events}


def test_a_zero_length_pair_inside_an_open_begin_closes_itself(tmp_path: Path):
    # Pairing put every "E" before a "B" at one time: the zero-length op's "E" closed the step (0.5 ms, not 0.9).
    path = tmp_path / "be.json"
    path.write_text(json.dumps(_begin_end_steps(zero_length_op=True)))
    trace = load(str(path))
    windows = trace.steps.select((pl.col("end") - pl.col("ts")).alias("us"))["us"].to_list()
    assert windows == [900.0, 900.0, 900.0]
    assert trace.ops.filter(pl.col("name") == "aten::empty")["dur"].to_list() == [0.0, 0.0, 0.0]


def test_a_begin_that_no_end_closes_is_said(tmp_path: Path):
    path = tmp_path / "be.json"
    path.write_text(json.dumps(_begin_end_steps(zero_length_op=False, close_last=False)))
    assert '1 "B" event(s) that no "E" closed ignored' in load(str(path)).meta.notes


def test_bytes_after_a_gzip_stream_are_refused_unless_zero_padding(tmp_path: Path):
    # A gzip with a second plain trace appended was read without a word (gzip -d warns, Python's gzip refuses).
    packed = Path(sample("bf16_causal_fwd/naive")).read_bytes()
    appended = tmp_path / "appended.json.gz"
    appended.write_bytes(packed + b'{"traceEvents": []}')
    with pytest.raises(TraceError, match="19 bytes after the gzip stream that are not gzip"):
        load(str(appended))
    padded = tmp_path / "padded.json.gz"
    padded.write_bytes(packed + b"\0" * 512)  # tape-block padding: read as gzip -d reads it
    assert load(str(padded)).ops.height == load(sample("bf16_causal_fwd/naive")).ops.height


@pytest.mark.parametrize("pieces", [False, True])
def test_events_without_a_time_are_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pieces: bool):
    # 18 kernels without "ts" were left out without a word ("kernels 0").
    doc = _repeated(_naive_doc(), 4) if pieces else _naive_doc()
    if pieces:
        cut_into_pieces_of(monkeypatch, 16 << 10)
    kernels = 0
    for event in doc["traceEvents"]:
        if event.get("cat") == "kernel":
            event.pop("ts")
            kernels += 1
    path = tmp_path / "nots.json"
    path.write_text(json.dumps(doc))
    assert f'{kernels} event(s) without a time ("ts") ignored' in load(str(path)).meta.notes


def test_a_gpu_process_named_by_text_is_its_device(tmp_path: Path):
    # GPU events with pid "GPU 0" and no args.device: the whole-trace figures read no device (GPU busy 0 ms,
    # devices []) while the steps counted their time.
    doc = _naive_doc()
    for event in doc["traceEvents"]:
        if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"):
            event["pid"] = "GPU 0"
            event.get("args", {}).pop("device", None)
    path = tmp_path / "textpid.json"
    path.write_text(json.dumps(doc))
    trace, original = load(str(path)), load(sample("bf16_causal_fwd/naive"))
    assert trace.devices == original.devices == [0]
    assert trace.step_table["gpu_busy_us"].to_list() == original.step_table["gpu_busy_us"].to_list()


def test_malformed_and_unphased_events_give_the_same_notes_whole_and_in_pieces(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch):
    # Each count put its note last when it grew: in pieces the order followed what the last piece held.
    doc = _repeated(_naive_doc(), 4)
    doc["traceEvents"].insert(0, {"name": "noph", "ts": 1})
    doc["traceEvents"] += [{"ph": "X", "name": "bad", "ts": "x", "dur": 1}] * 2
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(doc))
    whole = load(str(path)).meta.notes
    cut_into_pieces_of(monkeypatch, 16 << 10)
    assert load(str(path)).meta.notes == whole


def test_zero_padding_between_gzip_members_goes_on_to_the_next(tmp_path: Path):
    # A member, zero padding, a second member is gzip (Python's gzip reads both): it was refused.
    packed = Path(sample("bf16_causal_fwd/naive")).read_bytes()
    text = gzip.decompress(packed)
    middle = len(text) // 2
    path = tmp_path / "members.json.gz"
    path.write_bytes(gzip.compress(text[:middle]) + b"\0" * 512 + gzip.compress(text[middle:]))
    assert load(str(path)).ops.height == load(sample("bf16_causal_fwd/naive")).ops.height
