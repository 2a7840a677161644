"""Large traces are decoded in pieces; the model and the report must not depend on where the cuts fall."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest
from conftest import sample

from attntrace import read
from attntrace.checks.catalog import load_rules
from attntrace.model.loading import load
from attntrace.read import decoding, workers
from attntrace.report import engine as lint


def cut_into_pieces_of(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """Pieces of `size` bytes: the decoder cuts a larger trace at that size."""
    monkeypatch.setattr(decoding, "CHUNK_BYTES", size)


def report(path: str) -> bytes:
    return orjson.dumps(lint.assemble([lint.lint_trace(load(path), lint.default_settings(load_rules()))]))


@pytest.mark.parametrize("name", ["workloads/gpt2_eager_train", "bf16_causal_fwd_stack/naive"])
def test_pieces_give_the_same_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str):
    path = tmp_path / "t.pt.trace.json"
    path.write_bytes(gzip.decompress(Path(sample(name)).read_bytes()))
    whole = report(str(path))
    cut_into_pieces_of(monkeypatch, 16 << 10)
    raw = read.read(str(path))
    assert raw.chunks is not None and len(list(raw.event_chunks())) > 5
    assert report(str(path)) == whole
    assert path.read_bytes() == gzip.decompress(Path(sample(name)).read_bytes())  # the file is untouched


@pytest.mark.parametrize("name", ["workloads/gpt2_eager_train", "bf16_causal_fwd_stack/naive"])
def test_compact_layout_is_cut_into_pieces_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str):
    # PyTorch's compact layout has no whitespace between events ("},{"): it must be cut like Kineto's.
    path = tmp_path / "t.pt.trace.json"
    path.write_bytes(orjson.dumps(orjson.loads(gzip.decompress(Path(sample(name)).read_bytes()))))
    assert b"},{" in path.read_bytes() and b"}, {" not in path.read_bytes()
    whole = report(str(path))
    cut_into_pieces_of(monkeypatch, 16 << 10)
    assert len(list(read.read(str(path)).event_chunks())) > 5
    assert report(str(path)) == whole


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_compact_cut_inside_a_string_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: str):
    monkeypatch.setenv("ATTNTRACE_READ_WORKERS", workers)
    odd = {"ph": "X", "cat": "cpu_op", "name": "odd},{" * 400, "pid": 1, "tid": 1, "ts": 5.0, "dur": 1.0}
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": float(i), "dur": 0.5,
               "args": {"correlation": i}} for i in range(3000)]
    path = tmp_path / "t.json"
    path.write_bytes(orjson.dumps({"traceEvents": [*events[:1500], odd, *events[1500:]], "traceName": "x"}))
    cut_into_pieces_of(monkeypatch, 1 << 10)
    trace = load(str(path))
    assert trace.ops["name"].to_list() == [odd["name"]]
    assert trace.gpu["name"].to_list() == [f"k{i}" for i in range(3000)]


def test_pieces_decoded_in_worker_processes_give_the_same_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):

    path = tmp_path / "t.pt.trace.json"
    path.write_bytes(orjson.dumps(orjson.loads(gzip.decompress(Path(sample("workloads/gpt2_eager_train"))
                                                               .read_bytes()))))
    cut_into_pieces_of(monkeypatch, 256 << 10)
    here = load(str(path))
    whole = report(str(path))
    monkeypatch.setenv(workers.WORKERS_ENV, "2")
    assert workers.read_workers(len(read.read(str(path)).pieces)) == 2
    there = load(str(path))
    for kind in ("ops", "launches", "gpu", "flows", "gpu_annotations", "python"):
        assert getattr(there, kind).equals(getattr(here, kind)), kind
    assert [bytes(a.input_dims) for a in there.op_args[:]] == [bytes(a.input_dims) for a in here.op_args[:]]
    assert report(str(path)) == whole


def test_a_cut_inside_an_event_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # An arg holding a list of objects has "},\\n {" inside an event: a cut there must not lose events.
    odd = {"ph": "X", "cat": "cpu_op", "name": "odd", "pid": 1, "tid": 1, "ts": 5.0, "dur": 1.0,
           "args": {"blob": [{"a": i} for i in range(2000)]}}
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": float(i), "dur": 0.5,
               "args": {"correlation": i}} for i in range(3000)]
    text = json.dumps({"schemaVersion": 1, "traceEvents": [*events[:1500], odd, *events[1500:]],
                       "traceName": "x"}, indent=1).encode()
    path = tmp_path / "t.json"
    path.write_bytes(text)
    cut_into_pieces_of(monkeypatch, 1 << 10)
    trace = load(str(path))
    assert trace.gpu.height == 3000 and trace.ops["name"].to_list() == ["odd"]
    assert trace.gpu["name"].to_list() == [f"k{i}" for i in range(3000)]


def test_malformed_events_in_a_piece_are_dropped_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": float(i), "dur": 1.0}
              for i in range(2000)]
    events[1700] = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": {"bad": 1}}
    path = tmp_path / "t.json"
    path.write_bytes(json.dumps({"traceEvents": events}, indent=1).encode())
    cut_into_pieces_of(monkeypatch, 1 << 10)
    trace = load(str(path))
    assert trace.gpu.height == 1999 and trace.meta.dropped_events == 1
    assert trace.meta.notes == ["1 malformed events ignored"]


def test_broken_json_inside_a_later_piece_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from click.testing import CliRunner

    from attntrace.cli import main

    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": float(i), "dur": 1.0}
              for i in range(2000)]
    text = json.dumps({"traceEvents": events, "traceName": "x"}, indent=1).encode()
    broken = text.replace(b'"ts": 1500.0', b'"ts": @@', 1)
    assert broken != text
    path = tmp_path / "t.json"
    path.write_bytes(broken)
    cut_into_pieces_of(monkeypatch, 1 << 10)
    result = CliRunner().invoke(main, ["lint", str(path)])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "not valid JSON" in result.stderr and "internal error" not in result.stderr


@pytest.mark.parametrize(("change", "outcome"), [
    (b'"name": "k1500x"', b'"name": "k\xff\xfe"'),  # invalid UTF-8 inside a string
    (b'"ts": 1500.0, "dur": 1.0', b'"ts": 1500.0, "dur": 1e400'),  # beyond a float: a missing value
    (b'"ts": 1500.0, "dur": 1.0', b'"ts": 1500.0, "dur": ' + b"9" * 5000),  # 5000 digits
])
def test_a_problem_inside_a_piece_reads_as_in_a_small_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            change: bytes, outcome: bytes):
    # The pieces do not parse, the outline does: the trace is decoded again as one document, which gives the
    # small file's answer (an error naming the problem, or the value read as missing), never "internal error".
    from click.testing import CliRunner

    from attntrace.cli import main

    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}x", "pid": 0, "tid": 7, "ts": float(i), "dur": 1.0}
              for i in range(2000)]
    text = json.dumps({"traceEvents": events}).encode()
    assert change in text
    results = []
    for size in (1 << 10, 64 << 20):  # in pieces, and whole
        path = tmp_path / f"t{size}.json"
        path.write_bytes(text.replace(change, outcome, 1))
        cut_into_pieces_of(monkeypatch, size)
        result = CliRunner().invoke(main, ["lint", str(path), "--format", "json"])
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        assert "internal error" not in result.stderr
        results.append((result.exit_code, result.stderr.replace(str(path), "T")))
    assert results[0] == results[1]


def _tables_of(path: str) -> dict[str, object]:
    trace = load(path)
    return {kind: getattr(trace, kind) for kind in ("ops", "launches", "gpu", "flows", "gpu_annotations", "python")}


@pytest.mark.parametrize("layout", ["compact", "indented"])
def test_cuts_never_land_in_the_lists_after_the_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       layout: str):
    # deviceProperties (a list of objects, so full of "},{") after the events, as Kineto writes it when the
    # metadata comes last: no piece may be taken from it, and it must still be read as the document's.
    doc = orjson.loads(gzip.decompress(Path(sample("workloads/gpt2_eager_train")).read_bytes()))
    devices = [{"id": i, "name": f"GPU {i}", "totalGlobalMem": 1 << 30, "computeMajor": 9, "computeMinor": 0,
                "maxThreadsPerBlock": 1024, "numSms": 132, "regsPerBlock": 65536, "sharedMemPerBlock": 49152}
               for i in range(400)]
    events = doc.pop("traceEvents")
    doc.pop("deviceProperties", None)
    path = tmp_path / "t.pt.trace.json"
    option = orjson.OPT_INDENT_2 if layout == "indented" else 0
    path.write_bytes(orjson.dumps({**doc, "traceEvents": events, "deviceProperties": devices}, option=option))
    whole = report(str(path))
    for size in (4 << 10, 16 << 10, 64 << 10):
        cut_into_pieces_of(monkeypatch, size)
        raw = read.read(str(path))
        assert raw.pieces is not None and len(raw.pieces) > 3
        assert [d["name"] for d in raw.document.deviceProperties] == [f"GPU {i}" for i in range(400)]
        assert report(str(path)) == whole


def _plain_and_packed(folder: Path) -> tuple[bytes, Path, Path]:
    """The GPT-2 sample in PyTorch's compact layout, written plain and gzipped."""
    text = orjson.dumps(orjson.loads(gzip.decompress(Path(sample("workloads/gpt2_eager_train")).read_bytes())))
    plain, packed = folder / "t.pt.trace.json", folder / "t.pt.trace.json.gz"
    plain.write_bytes(text)
    packed.write_bytes(gzip.compress(text))
    return text, plain, packed


