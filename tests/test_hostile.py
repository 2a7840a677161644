"""Hostile and broken inputs through the command line: every one gets a report or a one-line error with
exit 2, never a traceback; the other inputs of the run are still analysed."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import sample

from attntrace.cli import main

NAIVE = sample("bf16_causal_fwd/naive")
GOOD_EVENT = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0, "dur": 2.0,
              "args": {"correlation": 1}}


def lint(*args: str, input: bytes | None = None):
    result = CliRunner().invoke(main, ["lint", "--format", "json", *args], input=input)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result


# Runs the CLI in a fresh process and reports that process's own peak memory (KiB) on its last stderr line (at
# exit: the CLI leaves without the interpreter's teardown, running the atexit functions).
# The peak of this process's own memory (VmHWM, in KiB): ru_maxrss would also count the pytest process it was
# forked from, since Linux keeps the high-water mark across exec.
PEAK_RUNNER = ("import atexit, runpy, sys\n"
               "def peak():\n"
               "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
               "    print('peak', hwm.split()[1], file=sys.stderr)\n"
               "atexit.register(peak)\n"
               "sys.argv = ['attntrace', *sys.argv[1:]]\n"
               "runpy.run_module('attntrace', run_name='__main__')\n")


def run_measured(*args: str) -> tuple[int, str, float]:
    """(exit code, stderr without the peak line, peak MiB) of `attntrace ARGS` in a child process."""
    done = subprocess.run([sys.executable, "-c", PEAK_RUNNER, *args], capture_output=True, text=True)
    lines = done.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("peak "), done.stderr
    return done.returncode, "\n".join(lines[:-1]), int(lines[-1].split()[1]) / 1024


def trace_bytes() -> bytes:
    return gzip.decompress(Path(NAIVE).read_bytes())


def doc(events) -> bytes:
    return json.dumps({"traceEvents": events}).encode()


# name -> (file content, expected exit code, text in the error or None)
BAD_INPUTS = {
    "empty": (b"", 2, "file is empty"),
    "whitespace": (b" \n\t ", 2, "file is empty"),
    "bom only": (b"\xef\xbb\xbf", 2, "file is empty"),
    "bom then trace": (b"\xef\xbb\xbf" + doc([GOOD_EVENT]), 0, None),
    "non-utf8 bytes": (b'{"traceEvents": [{"name": "\xff\xfe"}]}', 2, "not valid JSON"),
    "cut at 10%": (trace_bytes()[: len(trace_bytes()) // 10], 2, "JSON is cut off"),
    "cut at 50%": (trace_bytes()[: len(trace_bytes()) // 2], 2, "JSON is cut off"),
    "cut at 99%": (trace_bytes()[:-20], 2, "JSON is cut off"),
    "not json": (b"this is not json", 2, "not a JSON object or list"),
    "number": (b"42", 2, "not a JSON object or list"),
    "string": (b'"trace"', 2, "not a JSON object or list"),
    "object without traceEvents": (b'{"schemaVersion": 1}', 2, "without traceEvents"),
    "execution trace (ET)": (b'{"schema": "1.0.3-chakra", "pid": 1, "nodes": []}', 2, "execution trace"),
    "memory snapshot": (b'{"segments": [], "device_traces": []}', 2, "memory snapshot"),
    "traceEvents not a list": (b'{"traceEvents": {"a": 1}}', 2, "not a list"),
    "events of wrong types": (doc(["x", None, 3, [1], GOOD_EVENT]), 0, None),
    "missing ts/dur/name/cat": (doc([{"ph": "X"}, {"ph": "X", "ts": 1}, {"cat": "kernel", "ts": 2}, GOOD_EVENT]),
                                0, None),
    "negative, NaN and string durations": (
        b'{"traceEvents": [{"ph":"X","cat":"kernel","name":"a","pid":0,"tid":1,"ts":1,"dur":-4},'
        b'{"ph":"X","cat":"kernel","name":"b","pid":0,"tid":1,"ts":2,"dur":NaN},'
        b'{"ph":"X","cat":"kernel","name":"c","pid":0,"tid":1,"ts":3,"dur":"5"}]}', 0, None),
    "string pids": (doc([{**GOOD_EVENT, "pid": "Spans", "tid": "stream 7"}]), 0, None),
    "duplicate events": (doc([GOOD_EVENT] * 50), 0, None),
    "kernels without launches": (doc([{**GOOD_EVENT, "args": {"correlation": i}} for i in range(20)]), 0, None),
    "launches without kernels": (doc([{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                                       "tid": 1, "ts": float(i), "dur": 5.0, "args": {"correlation": i}}
                                      for i in range(50)]), 0, None),
    "unknown categories": (doc([{**GOOD_EVENT, "cat": "mtia_kernel"}, {**GOOD_EVENT, "cat": "¿?"}]), 0, None),
    "enormous args": (doc([{**GOOD_EVENT, "args": {"correlation": 1, "blob": "x" * 5_000_000,
                                                   "Input Dims": [[1] * 10_000]}}]), 0, None),
    "deeply nested": (b'{"traceEvents": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}", 2, "JSON nested too deeply"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input(tmp_path: Path, name: str):
    data, code, message = BAD_INPUTS[name]
    path = tmp_path / "input.json"
    path.write_bytes(data)
    result = lint(str(path), NAIVE, "--fail-on", "never")
    assert result.exit_code == code, result.stderr
    report = orjson.loads(result.stdout)
    assert [t["path"] for t in report["traces"]] == [str(path), NAIVE]
    assert report["traces"][1]["error"] is None  # the good trace beside it is still analysed
    if code == 2:
        assert result.stderr.count("\n") == 1 and str(path) in result.stderr
        assert message in report["traces"][0]["error"]["message"]


def test_gzip_garbage_and_cut_gzip(tmp_path: Path):
    junk = tmp_path / "junk.json.gz"
    junk.write_bytes(gzip.compress(b"\x00\x01garbage" * 1000))
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(Path(NAIVE).read_bytes()[:3000])
    bad_header = tmp_path / "bad.json.gz"
    bad_header.write_bytes(b"\x1f\x8b\x08" + os.urandom(200))
    result = lint(str(junk), str(cut), str(bad_header))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3
    assert "does not hold JSON" in lines[0] and "cut off" in lines[1] and "gzip" in lines[2]


def _bomb(path: Path, gib: int, head: bytes = b"") -> None:
    """A gzip bomb from a 1 KB member repeated: `gib` GiB of zeros (or of spaces after `head`)."""
    filler = b" " if head else b"\0"
    member = gzip.compress(filler * 2**20, compresslevel=9)
    with path.open("wb") as fh:
        fh.write(gzip.compress(head))
        for _ in range(gib * 1024):
            fh.write(member)


def test_gzip_bomb_of_zeros_is_refused_at_once(tmp_path: Path):
    bomb = tmp_path / "bomb.json.gz"
    _bomb(bomb, 2)
    start = time.perf_counter()
    result = lint(str(bomb))
    assert result.exit_code == 2 and "does not hold JSON" in result.stderr
    assert time.perf_counter() - start < 30  # generous: it stops after the first 16 MiB chunk


def test_gzip_bomb_that_looks_like_json_stops_at_the_limit(tmp_path: Path):
    bomb = tmp_path / "bomb.json.gz"
    _bomb(bomb, 2, head=b'{"traceEvents": [')
    code, stderr, peak_mib = run_measured("lint", str(bomb), "--max-size", "256M")
    assert code == 2
    assert "expands past the limit of 268435456 bytes (--max-size)" in stderr
    assert 0 < peak_mib < 1024  # never near the 2 GiB it would expand to


def test_paths(tmp_path: Path):
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "good.json").write_bytes(doc([GOOD_EVENT]))
    (folder / "dangling.json").symlink_to(tmp_path / "nowhere.json")
    (folder / "loop").symlink_to(folder)  # a directory symlink loop is not followed
    (tmp_path / "a.json").symlink_to(tmp_path / "b.json")
    (tmp_path / "b.json").symlink_to(tmp_path / "a.json")
    result = lint(str(folder), str(tmp_path / "a.json"), "--fail-on", "never")
    assert result.exit_code == 2
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 2 and "dangling.json" in errors[0] and "symbolic links" in errors[1]
    assert orjson.loads(result.stdout)["summary"]["traces"] == 3

    assert "file is empty" in lint("-", input=b"").stderr
    result = CliRunner().invoke(main, ["lint", NAIVE, "--output", str(tmp_path / "no" / "such" / "dir.json")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "cannot write" in result.stderr
    result = CliRunner().invoke(main, ["lint", str(tmp_path / "missing.json")])
    assert result.exit_code == 2 and "no such file" in result.stderr


def test_salvage_is_opt_in_and_says_so(tmp_path: Path):
    data = trace_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: int(len(data) * 0.6)])
    assert lint(str(cut)).exit_code == 2
    result = lint(str(cut), "--salvage", "--fail-on", "never")
    assert result.exit_code == 0
    trace = orjson.loads(result.stdout)["traces"][0]
    assert trace["incomplete"] is True and trace["error"] is None
    assert any("incomplete trace" in n for n in trace["summary"]["notes"])
    text = CliRunner().invoke(main, ["lint", str(cut), "--salvage"]).stdout
    assert "incomplete trace" in text

    cut_gz = tmp_path / "cut.json.gz"
    cut_gz.write_bytes(Path(NAIVE).read_bytes()[:4000])
    trace = orjson.loads(lint(str(cut_gz), "--salvage", "--fail-on", "never").stdout)["traces"][0]
    assert trace["incomplete"] is True and trace["events"] > 0


def test_output_is_deterministic_and_input_untouched(tmp_path: Path):
    path = tmp_path / "t.pt.trace.json.gz"
    path.write_bytes(Path(NAIVE).read_bytes())
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    outs = {lint(str(path), "--jobs", str(j)).stdout for j in (1, 2)}
    assert len(outs) == 1
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
