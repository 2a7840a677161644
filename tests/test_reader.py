"""Bad inputs get a one-line reason, never a traceback, and never a wrong model."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import sample

from attntrace.model.loading import guarded, load

NAIVE = sample("bf16_causal_fwd/naive")


def _write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(("data", "kind"), [
    (b"", "empty"), (b"   \n", "empty"), (b"\xef\xbb\xbf", "empty"), (b"\xff\xfe\x00garbage", "not-json"),
    (b'{"traceEvents": [{"ph": "X"', "not-json"), (b"hello", "not-json"), (b"42", "not-json"),
    (b'"text"', "not-json"), (b'{"nodes": [], "schema": "1.0"}', "not-a-trace"),
    (b'{"segments": []}', "not-a-trace"), (b'{"traceEvents": 5}', "bad-trace"),
    # A document that names its events and none can be read is a broken trace (`{"traceEvents": 5}` too).
    (b"[1, 2, 3]", "not-a-trace"), (b'{"traceEvents": [1, "x", null]}', "bad-trace"),
    (b"[]", "empty"), (b'{"traceEvents": []}', "empty"),
])
def test_refused_with_reason(tmp_path, data, kind):
    result = guarded(_write(tmp_path, "t.json", data), load)
    assert result.kind == kind and "\n" not in result.message


def test_bom_and_bare_list_and_odd_events(tmp_path):
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0, "dur": 2.0,
               "args": {"correlation": 1}},
              {"ph": "X", "cat": "kernel", "name": "k", "pid": "0", "tid": 7, "ts": "3.0", "dur": "NaN"},
              None, 4, "x", {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7},
              {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 0.0, "dur": -5,
               "args": {"External id": "not a number"}}]
    path = _write(tmp_path, "t.json", b"\xef\xbb\xbf" + json.dumps(events).encode())
    trace = load(path)
    assert trace.gpu.height == 2  # the string timestamp is coerced; the event without ts is dropped
    assert trace.meta.dropped_events == 3
    assert trace.ops["dur"].to_list() == [0.0]  # negative durations clamp at 0


def test_truncated_and_garbage_gzip(tmp_path):
    data = Path(NAIVE).read_bytes()
    assert guarded(_write(tmp_path, "cut.json.gz", data[: len(data) // 2]), load).kind == "truncated"
    assert guarded(_write(tmp_path, "junk.json.gz", b"\x1f\x8b" + b"junk" * 100), load).kind == "bad-gzip"


def test_input_is_not_modified(tmp_path):
    data = gzip.decompress(Path(NAIVE).read_bytes())
    path = _write(tmp_path, "t.json", data)
    before = sorted(p.name for p in tmp_path.iterdir())
    load(path)
    assert Path(path).read_bytes() == data and sorted(p.name for p in tmp_path.iterdir()) == before
