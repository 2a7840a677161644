"""Hostile inputs, round 5 (a probe of generated cases): what broke the contract, each from a real trace where
the case allows it. Each test failed on the code before its fix, but one: a pipe given as a side file is still read
(the fix bounds what such a file may be)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from conftest import sample

from attntrace.cli import main
from attntrace.model.loading import load

NAIVE, MATH, GOOD = sample("bf16_causal_fwd/naive"), sample("bf16_causal_fwd/sdpa_math"), sample("bf16_causal_fwd/sdpa")


def lint_json(*paths: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(main, ["lint", "--format", "json", "-j1", "--fail-on", "never", *paths])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, orjson.loads(result.stdout), result.stderr


def refused_side_file(option: str, given: str) -> str:
    """lint NAIVE with a side file that must be refused: exit 2 and one line on stderr, which is returned."""
    result = CliRunner().invoke(main, ["lint", "--format", "json", option, given, NAIVE])
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert given in line
    return line


def _with_inputs(source: str, tmp_path: Path, key: str, change: Any) -> str:
    document = json.loads(gzip.decompress(Path(source).read_bytes()))
    changed = 0
    for event in document["traceEvents"]:
        args = event.get("args")
        if isinstance(args, dict) and key in args:
            args[key] = change(args[key])
            changed += 1
    assert changed
    path = tmp_path / f"{key.replace(' ', '_')}.json"
    path.write_text(json.dumps(document))
    return str(path)


@pytest.mark.parametrize(("source", "dims"), [(NAIVE, [2**70, 2**70]), (MATH, [2**70, 2**70]), (NAIVE, [2**62] * 6)])
def test_shapes_past_64_bits_leave_the_json_report_whole(tmp_path: Path, source: str, dims: list[int]):
    # A size past 64 bits (in a shape, or multiplied out of shapes by AT102/AT202) reached a finding, and the JSON
    # report could not be written: a traceback, nothing on stdout, the good trace beside it lost.
    path = _with_inputs(source, tmp_path, "Input Dims", lambda shapes: [dims for _ in shapes])
    code, report, stderr = lint_json(path, GOOD)
    assert code == 0 and "Traceback" not in stderr
    assert [t["error"] for t in report["traces"]] == [None, None]


def test_an_input_type_that_is_not_text_is_an_unknown_type(tmp_path: Path):
    # A list where a type name goes: rules look type names up, and the trace was an internal error (unhashable).
    path = _with_inputs(NAIVE, tmp_path, "Input type", lambda types: [["c10::BFloat16"], *types[1:]])
    code, report, stderr = lint_json(path, GOOD)
    assert code == 0 and "internal error" not in stderr
    assert [t["error"] for t in report["traces"]] == [None, None]


def test_a_quoted_recursive_pattern_does_not_follow_links_to_directories(tmp_path: Path):
    # A link to "." under the pattern's folder: glob.glob's `**` followed it until the OS refused, and read the
    # same trace once per path (t, a/t, a/a/t, ...: 8 s); two links branched into 2^40 paths, a hang.
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(NAIVE, folder / "t.pt.trace.json.gz")
    os.symlink(".", folder / "a")
    code, report, _ = lint_json(f"{folder}/**/*.json.gz", GOOD)
    assert code == 0
    assert [t["path"] for t in report["traces"]] == [str(folder / "t.pt.trace.json.gz"), GOOD]


@pytest.mark.parametrize("world_size", [2**62, 2**21, 0, -4, True])
def test_a_world_size_no_job_has_is_unknown(tmp_path: Path, world_size: Any):
    # Two rank traces of world size 2**62: the job summary listed its ranks without a trace one by one and took
    # all the machine's memory (killed by the OOM killer, nothing reported).
    document = json.loads(gzip.decompress(Path(NAIVE).read_bytes()))
    paths = []
    for rank in (0, 1):
        document["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
        paths.append(tmp_path / f"rank{rank}.json")
        paths[-1].write_text(json.dumps(document))
    code, report, _ = lint_json(*map(str, paths))
    assert code == 0 and [t["error"] for t in report["traces"]] == [None, None]
    assert report["job"]["world_size"] is None and report["job"]["ranks_without_trace"] == []


def test_a_text_pid_beside_python_stacks_is_compared_as_text(tmp_path: Path):
    # Kineto writes pid "Spans" for some events: the ops table's pid became text while the Python events' stayed
    # integers, and looking up an op's Python frames compared the two: an internal error, the trace lost.
    document = json.loads(gzip.decompress(Path(sample("bf16_causal_fwd_stack/naive")).read_bytes()))
    assert any(e.get("cat") == "python_function" for e in document["traceEvents"])
    first_op = next(e for e in document["traceEvents"] if e.get("cat") == "cpu_op")
    first_op["pid"] = "Spans"
    path = tmp_path / "spans_pid.json"
    path.write_text(json.dumps(document))
    code, report, stderr = lint_json(str(path), GOOD)
    assert code == 0 and "internal error" not in stderr
    assert [t["error"] for t in report["traces"]] == [None, None]


@pytest.mark.parametrize("option", ["--baseline", "--config", "--measured"])
def test_a_side_file_that_never_ends_or_never_comes_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 option: str):
    # /dev/zero given as a baseline, settings or measured results was read whole: 23 GB and the OOM killer. A FIFO
    # with no writer blocked in open() for ever. Both are now refused in one line, like a trace input.
    from attntrace.read import buffers

    monkeypatch.setattr(buffers, "FIFO_WAIT_S", 0.2)
    fifo = tmp_path / "side.fifo"
    os.mkfifo(fifo)
    for given, reason in (("/dev/zero", "not a file or a pipe"), (str(fifo), "FIFO with no writer")):
        assert reason in refused_side_file(option, given)


def test_a_side_file_past_its_limit_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from attntrace.read import buffers

    monkeypatch.setattr(buffers, "SIDE_FILE_MAX_BYTES", 4 << 20)
    big = tmp_path / "baseline.json"
    big.write_bytes(b" " * (6 << 20))
    assert "larger than 4 MiB" in refused_side_file("--baseline", str(big))


def test_a_side_file_through_process_substitution_is_read(tmp_path: Path):
    # A pipe (`--baseline <(git show main:baseline.json)`) is a file the user may give: read to its end.
    baseline = tmp_path / "baseline.json"
    assert CliRunner().invoke(main, ["lint", NAIVE, "--write-baseline", str(baseline)]).exit_code in (0, 1)
    read_end, write_end = os.pipe()
    os.write(write_end, baseline.read_bytes())
    os.close(write_end)
    try:
        result = CliRunner().invoke(main, ["lint", "--format", "json", "--baseline", f"/dev/fd/{read_end}", NAIVE])
    finally:
        os.close(read_end)
    assert result.exit_code == 0, result.stderr
    assert [f["baseline"] for f in orjson.loads(result.stdout)["findings"]] == ["known"]


@pytest.mark.parametrize("entry", ["fast", 3, [1], {"best": "sdpa"}, {"saved_us_per_step": "lots"},
                                   {"saved_us_per_step": [1]}, {"saved_us_per_step": True},
                                   {"saved_us_per_step": 5.0, "best": 7}])
def test_a_measured_saving_that_is_not_one_is_one_line(tmp_path: Path, entry: Any):
    # An entry of a --measured file matching a finding's fingerprint but not an object with a number
    # saved_us_per_step: a traceback outside the per-trace guard, exit 1, nothing on stdout.
    (finding,) = [f for f in lint_json(NAIVE)[1]["findings"] if f["rule"] == "AT102"]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"kind": "attntrace-from-trace", "schema_version": 1,
                                "findings": {finding["fingerprint"]: entry}}))
    assert "not a measured saving" in refused_side_file("--measured", str(path))


def test_a_settings_file_nested_too_deeply_is_one_line(tmp_path: Path):
    # tomllib parses nested arrays recursively: 5,000 deep raised RecursionError, a traceback and exit 1.
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested too deeply" in refused_side_file("--config", str(deep))


@pytest.mark.parametrize("option", ["--output", "--write-baseline"])
def test_an_output_never_replaces_a_trace_whose_name_is_not_utf8(tmp_path: Path, option: str):
    # A trace named with a byte that is not UTF-8 is reported with a \xNN escape, which names no file: the guard
    # against writing over an input missed it, and `lint DIR -o DIR/<that name>` replaced the trace with the report.
    folder = os.fsencode(tmp_path / "traces")
    os.mkdir(folder)
    victim = folder + b"/bad\xffname.json"
    Path(os.fsdecode(victim)).write_bytes(gzip.decompress(Path(NAIVE).read_bytes()))
    before = Path(os.fsdecode(victim)).read_bytes()
    result = CliRunner().invoke(main, ["lint", "--format", "json", "--fail-on", "never", option, os.fsdecode(victim),
                                       os.fsdecode(folder)])
    assert result.exit_code == 2 and "one of the inputs" in result.stderr
    assert Path(os.fsdecode(victim)).read_bytes() == before


def test_a_broken_trace_in_a_directory_is_reported_not_passed_over(tmp_path: Path):
    # A directory scan passes over JSON that is not a trace (run.json beside the traces). Traces that cannot be
    # read were classed with it and vanished: '1 trace(s), 0 unreadable', exit 0, CI green.
    document = json.loads(gzip.decompress(Path(NAIVE).read_bytes()))
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "events_null.pt.trace.json").write_text(json.dumps({**document, "traceEvents": None}))
    deep = json.loads(json.dumps(document))
    deep["traceEvents"][0]["args"] = {"x": "PLACEHOLDER"}
    (folder / "deep_args.pt.trace.json").write_text(
        json.dumps(deep).replace('"PLACEHOLDER"', "[" * 10_000 + "]" * 10_000))
    (folder / "run.json").write_text(json.dumps({"kind": "not a trace"}))
    shutil.copy(NAIVE, folder / "naive.pt.trace.json.gz")
    code, report, _ = lint_json(str(folder))
    errors = {Path(t["path"]).name: t["error"] for t in report["traces"]}
    assert errors["naive.pt.trace.json.gz"] is None and "run.json" not in errors
    assert errors["events_null.pt.trace.json"]["kind"] == "bad-trace"
    assert "nested too deeply" in errors["deep_args.pt.trace.json"]["message"]
    assert code == 2


def test_a_trace_whose_events_have_no_phase_is_refused_as_the_list_form_is(tmp_path: Path):
    # An object trace whose events all lack "ph" read as an empty CPU-only trace with no word; the same events as
    # a bare list were refused. Some events without a phase get a note.
    document = json.loads(gzip.decompress(Path(NAIVE).read_bytes()))
    for event in document["traceEvents"]:
        event.pop("ph", None)
    path = tmp_path / "no_ph.json"
    path.write_text(json.dumps(document))
    _, report, _ = lint_json(str(path), GOOD)
    assert [t["error"] and t["error"]["kind"] for t in report["traces"]] == ["bad-trace", None]
    document = json.loads(gzip.decompress(Path(NAIVE).read_bytes()))
    document["traceEvents"][0].pop("ph")
    path.write_text(json.dumps(document))
    assert any("without a phase" in note for note in load(str(path)).meta.notes)


def test_a_file_url_gets_the_guards_of_a_local_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # file:// was read through fsspec: a FIFO without a writer blocked for ever (the good trace beside it lost),
    # and /dev/zero was read up to all free memory before anything looked at it.
    pytest.importorskip("fsspec")
    from attntrace.read import buffers

    monkeypatch.setattr(buffers, "FIFO_WAIT_S", 0.2)
    fifo = tmp_path / "wait.json"
    os.mkfifo(fifo)
    code, report, _ = lint_json(fifo.as_uri(), "file:///dev/zero", GOOD)
    assert code == 2
    kinds = [t["error"] and t["error"]["message"] for t in report["traces"]]
    assert "FIFO with no writer" in kinds[0] and "not a JSON object" in kinds[1] and kinds[2] is None


def test_a_web_server_that_never_answers_is_one_line(monkeypatch: pytest.MonkeyPatch):
    # fsspec's HTTP backend had no read timeout: a server that accepts and says nothing hung the run.
    pytest.importorskip("aiohttp")
    import socket
    import threading

    from attntrace.read import sources

    monkeypatch.setattr(sources, "HTTP_TIMEOUT_S", 0.5)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: [held.append(server.accept()[0]) for _ in range(8)], daemon=True).start()
    try:
        code, report, _ = lint_json(f"http://127.0.0.1:{server.getsockname()[1]}/t.json", GOOD)
    finally:
        server.close()
        for connection in held:
            connection.close()
    assert code == 2
    assert "did not answer within 0.5 s" in report["traces"][0]["error"]["message"]
    assert report["traces"][1]["error"] is None


def test_a_rank_in_a_file_name_past_64_bits_is_no_rank(tmp_path: Path):
    # rank99999999999999999999.pt.trace.json beside rank1: grouped as one job, the JSON report could not hold the
    # rank (traceback, nothing on stdout, both traces lost).
    for name in ("rank99999999999999999999.pt.trace.json", "rank1.pt.trace.json"):
        (tmp_path / name).write_bytes(gzip.decompress(Path(NAIVE).read_bytes()))
    code, report, stderr = lint_json(str(tmp_path))
    assert code == 0 and "Traceback" not in stderr
    assert [t["error"] for t in report["traces"]] == [None, None]


@pytest.mark.parametrize("codec", ["utf-16", "utf-32"])
def test_a_utf16_trace_is_annotated_as_it_is_read(tmp_path: Path, codec: str):
    # The reader reads UTF-16 and UTF-32 traces; --annotate looked for the event list in UTF-8 bytes and refused
    # the trace ('no traceEvents list to annotate'), dropping its findings from the report.
    path = tmp_path / "utf16.json"
    path.write_bytes(gzip.decompress(Path(NAIVE).read_bytes()).decode().encode(codec))
    annotated = tmp_path / "annotated.json"
    result = CliRunner().invoke(main, ["lint", "--format", "json", "--fail-on", "never", "--annotate",
                                       str(annotated), str(path)])
    assert result.exit_code == 0, result.stderr
    findings = orjson.loads(result.stdout)["findings"]
    assert findings and len(orjson.loads(annotated.read_bytes())["traceEvents"]) > len(
        orjson.loads(gzip.decompress(Path(NAIVE).read_bytes()))["traceEvents"])