def test_workers_read_their_piece_from_the_file_only_when_it_holds_the_bytes(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    from attntrace.model import tables

    _, plain, packed = _plain_and_packed(tmp_path)
    cut_into_pieces_of(monkeypatch, 256 << 10)
    monkeypatch.setenv(workers.WORKERS_ENV, "1")
    alone = _tables_of(str(plain))
    assert read.read(str(plain)).pieces.source.path == str(plain)
    assert read.read(str(packed)).pieces.source is None  # gunzipped: the file does not hold these bytes
    monkeypatch.setenv(workers.WORKERS_ENV, "3")
    for path in (plain, packed):
        raw = read.read(str(path))
        assert tables._split_parallel(raw, raw.take_pieces(), 3) is not None  # no fallback to one process
        for kind, table in _tables_of(str(path)).items():
            assert table.equals(alone[kind]), (path.name, kind)


def test_a_large_file_is_copied_left_unchanged_and_read_as_its_bytes(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch):
    # Not mapped: a mapped file cut short while read ended the process with SIGBUS (test_hostile_round9).
    text, plain, packed = _plain_and_packed(tmp_path)
    cut_into_pieces_of(monkeypatch, 64 << 10)
    monkeypatch.setenv(workers.WORKERS_ENV, "1")
    assert isinstance(read.read(str(plain)).pieces.data, bytearray)
    assert isinstance(read.read(str(packed)).pieces.data, bytearray)
    mapped, in_memory = _tables_of(str(plain)), _tables_of(str(packed))
    for kind, table in mapped.items():
        assert table.equals(in_memory[kind]), kind
    assert report(str(plain)) == report(str(packed)).replace(packed.name.encode(), plain.name.encode())
    assert plain.read_bytes() == text  # the brackets written around each piece stayed in this process


def test_step_markers_in_any_host_category_are_ops_in_file_order(tmp_path: Path):
    # Older and other writers put ProfilerStep#N in a category of their own: the markers are still ops, among
    # the others in file order, and they still make the steps.
    events = []
    for step in range(3):
        t = step * 1000.0
        events += [{"ph": "X", "cat": "Trace", "name": f"ProfilerStep#{step + 1}", "pid": 1, "tid": 1, "ts": t,
                    "dur": 900.0},
                   {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 10, "dur": 50.0},
                   {"ph": "X", "cat": "Trace", "name": "not a step", "pid": 1, "tid": 1, "ts": t + 100, "dur": 5.0}]
    path = tmp_path / "t.json"
    path.write_bytes(orjson.dumps({"traceEvents": events}))
    trace = load(str(path))
    assert trace.ops["name"].to_list() == ["ProfilerStep#1", "aten::mm", "ProfilerStep#2", "aten::mm",
                                           "ProfilerStep#3", "aten::mm"]
    assert trace.step_count == 3
