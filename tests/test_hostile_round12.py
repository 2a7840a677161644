"""Hostile inputs, round 12 (issue 43, reliability). Each test failed before its fix."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT, sample

from attntrace.cli import main


def test_the_command_that_unpacks_a_file_never_names_a_file_that_is_there(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    # `xz -dc a.json.xz > a.json` was offered where a.json is the unpacked trace linted beside it: run as given,
    # the shell empties it first.
    monkeypatch.chdir(tmp_path)
    trace = gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes())
    Path("a.json").write_bytes(trace)
    Path("a.json.xz").write_bytes(lzma.compress(trace))
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", "--format", "json", "a.json.xz", "a.json"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == ["error: a.json.xz: xz-compressed data, not a trace (attntrace reads JSON "
                                          "and gzip): xz -dc a.json.xz > a.unpacked.json"]
    Path("a.unpacked.json").write_bytes(b"")
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", "a.json.xz"])
    assert result.stderr.rstrip().endswith("xz -dc a.json.xz > a.unpacked.1.json")
    assert Path("a.json").read_bytes() == trace


@pytest.mark.parametrize("inside", [b".", b"e", b"e-", b"-"])
@pytest.mark.parametrize("gzipped", [False, True])
def test_a_file_cut_inside_a_number_is_cut_off_and_salvaged(tmp_path: Path, inside: bytes, gzipped: bool):
    # msgspec says "invalid number" rather than "truncated" when the data ends inside a number: a file cut after
    # `"dur": 11.` was "not valid JSON", and --salvage refused it.
    from attntrace import api

    trace = gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes())
    middle = trace.index(b'"dur": ', len(trace) // 2) + len(b'"dur": ')
    cut = trace[:middle] + b"11" + inside
    path = tmp_path / ("cut.json.gz" if gzipped else "cut.json")
    path.write_bytes(gzip.compress(cut) if gzipped else cut)
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", str(path)])
    assert result.exit_code == 2
    assert "JSON is cut off" in result.stderr and "--salvage analyses the complete events" in result.stderr
    salvaged = api.lint([path], salvage=True, fail_on="never").traces[0]
    assert salvaged.ok and salvaged.incomplete and salvaged.events > 100


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_of_a_killed_parent_remove_the_copies_they_were_writing(tmp_path: Path):
    # A worker ended by its parent's death with SIGKILL left its half-written --annotate copy (.tmp) beside the
    # outputs, at every kill.
    from test_hostile_round9 import _descendants, _running

    doc = json.loads(gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes()))
    text = json.dumps({**doc, "traceEvents": doc["traceEvents"] * 60})
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    for i in range(4):
        (inputs / f"rank{i}.json").write_text(text)
    proc = subprocess.Popen([sys.executable, "-m", "attntrace", "lint", "--jobs", "2", "--annotate", str(out),
                             str(inputs)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            if out.is_dir() and any(p.name.endswith(".tmp") for p in out.rglob("*")):
                break
            time.sleep(0.005)
        assert proc.poll() is None, "the run ended before any copy was being written"
        children = _descendants(proc.pid)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(map(_running, children)):
            time.sleep(0.1)
        assert not [pid for pid in children if _running(pid)]
        assert not [p.name for p in out.rglob("*") if p.name.endswith(".tmp")]
    finally:
        proc.kill()
        for pid in _descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)


def test_a_file_is_known_by_what_it_is_not_by_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # `L/../t.json` through a linked folder L is real/t.json, another file: it was dropped as a duplicate of t.json,
    # with no word. A link to t.json, which is t.json, was analysed and reported twice.
    from attntrace import api

    monkeypatch.chdir(tmp_path)
    trace = gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes())
    Path("t.json").write_bytes(trace)
    Path("real/sub").mkdir(parents=True)
    Path("real/t.json").write_bytes(trace)
    Path("L").symlink_to("real/sub")
    Path("link.json").symlink_to("t.json")
    report = api.lint(["t.json", "L/../t.json", "link.json", "./t.json"], fail_on="never")
    assert [t.path for t in report.traces] == ["t.json", "L/../t.json"]
    assert all(t.ok for t in report.traces)


def _gated_diff(folder: Path, base_doc: dict, new_doc: dict) -> dict:
    """`diff BASE NEW --fail-over 5` of two documents: its step comparison, after checking that it passed the gate
    with no verdict."""
    base, new = folder / "base.json", folder / "new.json"
    base.write_text(json.dumps(base_doc))
    new.write_text(json.dumps(new_doc))
    result = CliRunner().invoke(main, ["diff", str(base), str(new), "--fail-over", "5", "--format", "json"])
    assert result.exit_code == 0, result.output
    comparison, = json.loads(result.stdout)["comparisons"]
    assert not comparison["regression"] and comparison["step"]["confidence_slower"] is None
    return comparison["step"]


def test_diff_gives_no_verdict_between_one_gpu_and_two(tmp_path: Path):
    # A trace against the same trace on two GPUs (its kernels run again on a second device) was a REGRESSION with
    # --fail-over, exit 1, and nothing said that the number of GPUs differed.
    doc = json.loads(gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes()))
    two = json.loads(json.dumps(doc))
    for event in doc["traceEvents"]:
        if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            copy = json.loads(json.dumps(event))
            copy["pid"], copy["args"]["device"] = 1, 1
            copy["dur"] = 3 * copy["dur"]
            two["traceEvents"].append(copy)
    two["deviceProperties"] = [doc["deviceProperties"][0], {**doc["deviceProperties"][0], "id": 1}]
    step = _gated_diff(tmp_path, doc, two)
    assert step["not_compared"] == ("not compared: the number of GPUs differs (1 -> 2); to judge the code, capture "
                                    "both on the same GPUs")


_UNGUARDED_SCRIPT = """
import json, sys
from attntrace import api
report = api.lint(sys.argv[1:], jobs=2, fail_on="never")
print(json.dumps([t.error for t in report.traces]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux's")
def test_a_script_that_lints_at_its_top_level_gets_its_workers(tmp_path: Path):
    # Without `if __name__ == "__main__":`, each worker ran the script's call again while multiprocessing imported
    # the script in it: every worker died, every trace was "out of memory (the worker was killed)", with 16 lines of
    # multiprocessing's message per worker and a /tmp/pymp-* folder left by each.
    script = tmp_path / "lint_all.py"
    script.write_text(_UNGUARDED_SCRIPT)
    traces = [sample("bf16_causal_fwd/naive"), sample("bf16_causal_fwd/sdpa_math"), sample("bf16_causal_fwd/naive")]
    copies = []
    for i, path in enumerate(traces):
        copies.append(tmp_path / f"rank{i}.pt.trace.json.gz")
        copies[-1].write_bytes(Path(path).read_bytes())
    done = subprocess.run([sys.executable, str(script), *map(str, copies)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [None, None, None]
    assert done.stderr == ""


def test_diff_gives_no_verdict_on_a_trace_whose_gpu_events_have_no_duration(tmp_path: Path):
    # Kernels of 1e15 us are read as 0 (a note says so): the trace's steps then held its CPU time alone, and against
    # the same trace intact that was a REGRESSION of +620% (exit 1 under --fail-over).
    doc = json.loads(gzip.decompress(Path(sample("workloads/low_occupancy_kernel")).read_bytes()))
    absurd = json.loads(json.dumps(doc))
    for event in absurd["traceEvents"]:
        if event.get("cat") == "kernel":
            event["dur"] = 1e15
    step = _gated_diff(tmp_path, absurd, doc)
    assert step["not_compared"].startswith("not compared: the base trace's 7 GPU event(s) have no duration (read as 0")


def test_a_toml_integer_too_long_for_python_is_the_config_s_one_line_error(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    # tomllib raises a plain ValueError for an integer past Python's 4,300 digits: a 53-line traceback, exit 1,
    # from any tool's table of the pyproject.toml found beside the run.
    monkeypatch.chdir(tmp_path)
    Path("pyproject.toml").write_text(f"[tool.other]\nv = {'9' * 4301}\n")
    result = CliRunner().invoke(main, ["lint", sample("bf16_causal_fwd/naive")])
    assert result.exit_code == 2
    line, = result.stderr.splitlines()
    assert line.startswith(f"error: {tmp_path / 'pyproject.toml'}: not valid TOML (Exceeds the limit (4300 digits)")


def test_a_config_list_names_the_element_that_is_wrong(tmp_path: Path):
    config = tmp_path / "attntrace.toml"
    config.write_text("select = ['AT1', 2]\n")
    result = CliRunner().invoke(main, ["lint", "--config", str(config), sample("bf16_causal_fwd/naive")])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {config}: 'select' must be a list of rule ids, names or prefixes, "
                                          "not a list holding the number 2"]


def test_the_api_checks_what_the_command_line_checks(tmp_path: Path):
    # Each was accepted, or failed far from its cause: a NaN speed-up gave a saving larger than infinity's, a mapping
    # of settings was "internal error ... please report it" blamed on the trace, a bytes path was iterated as
    # numbers, max_size=-5 made every trace unreadable, group="zzz" passed, select=[101] was an AttributeError.
    from attntrace import api

    trace = sample("bf16_causal_fwd/naive")
    with pytest.raises(ValueError, match="must be a finite number of 1 or more"):
        api.whatif(trace, speedup={"gemm_tensor_core": float("nan")})
    assert api.whatif(trace, settings={"AT101.min_bytes": 1})["devices"]
    assert api.summarize(trace.encode()).steps == api.summarize(trace).steps
    assert [t.ok for t in api.lint(trace.encode(), fail_on="never").traces] == [True]
    with pytest.raises(ValueError, match="max_size must be a number of bytes above 0"):
        api.lint(trace, max_size=-5)
    with pytest.raises(ValueError, match="group must be one of auto, ranks, none"):
        api.lint(trace, group="zzz")
    with pytest.raises(TypeError, match="jobs must be a whole number"):
        api.lint(trace, jobs="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rules are named by text"):
        api.lint(trace, select=[101])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"a path must be str, bytes or os\.PathLike, not int"):
        api.lint([3])  # type: ignore[list-item]
    # No path at all passed a CI script's empty glob with nothing linted, and an empty config path was ignored.
    with pytest.raises(ValueError, match="no paths given"):
        api.lint([])
    from attntrace.checks.config import ConfigError

    with pytest.raises(ConfigError, match="config: an empty path"):
        api.lint(trace, config="")


def test_markdown_makes_no_link_or_image_of_a_name_in_the_trace(tmp_path: Path):
    # `[click](http://...)` and `![x](http://...)` in an op name were a live link and a remote image in the pull-
    # request comment, outside any code span.
    from test_hostile_round6 import copies_renamed

    path = copies_renamed(tmp_path, " [click](http://evil.example) ![x](http://evil.example/p.png) `tick")
    result = CliRunner().invoke(main, ["lint", path, "--format", "markdown", "--fail-on", "never"])
    assert result.exit_code == 0
    assert "](http://evil.example" in result.stdout  # the name is there, in code spans and escaped text ...
    outside_code = [part for line in result.stdout.splitlines() for part in line.split("`")[::2]]
    assert not [part for part in outside_code if "[click](" in part or "![x](" in part]  # ... and links nowhere


def test_the_html_page_escapes_control_characters_as_the_text_report_does(tmp_path: Path):
    # An escape sequence, a NUL and a right-to-left override (which turns the text after it around) from a kernel or
    # file name went into the page as they were; every other format escaped them.
    from conftest import need
    from test_hostile_round6 import copies_renamed

    need("plotly", "html")
    path = copies_renamed(tmp_path, "\x1b[31mRED\r\u202eRLO\x00nul", device=" \x1b[1m")
    result = CliRunner().invoke(main, ["lint", path, "--format", "html", "--fail-on", "never"])
    assert result.exit_code == 0
    assert not {"\x1b", "\r", "\u202e", "\x00"} & set(result.stdout)
    assert "\\x1b[31mRED" in result.stdout


def test_correlation_ids_past_64_bits_are_named_not_passed_over(tmp_path: Path):
    # Ids of 2**63 and more fit no 64-bit integer: every launch was unlinked in silence, the gate passed (exit 0
    # where the trace as captured exits 1), and AT501 was skipped for "no kernel launch calls" in a trace of 15.
    from attntrace import api

    doc = json.loads(gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes()))
    for event in doc["traceEvents"]:
        args = event.get("args") or {}
        if "correlation" in args:
            args["correlation"] += 2**63
        if event.get("cat") == "ac2g":
            event["id"] += 2**63
    path = tmp_path / "ids.pt.trace.json"
    path.write_text(json.dumps(doc))
    report = api.lint([path], fail_on="never").to_dict()
    notes = report["traces"][0]["summary"]["notes"]
    assert "15 kernel launch call(s) without a usable correlation id (none, or not a 64-bit integer): the GPU work " \
           "they queued is not linked to them" in notes
    assert {s["rule"]: s["reason"] for s in report["skipped"]}["AT501"] == (
        "no kernel launch call is linked to its GPU work (their correlation ids are unusable)")
    intact = api.lint([sample("bf16_causal_fwd/naive")], fail_on="never").to_dict()
    assert not [n for n in intact["traces"][0]["summary"]["notes"] if "correlation id" in n]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named FIFOs are POSIX's")
def test_an_output_fifo_without_a_reader_is_refused_after_a_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # `-o fifo` with no reader hung for ever, with no word; a FIFO given as input is refused after a wait.
    from attntrace.formats import output

    monkeypatch.setattr(output, "FIFO_WAIT_S", 0.3)
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", sample("bf16_causal_fwd/naive"), "--format", "json",
                                       "-o", str(fifo)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {fifo}: cannot write output (FIFO with no reader (waited 0.3 s))"]
    # With a reader, the report goes through as before.
    import threading

    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", sample("bf16_causal_fwd/naive"), "--format", "json",
                                       "--fail-on", "never", "-o", str(fifo)])
    reader.join(60)
    assert result.exit_code == 0 and json.loads(received[0])["summary"]["traces"] == 1
