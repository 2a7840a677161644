"""Hostile inputs, round 6 (a probe of the CLI's options and output formats): what broke the contract, each test
failing on the code before its fix. Inputs are the sample traces, changed where the case needs it."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from conftest import sample

from attntrace.cli import main

NAIVE, MATH = sample("bf16_causal_fwd/naive"), sample("bf16_causal_fwd/sdpa_math")
STACK_NAIVE = sample("bf16_causal_fwd_stack/naive")


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def one_line_error(result: Any) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    return line


def changed(source: str, tmp_path: Path, name: str, change: Any) -> str:
    document = json.loads(gzip.decompress(Path(source).read_bytes()))
    change(document)
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return str(path)


def copies_renamed(tmp_path: Path, suffix: str, device: str = "") -> str:
    """The naive sample with `suffix` after each aten::copy_'s name and `device` after its device's."""
    def rename(document: dict[str, Any]) -> None:
        document["deviceProperties"][0]["name"] += device
        for event in document["traceEvents"]:
            if event.get("name") == "aten::copy_":
                event["name"] += suffix

    return changed(NAIVE, tmp_path, "hostile.json", rename)


@pytest.mark.parametrize("option", ["--baseline", "--config", "--measured", "pyproject"])
def test_annotate_never_replaces_a_file_the_run_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str):
    # --annotate compared its target with the traces only: given the baseline's (or config's, or the nearest
    # pyproject.toml's) name, it replaced that file with the annotated trace, exit 0.
    monkeypatch.chdir(tmp_path)
    trace = shutil.copy(NAIVE, tmp_path / "t.pt.trace.json.gz")
    if option == "--baseline":
        assert run("lint", str(trace), "--write-baseline", "side.json", "--fail-on", "never").exit_code == 0
        args = ["--baseline", "side.json"]
    elif option == "--config":
        Path("side.json").write_text('[tool.attntrace]\nfail-on = "never"\n')
        args = ["--config", "side.json"]
    elif option == "--measured":
        Path("side.json").write_text('{"kind": "attntrace-from-trace", "schema_version": 1, "findings": {}}')
        args = ["--measured", "side.json"]
    else:
        Path("pyproject.toml").write_text('[tool.attntrace]\nfail-on = "never"\n')
        args = []
    side = "pyproject.toml" if option == "pyproject" else "side.json"
    before = Path(side).read_bytes()
    line = one_line_error(run("lint", str(trace), *args, "--annotate", side, "-o", os.devnull))
    assert "overwrite" in line and side in line
    assert Path(side).read_bytes() == before


def test_diff_never_replaces_a_trace_only_one_directory_holds(tmp_path: Path):
    # The traces of one side only were read (a broken one fails the run) but not kept from -o: the report
    # replaced the trace, exit 0.
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        shutil.copy(NAIVE, tmp_path / side / "naive.pt.trace.json.gz")
    only = Path(shutil.copy(MATH, tmp_path / "b" / "only_new.pt.trace.json.gz"))
    before = only.read_bytes()
    line = one_line_error(run("diff", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(only)))
    assert "one of the inputs" in line
    assert only.read_bytes() == before


def test_a_diff_of_directories_without_traces_fails_instead_of_passing_the_gate(tmp_path: Path):
    # Two empty directories, or a directory against an empty one, compared nothing and passed --fail-over, exit 0.
    for name in ("a", "empty1", "empty2"):
        (tmp_path / name).mkdir()
    shutil.copy(NAIVE, tmp_path / "a" / "naive.pt.trace.json.gz")
    result = run("diff", str(tmp_path / "empty1"), str(tmp_path / "empty2"), "--fail-over", "5")
    assert result.exit_code == 2 and "no trace files" in result.stderr
    result = run("diff", str(tmp_path / "a"), str(tmp_path / "empty1"), "--fail-over", "5", "--format", "json")
    assert result.exit_code == 2
    assert [p.endswith("no trace files (*.json, *.json.gz) or Nsight Systems exports (*.sqlite) in this directory")
            for p in orjson.loads(result.stdout)["search_errors"]] == [True]


def test_a_path_or_config_key_with_a_newline_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # A ClickException's message was printed as given: a newline in a side file's name, or in a config key, split
    # the error in two (and an escape sequence in a key reached the terminal).
    config = tmp_path / "bad\ncfg.toml"
    config.write_text("x = [")
    assert "bad\\ncfg.toml" in one_line_error(run("lint", NAIVE, "--config", str(config)))
    (tmp_path / "pyproject.toml").write_text('[tool.attntrace]\n"sel\\nect\\u001b]0;title\\u0007" = []\n')
    monkeypatch.chdir(tmp_path)
    line = one_line_error(run("lint", NAIVE))
    assert "sel\\nect\\x1b]0;title\\x07" in line


@pytest.mark.parametrize("option", ["--version", "--help"])
def test_version_and_help_to_a_full_disk_are_one_line(option: str):
    # Written while click parses the arguments, before the command's own handler: a traceback, exit 1.
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "attntrace", option], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == ["error: stdout: No space left on device"]


def test_from_trace_without_cuda_is_one_line_and_makes_no_folder(tmp_path: Path):
    # torch's warning at import (no NumPy) came before the error, and --out was made before the device was asked.
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the run would measure")
    out = tmp_path / "ft"
    line = one_line_error(run("run", "--from-trace", NAIVE, "--out", str(out)))
    assert "sees no CUDA device" in line
    assert not out.exists()


def test_github_annotations_show_control_characters_of_trace_names_escaped(tmp_path: Path):
    # Only file= and title= were escaped: an ESC, a BEL and a right-to-left mark in an op name reached the log.
    path = copies_renamed(tmp_path, "\x1b[31mRED\x1b]0;title\x07\u202e")
    result = run("lint", path, "--format", "github", "--fail-on", "never")
    assert result.exit_code == 0
    assert not {"\x1b", "\x07", "\u202e"} & set(result.stdout)
    assert "\\x1b[31mRED" in result.stdout


def test_markdown_carries_no_html_or_table_breaks_from_the_trace(tmp_path: Path):
    # A device name's `|` added a column, and `<!--` in a name hid the rest of a pull-request comment.
    path = copies_renamed(tmp_path, "<!--<script>x</script>", device=" | <!-- hidden")
    result = run("lint", path, "--format", "markdown", "--fail-on", "never")
    assert result.exit_code == 0
    assert "<!--" not in result.stdout and "<script>" not in result.stdout
    (row,) = [line for line in result.stdout.splitlines() if "hostile.json" in line and "NVIDIA" in line]
    assert "H200 \\| &lt;!-- hidden" in row


@pytest.mark.parametrize("line", ["0", "99999999999999999999"])
def test_sarif_has_no_source_line_that_no_file_has(tmp_path: Path, line: str):
    # A frame named `model.py(0)` gave "startLine": 0, and one past 64 bits 1e+20 (SARIF: an integer from 1).
    def rename(document: dict[str, Any]) -> None:
        for event in document["traceEvents"]:
            if event.get("cat") == "python_function" and "variants.py" in event["name"]:
                event["name"] = f"model.py({line}): " + event["name"].rsplit(": ", 1)[1]

    path = changed(STACK_NAIVE, tmp_path, "with space#1.json", rename)
    result = run("lint", path, "--format", "sarif", "--fail-on", "never")
    assert result.exit_code == 0
    sarif = orjson.loads(result.stdout)
    results = sarif["runs"][0]["results"]
    lines = [loc["physicalLocation"]["region"]["startLine"] for r in results for loc in r["locations"]
             if "region" in loc["physicalLocation"]]
    assert all(isinstance(n, int) and n >= 1 for n in lines)
    uris = {loc["physicalLocation"]["artifactLocation"]["uri"] for r in results for loc in r["locations"]}
    assert any(uri.endswith("with%20space%231.json") for uri in uris)


def test_more_jobs_than_traces_do_not_split_the_memory_among_jobs_never_started():
    # -j 100000 for two traces told each worker it had a 100,000th of the memory: good traces refused, exit 2.
    result = run("lint", NAIVE, MATH, "-j", "100000", "--format", "json", "--fail-on", "never")
    assert result.exit_code == 0, result.stderr
    assert [t["error"] for t in orjson.loads(result.stdout)["traces"]] == [None, None]


@pytest.mark.parametrize("saved", [-5, 1e308])
def test_a_measured_saving_out_of_range_is_refused(tmp_path: Path, saved: float):
    # A negative saving made a warning of "-5 us", and 1e308 a 300-digit one.
    baseline = tmp_path / "bl.json"
    assert run("lint", NAIVE, "--write-baseline", str(baseline), "--fail-on", "never").exit_code == 0
    fingerprint = next(f["fingerprint"] for f in json.loads(baseline.read_text())["findings"] if f["rule"] == "AT102")
    measured = tmp_path / "m.json"
    measured.write_text(json.dumps({"kind": "attntrace-from-trace", "schema_version": 1,
                                    "findings": {fingerprint: {"saved_us_per_step": saved}}}))
    assert "not a measured saving" in one_line_error(run("lint", NAIVE, "--measured", str(measured)))


def test_an_output_name_near_the_length_limit_is_written(tmp_path: Path):
    # The temporary file beside it was named ".<name>.XXXX.tmp": past 255 bytes, "File name too long".
    target = tmp_path / ("r" * 250 + ".json")
    result = run("lint", NAIVE, "--format", "json", "--fail-on", "never", "-o", str(target))
    assert result.exit_code == 0, result.stderr
    assert orjson.loads(target.read_bytes())["traces"][0]["error"] is None


def test_a_baseline_with_a_byte_order_mark_is_read(tmp_path: Path):
    # A trace with a UTF-8 byte order mark was read, a baseline with one was "not an attntrace baseline".
    baseline = tmp_path / "bl.json"
    assert run("lint", NAIVE, "--write-baseline", str(baseline), "--fail-on", "never").exit_code == 0
    baseline.write_bytes(b"\xef\xbb\xbf" + baseline.read_bytes())
    result = run("lint", NAIVE, "--baseline", str(baseline), "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert {f["baseline"] for f in orjson.loads(result.stdout)["findings"]} == {"known"}


# Round 6, trace content.

def _events_changed(source: str, tmp_path: Path, name: str, change: Any) -> str:
    def each(document: dict[str, Any]) -> None:
        for event in document["traceEvents"]:
            change(event)

    return changed(source, tmp_path, name, each)


@pytest.mark.parametrize("pid", ["\u00b2", "9" * 5000])
def test_a_pid_of_odd_digits_is_no_internal_error(tmp_path: Path, pid: str):
    # "²" passes str.isdigit and 5,000 digits pass it too; int() refuses both: an internal error, the trace lost.
    cpu = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"}

    def repid(event: dict[str, Any]) -> None:
        if event.get("cat") in cpu:
            event["pid"] = pid

    _, report, stderr = lint_json(_events_changed(NAIVE, tmp_path, "pid.json", repid), MATH)
    assert "internal error" not in stderr
    assert [t["error"] for t in report["traces"]] == [None, None]


def test_a_python_frame_line_of_5000_digits_is_no_internal_error(tmp_path: Path):
    def reline(event: dict[str, Any]) -> None:
        if event.get("cat") == "python_function" and "variants.py" in event["name"]:
            event["name"] = "model.py(" + "9" * 5000 + "): " + event["name"].rsplit(": ", 1)[1]

    _, report, stderr = lint_json(_events_changed(STACK_NAIVE, tmp_path, "line.json", reline))
    assert "internal error" not in stderr and report["traces"][0]["error"] is None


def test_an_arg_first_seen_past_a_rules_first_rows_is_no_internal_error(tmp_path: Path):
    # AT201 built a frame from its GEMM rows, and polars guessed each column's type from the first 100: a `bytes`
    # arg on the 951st FP32 GEMM kernel (and on no earlier one) failed the whole trace.
    document = json.loads(gzip.decompress(Path(sample("calibration/mlp_item_sync.plain")).read_bytes()))
    fp32 = [e for e in document["traceEvents"] if e.get("cat") == "kernel" and "ffma" in e.get("name", "")]
    assert len(fp32) > 100
    fp32[-1]["args"]["bytes"] = 1
    path = tmp_path / "bytes.json"
    path.write_text(json.dumps(document))
    _, report, stderr = lint_json(str(path))
    assert "internal error" not in stderr and report["traces"][0]["error"] is None
    assert "AT201" in {f["rule"] for f in report["findings"]}


@pytest.mark.parametrize(("field", "value", "odd"), [
    ("record_shapes", True, None), ("cupti_version", "13.0.1", "cupti_version"),
    ("distributedInfo", ["rank", 1], "distributedInfo"), ("deviceProperties", {"name": "x"}, "deviceProperties")])
def test_an_odd_header_field_is_ignored_alone(tmp_path: Path, field: str, value: Any, odd: str | None):
    # One header field of a type the typed decode did not expect failed it: the whole document went through
    # Python objects (4x the memory on a large trace) and every header field was dropped without a word, the
    # device's properties and the rank with it.
    def set_field(document: dict[str, Any]) -> None:
        document[field] = value
        if field != "distributedInfo":
            document["distributedInfo"] = {"backend": "nccl", "rank": 1, "world_size": 2}

    path = changed(NAIVE, tmp_path, "header.json", set_field)
    result = run("summary", path, "--format", "json")
    assert result.exit_code == 0, result.stderr
    (trace,) = orjson.loads(result.stdout)["traces"]
    notes = [n for n in trace["notes"] if "header field" in n]
    assert notes == ([] if odd is None else [f"header field(s) of a type Kineto does not write ignored: {odd}"])
    if field != "deviceProperties":
        assert trace["device"] == "NVIDIA H200"
    assert trace["rank"] == (None if field == "distributedInfo" else 1)
    if field == "record_shapes":
        assert trace["profiler"]["settings"] == {**trace["profiler"]["settings"], "record_shapes": True,
                                                 "source": "header"}


def test_steps_numbered_against_time_replay_in_time_order(tmp_path: Path):
    # Markers numbered 9, 5, 1 in time: the replay went through them by number, and the profiler's cost of a step
    # came out negative (-117 us) and one step's estimate three times the others.
    markers = iter((9, 5, 1))
    document = json.loads(gzip.decompress(Path(NAIVE).read_bytes()))
    cpu_steps = sorted((e for e in document["traceEvents"] if e.get("cat") == "user_annotation"
                        and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    for event in cpu_steps:
        event["name"] = f"ProfilerStep#{next(markers)}"
    path = tmp_path / "reversed.json"
    path.write_text(json.dumps(document))
    result = run("summary", str(path), "--format", "json")
    (trace,) = orjson.loads(result.stdout)["traces"]
    good = orjson.loads(run("summary", NAIVE, "--format", "json").stdout)["traces"][0]
    assert trace["profiler"]["cpu_us_per_step"] > 0
    assert trace["profiler"]["est_step_us"] == pytest.approx(good["profiler"]["est_step_us"], rel=0.05)


def lint_json(*paths: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(main, ["lint", "--format", "json", "-j1", "--fail-on", "never", *paths])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, orjson.loads(result.stdout), result.stderr


def test_repeated_step_numbers_are_said(tmp_path: Path):
    # Every marker named ProfilerStep#2: one step holding all the work, and nothing said (a diff against the
    # same program read +200%).
    def renumber(event: dict[str, Any]) -> None:
        if str(event.get("name", "")).startswith("ProfilerStep#"):
            event["name"] = "ProfilerStep#2"

    result = run("summary", _events_changed(NAIVE, tmp_path, "repeated.json", renumber), "--format", "json")
    (trace,) = orjson.loads(result.stdout)["traces"]
    assert trace["steps"] == 1
    assert "2 ProfilerStep marker(s) repeating a step number of their process ignored" in " ".join(trace["notes"])


def test_a_gpu_event_at_an_absurd_time_is_set_aside(tmp_path: Path):
    # One kernel at ts 1e308: durations that absurd were read as 0 with a note, timestamps were not, and the step
    # it fell in was estimated at 1e308 us.
    document = json.loads(gzip.decompress(Path(NAIVE).read_bytes()))
    kernels = [e for e in document["traceEvents"] if e.get("cat") == "kernel"]
    kernels[-1]["ts"] = 1e308
    path = tmp_path / "stray.json"
    path.write_text(json.dumps(document))
    (trace,) = orjson.loads(run("summary", str(path), "--format", "json").stdout)["traces"]
    good = orjson.loads(run("summary", NAIVE, "--format", "json").stdout)["traces"][0]
    assert trace["profiler"]["est_step_us"] == pytest.approx(good["profiler"]["est_step_us"], rel=0.05)
    assert "1 GPU event(s) more than 1e+11 us from the others ignored" in trace["notes"]


def test_an_aten_op_spanning_the_whole_thread_is_said(tmp_path: Path):
    # One cpu_op (aten::empty) with a broken duration around everything: every op became its implementation and
    # AT102 found nothing, without a word. The finding stays a matter of judgement; the note says why.
    document = json.loads(gzip.decompress(Path(NAIVE).read_bytes()))
    ops = [e for e in document["traceEvents"] if e.get("cat") == "cpu_op"]
    pid, tid = ops[0]["pid"], ops[0]["tid"]
    mine = [e for e in document["traceEvents"] if e.get("pid") == pid and e.get("tid") == tid and "dur" in e]
    first, last = min(e["ts"] for e in mine), max(e["ts"] + e["dur"] for e in mine)
    document["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": pid, "tid": tid,
                                    "ts": first - 1, "dur": last - first + 2, "args": {"External id": 999999}})
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps(document))
    (trace,) = orjson.loads(run("summary", str(path), "--format", "json").stdout)["traces"]
    assert any(n.startswith("aten::empty spans the whole of its thread's recorded time") for n in trace["notes"])
    (good,) = orjson.loads(run("summary", NAIVE, "--format", "json").stdout)["traces"]
    assert not any("spans the whole" in n for n in good["notes"])
