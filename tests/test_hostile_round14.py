"""Hostile inputs, round 14 (issue 43, reliability). Each test failed before its fix."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from conftest import sample

from attntrace.capture import fromtrace
from attntrace.cli import main
from attntrace.model.loading import load


def _measured(trace: str, tmp_path: Path) -> dict[str, Any]:
    """What `run --from-trace` writes for `trace` (its real plan), with a saving measured for its one site."""
    doc = fromtrace.plan(load(trace), "naive,sdpa")
    (site,) = doc["sites"]
    report = {"environment": {"gpu": "NVIDIA H200"}, "table": [
        {"variant": "naive", "status": "ok", "event_ms": site["gpu_us_per_step"] / 1e3},
        {"variant": "sdpa", "status": "ok", "event_ms": 0.1}]}
    return fromtrace.summarize_measurement(doc, [{"site": site, "report": report}], tmp_path)


def _lint_measured(trace: str, run_json: Path) -> Any:
    return CliRunner().invoke(main, ["lint", trace, "--measured", str(run_json), "--format", "json",
                                     "--fail-on", "never", "--jobs", "1"])


@pytest.mark.parametrize("version", [99, 0, "1", True, None, 1.0])
def test_a_measured_file_of_another_schema_version_is_refused(tmp_path: Path, version: object):
    # schema_version 99 was read as if it were 1: a later layout may mean something else by the same fields.
    trace = sample("bf16_causal_fwd/naive")
    measured = _measured(trace, tmp_path)
    measured["schema_version"] = version
    run_json = tmp_path / "run.json"
    run_json.write_bytes(orjson.dumps(measured))
    result = _lint_measured(trace, run_json)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {run_json}: schema_version {version!r} is not 1, the only one "
                                          "this attntrace reads (run `attntrace run --from-trace` again with this "
                                          "version)"]


def test_a_measured_saving_of_one_rule_is_never_given_to_another_rules_finding(tmp_path: Path):
    # The saving was applied by fingerprint alone: an entry whose rule says AT201 replaced AT102's impact.
    trace = sample("bf16_causal_fwd/naive")
    measured = _measured(trace, tmp_path)
    (fingerprint,) = measured["findings"]
    run_json = tmp_path / "run.json"
    run_json.write_bytes(orjson.dumps(measured))
    finding = next(f for f in orjson.loads(_lint_measured(trace, run_json).stdout)["findings"]
                   if f["fingerprint"] == fingerprint)
    assert finding["rule"] == "AT102" and finding["impact"]["basis"] == "measured"
    measured["findings"][fingerprint]["rule"] = "AT201"
    run_json.write_bytes(orjson.dumps(measured))
    result = _lint_measured(trace, run_json)
    finding = next(f for f in orjson.loads(result.stdout)["findings"] if f["fingerprint"] == fingerprint)
    assert finding["impact"].get("basis") != "measured"
    assert "1 measured finding(s) (AT201) match no finding of these traces" in result.stderr
    del measured["findings"][fingerprint]["rule"]
    run_json.write_bytes(orjson.dumps(measured))
    result = _lint_measured(trace, run_json)
    assert result.exit_code == 2 and "is not a measured saving (an object with a rule name" in result.stderr


def test_a_config_that_sets_fail_on_under_both_spellings_is_an_error(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch):
    # fail-on = "never" with fail_on = "error": one of them was taken, silently, and a CI gate could pass.
    _refused_pyproject(tmp_path, monkeypatch, '[tool.attntrace]\nfail-on = "never"\nfail_on = "error"\n',
                       "'tool.attntrace.fail-on' and 'tool.attntrace.fail_on' are the same setting; keep one")


def _refused_pyproject(folder: Path, monkeypatch: pytest.MonkeyPatch, text: str, problem: str) -> None:
    """lint, run beside a pyproject.toml of `text`, refuses it in one line that ends with `problem`."""
    monkeypatch.chdir(folder)
    Path("pyproject.toml").write_text(text)
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", sample("bf16_causal_fwd/naive")])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {folder / 'pyproject.toml'}: {problem}"]


def test_a_parallel_lint_leaves_the_callers_start_method_and_warning_options_as_it_found_them(tmp_path: Path):
    # After api.lint(jobs=2) the default start method was fixed (a later set_start_method() raised "context has
    # already been set") and sys.warnoptions held the resource tracker's filter, which the caller's own processes
    # then started with.
    script = tmp_path / "script.py"
    script.write_text(f"""
import multiprocessing, sys
from attntrace import api
options = list(sys.warnoptions)
report = api.lint([{sample("bf16_causal_fwd/naive")!r}, {sample("bf16_causal_fwd/sdpa_flash")!r}], jobs=2,
                  fail_on="never")
assert all(trace.ok for trace in report.traces)
assert sys.warnoptions == options, sys.warnoptions
assert multiprocessing.get_start_method(allow_none=True) is None
multiprocessing.set_start_method("spawn")
print("kept")
""")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "kept\n" and result.stderr == ""


@pytest.mark.parametrize("rule", ["AT201", "AT202", "AT203"])
def test_an_assumed_speed_up_below_one_is_refused(rule: str):
    # expected_speedup=0.5 passed ("above 0"): the finding's saving went negative (-5100 us, -99.6% of the step),
    # and 1e-310 made share_of_step null; both broke the report's own schema.
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", sample("bf16_causal_fwd/sdpa_math"), "--set",
                                       f"{rule}.expected_speedup=0.5"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: --set '{rule}.expected_speedup=0.5': {rule}.expected_speedup: "
                                          "'0.5' is out of range (a speed-up: 1 or more)"]
    fine = CliRunner().invoke(main, ["lint", "--jobs", "1", sample("bf16_causal_fwd/sdpa_math"), "--set",
                                     f"{rule}.expected_speedup=1", "--format", "json", "--fail-on", "never"])
    assert fine.exit_code == 0
    assert all(f["impact"]["gpu_us_per_step"] >= 0 for f in orjson.loads(fine.stdout)["findings"])


@pytest.mark.parametrize("factor", ["0.5", "1e-310", "1e-300", "0"])
def test_a_what_if_slowdown_is_refused(factor: str):
    # gemm=1e-310 overflowed the durations, which dropped out: "saves 2.116 ms" for a 1e310x slowdown; 0.5 said
    # "saves 0.000" while the critical path beside it doubled.
    result = CliRunner().invoke(main, ["whatif", sample("bf16_causal_fwd/naive"), "--speedup", f"gemm={factor}"])
    assert result.exit_code == 2
    assert "the factor must be a finite number of 1 or more" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_api_whatif_refuses_what_is_not_a_speed_up():
    from attntrace import api

    trace = sample("bf16_causal_fwd/naive")
    with pytest.raises(ValueError, match=r"of 1 or more \(got an integer past a float's range\)"):
        api.whatif(trace, speedup={"gemm": 10**400})  # was a bare OverflowError
    with pytest.raises(TypeError, match="speedup must be a mapping"):
        api.whatif(trace, speedup="gemm=2")  # type: ignore[arg-type]  # was "class 2, =, e, g, m"


@pytest.mark.parametrize("option", ["--annotate", "--write-baseline", "--config", "--baseline", "--measured",
                                    "--output"])
def test_an_empty_path_option_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str):
    # --annotate "" wrote the annotated copies into the working directory (Path("") is "."), over a file of the
    # user's of the same name; --write-baseline "" wrote nothing and --config "" fell back to pyproject.toml,
    # without a word.
    monkeypatch.chdir(tmp_path)
    Path("sub").mkdir()
    Path("sub/t.json.gz").write_bytes(Path(sample("bf16_causal_fwd/naive")).read_bytes())
    Path("t.json.gz").write_text("my own file")
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", "sub", option, "", "--fail-on", "never"])
    assert result.exit_code == 2
    assert f"Invalid value for '{option}'" in result.stderr and "an empty path (give a file name)" in result.stderr
    assert Path("t.json.gz").read_text() == "my own file"


def test_annotate_into_a_folder_named_with_a_slash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # `--annotate out/` for one trace wrote a file named out: Path() drops the slash.
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", sample("bf16_causal_fwd/naive"), "--annotate", "out/",
                                       "--fail-on", "never"])
    assert result.exit_code == 0, result.stderr
    assert Path("out").is_dir() and [p.name for p in Path("out").iterdir()] == ["naive.pt.trace.json.gz"]


def _cut(tmp_path: Path) -> tuple[Path, Path]:
    """The naive sample, whole and cut at two thirds (read with --salvage)."""
    import gzip

    whole = tmp_path / "full.json"
    whole.write_bytes(gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes()))
    cut = tmp_path / "cut.json"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    return whole, cut


def test_diff_gives_no_verdict_on_a_cut_off_trace_and_calls_nothing_of_it_fixed(tmp_path: Path):
    # `diff full cut --salvage` said "fixed: AT101" and "changed: AT102 1959.7 -> 251.3", artefacts of the cut, and
    # nothing in it said the trace was incomplete.
    whole, cut = _cut(tmp_path)
    result = CliRunner().invoke(main, ["diff", str(whole), str(cut), "--salvage", "--format", "json",
                                       "--fail-over", "5"])
    assert result.exit_code == 0, result.stderr
    (pair,) = orjson.loads(result.stdout)["comparisons"]
    assert pair["incomplete"] == {"base": False, "new": True} and not pair["regression"]
    assert pair["step"]["not_compared"].startswith("not compared: the new trace is incomplete (cut off, read with "
                                                   "--salvage)")
    assert pair["findings"]["fixed"] == [] and pair["findings"]["changed"] == []
    assert [f["rule"] for f in pair["findings"]["not_judged"]] == ["AT101"]
    assert "incomplete (cut off)" in pair["findings"]["not_judged"][0]["reason"]


def test_whatif_and_a_baseline_say_a_cut_off_trace_is_incomplete(tmp_path: Path):
    from attntrace import api

    whole, cut = _cut(tmp_path)
    assert api.whatif(cut, salvage=True)["incomplete"] is True and api.whatif(whole)["incomplete"] is False
    text = CliRunner().invoke(main, ["whatif", str(cut), "--salvage"]).stdout
    assert "incomplete trace (cut off, read with --salvage)" in text
    # The baseline of the whole trace, applied to the cut one: AT101 is missing from the cut, not fixed.
    baseline = tmp_path / "baseline.json"
    first, named = tmp_path / "a" / "run" / "full.json", tmp_path / "b" / "run" / "full.json"
    for path, data in ((first, whole.read_bytes()), (named, cut.read_bytes())):  # one label: run/full
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
    CliRunner().invoke(main, ["lint", "--jobs", "1", str(first), "--write-baseline", str(baseline),
                              "--fail-on", "never"])
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", str(named), "--salvage", "--baseline", str(baseline),
                                       "--format", "json", "--fail-on", "never"])
    report = orjson.loads(result.stdout)
    assert report["baseline"]["fixed"] == []
    assert [e["rule"] for e in report["baseline"]["not_judged"]] == ["AT101"]
    markdown = CliRunner().invoke(main, ["lint", "--jobs", "1", str(named), "--salvage", "--baseline", str(baseline),
                                         "--format", "markdown", "--fail-on", "never"]).stdout
    assert "Not judged (the trace is incomplete): 1\n- AT101 in " in markdown


def test_diff_gives_no_verdict_between_two_profilers(tmp_path: Path):
    # An Nsight Systems export against a Kineto trace was a REGRESSION (exit 1 under --fail-over): each tool costs
    # the program differently.
    from nsys_build import FP32_GEMM, Export, Kernel

    kernels, ranges = [], []
    for step in range(5):
        t = 3000.0 * step
        kernels.append(Kernel(FP32_GEMM, t + 40.0, 600.0, registers=64, block=128, grid=264, launch_at_us=t + 30.0))
        ranges += [(f"ProfilerStep#{step + 1}", t, t + 700.0),
                   (f"aten::mm, seq = {step}, op_id = {step}, sizes = [[512, 1024], [1024, 1024]]", t + 20.0,
                    t + 40.0)]
    export = Export(kernels=kernels, ranges=ranges).write(tmp_path / "run.sqlite")
    result = CliRunner().invoke(main, ["diff", str(export), sample("bf16_causal_fwd/naive"), "--fail-over", "5",
                                       "--format", "json"])
    assert result.exit_code == 0, result.stdout
    (pair,) = orjson.loads(result.stdout)["comparisons"]
    assert pair["profilers"] == {"base": "nsys", "new": "torch.profiler"} and not pair["regression"]
    assert "different profilers (nsys -> torch.profiler)" in pair["step"]["not_compared"]


def test_sarif_artifacts_are_named_by_the_same_uri_as_the_results(tmp_path: Path):
    # The artifact's uri was the raw path ("my trace #1.json.gz": a reader takes "#1.json.gz" for a fragment) while
    # the results used the encoded one.
    trace = tmp_path / "my trace #1.json.gz"
    trace.write_bytes(Path(sample("bf16_causal_fwd/naive")).read_bytes())
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", str(trace), "--format", "sarif", "--fail-on", "never"])
    (run,) = orjson.loads(result.stdout)["runs"]
    (artifact,) = run["artifacts"]
    assert "#" not in artifact["location"]["uri"] and " " not in artifact["location"]["uri"]
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]} == {
        artifact["location"]["uri"]}


def test_a_config_with_two_tables_for_one_rule_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # [rules.AT102] severity = "error" and [rules.materialized-scores] severity = "info": the last one won, silently.
    _refused_pyproject(tmp_path, monkeypatch, '[tool.attntrace.rules.AT102]\nseverity = "error"\n'
                       '[tool.attntrace.rules.materialized-scores]\nseverity = "info"\n',
                       "rules.AT102 and rules.materialized-scores are the same rule (AT102); keep one table")


def test_a_settings_file_keeps_its_top_level_beside_other_tools_tables(tmp_path: Path):
    # fail-on = "never" at the top of a --config file was ignored as soon as the file held any [tool.*] table: the
    # run exited 1 on its warnings.
    config = tmp_path / "settings.toml"
    config.write_text('fail-on = "never"\n[tool.other]\nx = 1\n')
    trace = sample("bf16_causal_fwd/naive")
    assert CliRunner().invoke(main, ["lint", "--jobs", "1", trace, "--config", str(config)]).exit_code == 0
    config.write_text('fail-on = "never"\n[tool.attntrace]\nfail-on = "error"\n')
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", trace, "--config", str(config)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {config}: settings both at the top level and in "
                                          "[tool.attntrace]; keep one place"]


def test_the_api_refuses_wrong_arguments_with_its_own_errors(tmp_path: Path):
    # Each was a raw Python message (not iterable, "not 65"), an AttributeError, an exception that was neither a
    # ValueError nor exported, accepted (jobs=0), or a bytes path turned into the text "b'...'".
    import attntrace
    from attntrace import api

    trace = sample("bf16_causal_fwd/naive")
    cases: list[tuple[Any, type[Exception], str]] = [
        (lambda: api.lint(None), TypeError, "paths must be a path or paths"),  # type: ignore[arg-type]
        (lambda: api.lint(trace, select=5), TypeError, "rules are selected by text"),  # type: ignore[arg-type]
        (lambda: api.lint(trace, select=b"AT1"), TypeError, "not bytes"),  # type: ignore[arg-type]
        (lambda: api.lint(trace, settings=[1]), TypeError, "settings must map"),  # type: ignore[arg-type]
        (lambda: api.lint(trace, settings={5: 1}), TypeError, "settings keys are"),
        (lambda: api.lint(trace, jobs=0), ValueError, "jobs must be 1 or more"),
        (lambda: api.lint(trace).at_or_above("x"), ValueError, "severity must be one of"),
        (lambda: attntrace.on_trace_ready(tmp_path, select=["AT999"]), attntrace.ConfigError, "unknown rule"),
    ]
    for call, kind, words in cases:
        with pytest.raises(kind, match=words):
            call()
    with pytest.raises(ValueError, match="fail-on must be one of"):  # a ConfigError is a ValueError
        api.lint(trace, fail_on="WARN")
    baseline = tmp_path / "bl.json"
    CliRunner().invoke(main, ["lint", "--jobs", "1", trace, "--write-baseline", str(baseline), "--fail-on", "never"])
    assert api.lint(trace, baseline=os.fsencode(baseline)).to_dict()["baseline"]["known"] == 1


def test_a_measured_saving_larger_than_the_step_is_not_applied(tmp_path: Path):
    # 8.6e10 us saved on a 2.3 ms step was applied: "~86000000 ms ... (3773560065.8% of step)".
    trace = sample("bf16_causal_fwd/naive")
    measured = _measured(trace, tmp_path)
    (fingerprint,) = measured["findings"]
    measured["findings"][fingerprint]["saved_us_per_step"] = 8.6e10
    run_json = tmp_path / "run.json"
    run_json.write_bytes(orjson.dumps(measured))
    result = _lint_measured(trace, run_json)
    finding = next(f for f in orjson.loads(result.stdout)["findings"] if f["fingerprint"] == fingerprint)
    assert finding["impact"].get("basis") != "measured" and finding["impact"]["share_of_step"] <= 1
    assert "1 measured saving(s) (AT102) larger than the whole step of the trace not applied" in result.stderr


def test_diff_takes_the_configs_profiler_costs_and_refuses_a_gate_that_cannot_fire(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch):
    # diff ignored [tool.attntrace.profiler_cost]: its step without the profiler was not the one summary and lint
    # report in the same folder. --fail-over inf was accepted, and shown as no gate.
    from attntrace import api

    trace = str(Path(sample("bf16_causal_fwd/naive")).parents[1] / "workloads/launch_bound_tiny_ops.pt.trace.json.gz")
    monkeypatch.chdir(tmp_path)
    Path("pyproject.toml").write_text("[tool.attntrace.profiler_cost]\ncpu_op_us = 50.0\nruntime_call_us = 50.0\n")
    summary = CliRunner().invoke(main, ["summary", trace, "--format", "json"])
    summarized = orjson.loads(summary.stdout)["traces"][0]["profiler"]["est_step_us"]
    pair = orjson.loads(CliRunner().invoke(main, ["diff", trace, trace, "--format", "json"]).stdout)["comparisons"][0]
    assert pair["step"]["base_median"] == pytest.approx(summarized, rel=1e-3)
    assert pair["step"]["base_median"] != pytest.approx(api.summarize(trace).data["profiler"]["est_step_us"], rel=1e-3)
    for gate in ("inf", "1e309"):
        result = CliRunner().invoke(main, ["diff", trace, trace, "--fail-over", gate])
        assert result.exit_code == 2 and "must be a finite number" in result.stderr


def test_a_baseline_is_not_written_when_an_input_could_not_be_read(tmp_path: Path):
    # The baseline of the readable inputs was written: the unreadable one's findings would all be new next time.
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    baseline = tmp_path / "baseline.json"
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", sample("bf16_causal_fwd/naive"), str(bad),
                                       "--write-baseline", str(baseline), "--fail-on", "never"])
    assert result.exit_code == 2 and not baseline.exists()
    assert (f"error: --write-baseline {baseline}: not written, 1 input(s) could not be read (fix or leave them out, "
            "then write it again)") in result.stderr.splitlines()


def test_a_baseline_entry_of_null_is_named_null_not_missing(tmp_path: Path):
    baseline = tmp_path / "baseline.json"
    baseline.write_text('{"attntrace_baseline": 1, "findings": [{"fingerprint": "ab12", "rule": null}]}')
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", sample("bf16_causal_fwd/naive"), "--baseline",
                                       str(baseline)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {baseline}: baseline entry 1: 'rule' must be a string, not null"]


@pytest.mark.parametrize("table", ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"])
def test_an_nsys_export_whose_rows_have_no_start_is_read_without_them(tmp_path: Path, table: str):
    # Every kernel (or runtime call) with start = NULL ended in "internal error (TypeError: '<' not supported between
    # instances of 'NoneType' and 'float'); please report it".
    import sqlite3

    from nsys_build import FP32_GEMM, Export, Kernel

    kernels = [Kernel(FP32_GEMM, 3000.0 * step + 40.0, 600.0, registers=64, block=128, grid=264,
                      launch_at_us=3000.0 * step + 30.0) for step in range(4)]
    ranges = [(f"ProfilerStep#{step + 1}", 3000.0 * step, 3000.0 * step + 700.0) for step in range(4)]
    export = Export(kernels=kernels, ranges=ranges).write(tmp_path / "run.sqlite")
    with sqlite3.connect(export) as connection:  # the real exports' tables allow it (the corpus's healthy_1pct)
        connection.executescript(f"CREATE TABLE loose AS SELECT * FROM {table}; DROP TABLE {table}; "
                                 f"ALTER TABLE loose RENAME TO {table}; UPDATE {table} SET start = NULL;")
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", str(export), "--format", "json", "--fail-on", "never"])
    assert result.exit_code == 0, result.stderr
    (trace,) = orjson.loads(result.stdout)["traces"]
    assert "4 row(s) without a start or an end ignored" in trace["summary"]["notes"]


def test_a_file_whose_first_bytes_are_no_json_is_refused_without_being_read_whole(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    # A 4 GiB sparse file of zeros took 20 s and 4.25 GB of memory to be refused; its first bytes already said it.
    from attntrace.read import buffers

    zeros = tmp_path / "zeros.json"
    with zeros.open("wb") as fh:
        fh.truncate(64 << 20)

    def read_whole(fh: Any, size: int) -> bytearray:
        raise AssertionError(f"read all {size} bytes")

    monkeypatch.setattr(buffers, "_read_regular", read_whole)
    data, _, _ = buffers.load_bytes(str(zeros))
    assert len(data) == buffers.HEAD_BYTES
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", str(zeros)])
    assert result.stderr.splitlines() == [f"error: {zeros}: not a JSON object or list (starts with "
                                          f"{bytes(12)!r})"]
    with pytest.raises(AssertionError, match="read all"):  # a trace is read whole
        buffers.load_bytes(str(Path(sample("bf16_causal_fwd/naive"))))


def test_an_nsight_systems_report_is_named_with_the_command_that_exports_it(tmp_path: Path):
    # A .nsys-rep was "not a JSON object or list (starts with b'iI\\xb5...')", and a folder of them "no trace files".
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"iI\xb5\x00" + bytes(200))
    sqlite = tmp_path / "run.sqlite"
    export = f"nsys export --type sqlite --output {sqlite} {report}, then lint {sqlite}"
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", str(report)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {report}: an Nsight Systems report, not a trace (attntrace reads "
                                          f"its SQLite export): {export}"]
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {tmp_path}: no trace files (*.json, *.json.gz) or Nsight Systems "
                                          "exports (*.sqlite) in this directory; it holds 1 Nsight Systems report(s) "
                                          f"(.nsys-rep, .qdrep): {export}"]


def _held(path: Path) -> int:
    """An open file of `path` that holds it, as a run that is writing it does (another run, perhaps in another PID
    namespace, whose process id would mean nothing here)."""
    import fcntl

    fd = os.open(path, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_the_next_run_removes_what_a_run_killed_with_its_whole_group_left(tmp_path: Path):
    # `timeout -s KILL 3 attntrace lint big/ --jobs 2 --annotate DIR` kills every process of the run: nothing could
    # remove DIR/.g3.json.gz.XXXX.tmp or /tmp/pymp-*, and they stayed for good. A run now holds what it writes, and
    # the next run removes what no one holds, and nothing else.
    out = tmp_path / "out"
    out.mkdir()
    left = out / ".naive.pt.trace.json.gz.attntrace.k3j4h5g6.tmp"
    writing = out / ".naive.pt.trace.json.gz.attntrace.a1b2c3d4.tmp"
    someone_elses = out / ".naive.k3j4h5g6.tmp"
    for path in (left, writing, someone_elses):
        path.write_bytes(b"half")
        os.utime(path, (time.time() - 120, time.time() - 120))
    just_made = out / ".other.json.attntrace.z9y8x7w6.tmp"  # not held yet: made a moment ago
    just_made.write_bytes(b"half")
    holders = [_held(writing)]
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", sample("bf16_causal_fwd/naive"), "--annotate", str(out),
                                       "--fail-on", "never"])
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted([writing.name, someone_elses.name, just_made.name,
                                                            "naive.pt.trace.json.gz"])
    # multiprocessing's folder of a run gone, one of a run still going, and one that is not attntrace's.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    gone, going, unmarked = tmp / "pymp-gone0000", tmp / "pymp-going000", tmp / "pymp-other000"
    for folder in (gone, going, unmarked):
        folder.mkdir()
    (gone / "attntrace-owner").touch()
    holders.append(_held(going / "attntrace-owner"))
    script = ("import sys; from attntrace.read import workers; workers.warm_up(); "  # a long TMPDIR: no server
              "from multiprocessing import util; print(util.get_temp_dir())")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TMPDIR": str(tmp)})
    assert run.returncode == 0, run.stderr
    assert not gone.exists() and going.exists() and unmarked.exists()
    for fd in holders:
        os.close(fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork")
def test_a_forked_child_leaves_its_parents_multiprocessing_folder_alone(tmp_path: Path):
    # A child forked from a program with its own multiprocessing folder (a Listener's socket) ran api.lint(jobs=2):
    # it took the inherited folder for its own, and its server removed it when the child ended.
    script = tmp_path / "parent.py"
    script.write_text(f"""
import multiprocessing as mp, os
from multiprocessing.connection import Client, Listener

def child():
    from attntrace import api
    api.lint([{sample("bf16_causal_fwd/naive")!r}, {sample("bf16_causal_fwd/sdpa")!r}], jobs=2, fail_on="never")

if __name__ == "__main__":
    mp.set_start_method("fork")
    listener = Listener()
    folder = mp.process.current_process()._config["tempdir"]
    p = mp.Process(target=child)
    p.start()
    p.join()
    assert p.exitcode == 0
    assert os.path.isdir(folder) and "attntrace-owner" not in os.listdir(folder), os.listdir(folder)
    Client(listener.address).close()
    print("kept")
""")
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix="at", dir="/tmp")  # short: a socket's path holds at most 107 bytes
    try:
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                                env={**os.environ, "TMPDIR": tmp})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "kept\n"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
@pytest.mark.parametrize("swap", ["fifo", "other trace"])
def test_annotate_copies_only_the_file_that_was_analysed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str):
    # --annotate read the input again by its name after the analysis: a FIFO put in its place hung the run for good
    # (no report), and another trace moved over it was copied under the first one's findings, exit 0.
    from attntrace import api
    from attntrace.formats import annotate

    trace = tmp_path / "t.pt.trace.json.gz"
    trace.write_bytes(Path(sample("bf16_causal_fwd/naive")).read_bytes())
    added = annotate.events

    def swapped_then_added(*args: Any) -> Any:
        trace.unlink()
        if swap == "fifo":
            os.mkfifo(trace)
        else:
            trace.write_bytes(Path(sample("bf16_causal_fwd/sdpa")).read_bytes())
        return added(*args)

    monkeypatch.setattr(annotate, "events", swapped_then_added)
    out = tmp_path / "annotated.pt.trace.json.gz"
    report = api.lint([trace], annotate=out, fail_on="never")
    (linted,) = report.to_dict()["traces"]
    assert linted["error"] is None and report.findings  # the trace analysed is reported
    assert linted["annotate_error"] == ("the input changed after it was read: no copy written (it would not be the "
                                        "trace analysed)")
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_settings_may_name_a_rule_either_way_over_a_files_table(tmp_path: Path):
    # The check for two tables of one rule ran over the file's tables and the API's settings merged: naming AT102
    # by id in one and by name in the other was refused, and blamed on the file.
    from attntrace import api

    config = tmp_path / "one.toml"
    config.write_text("[rules.AT102]\nmin_seq = 64\n")
    trace = sample("bf16_causal_fwd/naive")
    for settings in ({"AT102.min_seq": 64, "materialized-scores.min_saving_share": 0.5},
                     {"AT102.min_seq": 64, "at102.min_saving_share": 0.5}):
        assert api.lint(trace, settings=settings, fail_on="never").traces[0].ok
    chosen = api.build_settings(settings={"materialized-scores.min_seq": 100}, config=config)
    assert chosen.params["AT102"]["min_seq"] == 100  # the API's settings over the file's


def test_a_copy_of_a_pyproject_under_another_name_is_read_as_one(tmp_path: Path):
    # --config ci.toml holding [project] and [tool.attntrace] was "settings both at the top level and in
    # [tool.attntrace]"; one without [tool.attntrace] was "unknown key 'project'".
    trace = sample("bf16_causal_fwd/naive")
    config = tmp_path / "ci.toml"
    config.write_text('[project]\nname = "mine"\n[tool.attntrace]\nfail-on = "never"\n')
    assert CliRunner().invoke(main, ["lint", "--jobs", "1", trace, "--config", str(config)]).exit_code == 0
    config.write_text('[project]\nname = "mine"\n[tool.ruff]\nline-length = 100\n')
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", trace, "--config", str(config)])
    assert result.exit_code == 1 and result.stderr == ""  # no settings of ours: the defaults, warnings fail


def test_diff_calls_nothing_new_against_a_cut_off_base(tmp_path: Path):
    # A cut-off base's missing steps may have held the new trace's findings: they were listed as new.
    whole, cut = _cut(tmp_path)
    result = CliRunner().invoke(main, ["diff", str(cut), str(whole), "--salvage", "--format", "json"])
    (pair,) = orjson.loads(result.stdout)["comparisons"]
    assert pair["findings"]["new"] == []
    assert [(f["rule"], f["side"]) for f in pair["findings"]["not_judged"]] == [("AT101", "base")]
    text = CliRunner().invoke(main, ["diff", str(cut), str(whole), "--salvage"]).stdout
    assert "not judged in the base trace (the base trace is incomplete (cut off)" in text


def test_no_baseline_is_written_from_a_cut_off_trace(tmp_path: Path):
    # Its missing steps' findings would all be new on the next run.
    _, cut = _cut(tmp_path)
    baseline = tmp_path / "baseline.json"
    result = CliRunner().invoke(main, ["lint", "--jobs", "1", str(cut), "--salvage", "--write-baseline",
                                       str(baseline), "--fail-on", "never"])
    assert result.exit_code == 2 and not baseline.exists() and "AT102" in result.stdout  # the report is still given
    assert (f"error: --write-baseline {baseline}: not written, 1 input(s) are incomplete (cut off) (fix or leave "
            "them out, then write it again)") in result.stderr.splitlines()


@pytest.mark.parametrize(("share", "applied"), [(0.95, True), (1.01, False)])
def test_a_measured_saving_is_held_against_the_findings_own_step(tmp_path: Path, share: float, applied: bool):
    trace = sample("bf16_causal_fwd/naive")
    measured = _measured(trace, tmp_path)
    (fingerprint,) = measured["findings"]
    step_us = next(f for f in orjson.loads(CliRunner().invoke(main, ["lint", "--jobs", "1", trace, "--format", "json",
                                                                     "--fail-on", "never"]).stdout)["findings"]
                   if f["fingerprint"] == fingerprint)["impact"]["step_us"]
    measured["findings"][fingerprint]["saved_us_per_step"] = share * step_us
    run_json = tmp_path / "run.json"
    run_json.write_bytes(orjson.dumps(measured))
    finding = next(f for f in orjson.loads(_lint_measured(trace, run_json).stdout)["findings"]
                   if f["fingerprint"] == fingerprint)
    assert (finding["impact"].get("basis") == "measured") is applied


def test_the_api_names_what_is_wrong_with_an_argument_in_few_words(tmp_path: Path):
    # A 400-digit expected_speedup was printed whole in its error, and one of 5,000 digits gave Python's own message
    # about int conversion; baseline="" was ": cannot read"; speedup={1: 2} was "sequence item 0: expected str".
    from attntrace import api

    trace = sample("bf16_causal_fwd/naive")
    for digits in (400, 5000):
        with pytest.raises(ValueError, match=rf"an integer of about {digits + 1} digits is not a number$"):
            api.lint(trace, settings={"AT202.expected_speedup": 10**digits})
    for option in ("baseline", "measured", "annotate"):
        with pytest.raises(ValueError, match=f"^{option}: an empty path"):
            api.lint(trace, **{option: ""})
    with pytest.raises(TypeError, match="speedup must be a mapping of kernel class name"):
        api.whatif(trace, speedup={1: 2})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="not dict"):
        api.lint(trace, select={"AT1": 1})  # type: ignore[arg-type]


def test_a_url_scheme_in_capitals_is_read_as_in_lower_case(tmp_path: Path):
    # HTTP://host/x and S3://bucket/x were "not a protocol fsspec knows": a scheme is case-insensitive (RFC 3986).
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    import http.server
    import threading

    (tmp_path / "t.pt.trace.json.gz").write_bytes(Path(sample("bf16_causal_fwd/naive")).read_bytes())
    handler = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"HTTP://127.0.0.1:{server.server_address[1]}/t.pt.trace.json.gz"
        run = subprocess.run([sys.executable, "-m", "attntrace", "lint", url, "--format", "json", "--fail-on",
                              "never"], capture_output=True, text=True, timeout=300, check=False)
    finally:
        server.shutdown()
        server.server_close()
    assert run.returncode == 0, run.stderr
    assert orjson.loads(run.stdout)["traces"][0]["path"] == url


def _first_error(path: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["lint", str(path), *args, "--fail-on", "never", "--jobs", "1"])
    return result.exit_code, result.stderr.splitlines()[0]


def test_legacy_lzma_is_named_with_the_command_that_unpacks_it(tmp_path: Path):
    # An .lzma file (xz's older format, which has no magic) was "not a JSON object or list (starts with b']...')".
    import lzma

    path = tmp_path / "t.json.lzma"
    path.write_bytes(lzma.compress(_plain_json(), format=lzma.FORMAT_ALONE))
    code, line = _first_error(path)
    assert code == 2
    assert line == (f"error: {path}: LZMA-compressed data (.lzma), not a trace (attntrace reads JSON and gzip): "
                    f"xz --format=lzma -dc {path} > t.json")


def _plain_json() -> bytes:
    import gzip

    return gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes())


def test_one_byte_of_a_gzip_stream_is_a_cut_off_gzip_stream(tmp_path: Path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(Path(sample("bf16_causal_fwd/naive")).read_bytes()[:1])
    assert _first_error(path) == (2, f"error: {path}: gzip stream is cut off (--salvage analyses the complete events)")


def test_a_socket_is_named_as_one(tmp_path: Path):
    # Its open fails with ENXIO: "No such device or address" named neither the socket nor what to give instead.
    import socket

    path = tmp_path / "t.pt.trace.json"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        result = CliRunner().invoke(main, ["lint", str(path), sample("bf16_causal_fwd/naive"), "--format", "json",
                                           "--fail-on", "never", "--jobs", "1"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: {path}: a socket, not a file (a trace is a file, a pipe, or '-' "
                                          "for stdin)"]
    assert [t["error"] is None for t in orjson.loads(result.stdout)["traces"]] == [False, True]


@pytest.mark.parametrize(("url", "said"), [
    ("http://[::1", "not a valid URL (Invalid IPv6 URL)"),
    ("s3://[x", "not a valid URL (Invalid IPv6 URL)"),
    ("http://127.0.0.1:99999/t.json", "not a valid URL (Port out of range 0-65535)"),
    ("file://", "the URL names no path (file:///folder/trace.json)"),
    ("http:///t.json", "the URL names no host (http://HOST/folder/trace.json)"),
    ("s3://", "the URL names no bucket (s3://BUCKET/folder/trace.json)"),
])
@pytest.mark.parametrize("command", ["lint", "summary"])
def test_a_url_that_names_nothing_is_that_inputs_one_line(url: str, said: str, command: str):
    # "http://[::1" was a traceback from summary, and lint's "error: Invalid IPv6 URL" named no input and dropped
    # the report of every other one; "file://" was read as "/", and the whole machine was walked for traces.
    result = CliRunner().invoke(main, [command, sample("bf16_causal_fwd/naive"), url, "--format", "json",
                                       "--jobs", "1", *(["--fail-on", "never"] if command == "lint" else [])])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [f"error: {url}: {said}"]
    traces = orjson.loads(result.stdout)["traces"]
    assert traces[0]["path"] == sample("bf16_causal_fwd/naive") and traces[0].get("error") is None


def test_diff_gives_no_verdict_where_the_steps_hold_little_of_each_iteration(tmp_path: Path):
    # Kernels of 0 us (the 6.4 ms between step starts still there): the markers held 142.5 us of each step, and the
    # intact trace's 6,382 us of GPU work was a REGRESSION of +4377% (exit 1), where summary said 6.4 ms of both.
    import gzip

    doc = orjson.loads(gzip.decompress(Path(sample("calibration/big_gemm.plain")).read_bytes()))
    intact = tmp_path / "intact.json"
    intact.write_bytes(orjson.dumps(doc))
    for event in doc["traceEvents"]:
        if event.get("cat") == "kernel":
            event["dur"] = 0
    emptied = tmp_path / "emptied.json"
    emptied.write_bytes(orjson.dumps(doc))
    result = CliRunner().invoke(main, ["diff", str(emptied), str(intact), "--fail-over", "5", "--format", "json"])
    assert result.exit_code == 0, result.output
    (pair,) = orjson.loads(result.stdout)["comparisons"]
    said = pair["step"]["not_compared"]
    assert said.startswith("not compared: the base trace's steps are 6") and "hold 142.5 us of that" in said
    assert pair["step"]["confidence_slower"] is None
    same = CliRunner().invoke(main, ["diff", str(intact), str(intact), "--fail-over", "5", "--format", "json"])
    assert orjson.loads(same.stdout)["comparisons"][0]["step"]["not_compared"] is None


@pytest.mark.parametrize(("trace", "code"), [("bf16_decode_q16/sdpa", 0), (None, 2)])
def test_a_run_with_its_error_stream_closed_still_reports(tmp_path: Path, trace: str | None, code: int):
    # `lint T 2>&-`: the progress bar asked sys.stderr (None) whether it was a terminal; the AttributeError could not
    # be printed, the report was never written, and the run exited 1 whatever it found.
    path = sample(trace) if trace else str(tmp_path / "absent.json")
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", path, "--format", "json", "-o", str(out)],
                          stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2), timeout=300, check=False)
    assert done.returncode == code
    assert orjson.loads(out.read_bytes())["summary"]["errors"] == (1 if code == 2 else 0)


def test_a_broken_trace_in_a_directory_is_an_error_not_other_json(tmp_path: Path):
    # Files that name their events, or that carry the profiler's trace name, were passed over as other programs'
    # JSON when a directory was linted: "1 trace(s), 0 unreadable", exit 0, with three broken ranks beside it.
    import gzip

    (tmp_path / "good.pt.trace.json").write_bytes(gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes()))
    broken = {"rank1.pt.trace.json": b'{"traceEvents":[{"ph":"X","cat":"kernel","name":"g","ts":"12x","dur":5}]}',
              "rank2.json": b'{"traceEvents":[1,2,3]}', "rank3.pt.trace.json": b"null",
              "rank4.pt.trace.json": b'{"a":1}'}
    for name, data in broken.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "run.json").write_bytes(b'{"a":1}')  # other JSON beside the traces: passed over
    result = CliRunner().invoke(main, ["lint", str(tmp_path), "--format", "json", "--fail-on", "never", "--jobs", "1"])
    assert result.exit_code == 2
    errors = {Path(t["path"]).name: t["error"]["message"] for t in orjson.loads(result.stdout)["traces"]
              if t["error"]}
    assert sorted(errors) == sorted(broken)
    assert errors["rank1.pt.trace.json"] == ("none of its 1 items is a trace event (an object with a phase, \"ph\", "
                                             "and fields of the format's types: numbers for ts and dur)")


def test_diff_pairs_no_trace_whose_name_another_shares(tmp_path: Path):
    # x.pt.trace.json beside x.pt.trace.json.gz: one was dropped without a word, and the verdict (a REGRESSION, exit
    # 1) depended on which one was paired.
    import gzip

    base, new = tmp_path / "base", tmp_path / "new"
    base.mkdir()
    new.mkdir()
    sdpa, naive = sample("bf16_causal_fwd/sdpa"), sample("bf16_causal_fwd/naive")
    for folder in (base, new):
        (folder / "y.pt.trace.json.gz").write_bytes(Path(sdpa).read_bytes())
    (base / "x.pt.trace.json.gz").write_bytes(Path(sdpa).read_bytes())
    (new / "x.pt.trace.json.gz").write_bytes(Path(naive).read_bytes())
    (new / "x.pt.trace.json").write_bytes(gzip.decompress(Path(sdpa).read_bytes()))
    result = CliRunner().invoke(main, ["diff", str(base), str(new), "--fail-over", "5", "--format", "json"])
    assert result.exit_code == 2
    report = orjson.loads(result.stdout)
    assert [Path(c["new"]).name for c in report["comparisons"]] == ["y.pt.trace.json.gz"]
    assert report["unmatched"] == [] and report["regressions"] == 0
    assert report["search_errors"] == [f"{new}: 2 traces have one name (x: {new}/x.pt.trace.json, "
                                       f"{new}/x.pt.trace.json.gz); rename all but one to compare them"]


def test_the_api_refuses_arguments_of_the_wrong_kind_in_its_own_words():
    # Each was an internal error deep inside (AttributeError, "'str' object is not callable", "unhashable type") or
    # was taken without a word (salvage="yes" read as on).
    import attntrace

    trace = sample("bf16_causal_fwd/naive")
    refused = {
        "select": (lambda: attntrace.lint([trace], select=[None]), "rules are named by text"),
        "runner": (lambda: attntrace.lint([trace], runner="local"), "runner must be a function"),
        "salvage": (lambda: attntrace.lint([trace], salvage="yes"), "salvage must be True or False"),
        "timelines": (lambda: attntrace.lint([trace], timelines=None), "timelines must be True or False"),
        "keep": (lambda: attntrace.lint([trace], keep=5), "keep must be a list of paths"),
        "summarize": (lambda: attntrace.summarize(trace, salvage=1), "salvage must be True or False"),
        "whatif": (lambda: attntrace.whatif(trace, drop_syncs="x"), "drop_syncs must be True or False"),
    }
    for call, said in refused.values():
        with pytest.raises(TypeError, match=said):
            call()
    report = attntrace.lint([trace, str(Path(trace).parent / "absent.json")])
    for level in ("bogus", ""):  # with an unreadable input too: 2 was returned without a look
        with pytest.raises(ValueError, match="fail_on must be one of error, warning, info, never"):
            report.exit_code(level)
    for odd in (["error"], 1):
        with pytest.raises(TypeError, match="fail_on is a level's name"):
            report.exit_code(odd)  # type: ignore[arg-type]
    assert report.exit_code("never") == 2


def test_a_path_with_a_nul_byte_is_that_inputs_error():
    # Only the API can be given one: os calls raised "embedded null byte", naming no input, and the other inputs
    # were lost (lint) or it was "internal error ...; please report it" (summarize).
    import attntrace

    trace = sample("bf16_causal_fwd/naive")
    report = attntrace.lint([trace, "/tmp/x\0y.json"])
    assert [(t.path, t.error) for t in report.traces] == [
        (trace, None), ("/tmp/x\0y.json", {"kind": "usage", "message": "the path holds a NUL byte, which no file "
                                                                        "name can"})]
    with pytest.raises(attntrace.TraceReadError, match="the path holds a NUL byte, which no file name can"):
        attntrace.summarize("/tmp/x\0y.json")


# A writer that commits to a WAL-mode export and dies before its checkpoint: the pages are in -wal alone.
_DIE_AFTER_A_WAL_COMMIT = """
import os, sqlite3, sys
connection = sqlite3.connect(sys.argv[1])
connection.execute("PRAGMA journal_mode=WAL")
connection.execute("PRAGMA wal_autocheckpoint=0")
connection.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = "
                   "(SELECT MIN(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")
connection.commit()
os._exit(0)
"""


@pytest.mark.parametrize("shm", [False, True])
def test_an_export_with_pages_in_its_wal_is_read_without_a_file_made_or_changed_beside_it(tmp_path: Path, shm: bool):
    # A -wal file with committed pages needs a -shm file to be read: SQLite made one beside the user's export, or
    # rewrote the one there. The export is now read from a private copy of it and its -wal.
    from nsys_build import TF32_GEMM, Export, Kernel

    folder = tmp_path / "exports"
    folder.mkdir()
    path = Export(kernels=[Kernel(TF32_GEMM, 100.0 * (i + 1), 50.0) for i in range(4)]).write(folder / "w.sqlite")
    subprocess.run([sys.executable, "-c", _DIE_AFTER_A_WAL_COMMIT, str(path)], check=True, timeout=60)
    if not shm:
        (folder / "w.sqlite-shm").unlink()
    before = {name: (folder / name).read_bytes() for name in os.listdir(folder)}
    assert (folder / "w.sqlite-wal").stat().st_size > 0
    result = CliRunner().invoke(main, ["summary", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["traces"][0]["kernels"] == 3  # the -wal's pages were read
    assert {name: (folder / name).read_bytes() for name in os.listdir(folder)} == before


@pytest.mark.parametrize(("args", "env", "said"), [
    (["whatif", "TRACE", "--speedup", "=2"], {},
     "error: Invalid value for --speedup: '=2' is not CLASS=FACTOR (e.g. gemm_fp32_simt=4) (see 'python -m attntrace "
     "whatif "
     "--help')"),
    (["diff", "FOLDER", "TRACE"], {},
     "error: FOLDER is a directory and the other a file: diff compares two traces, or two directories of traces "
     "matched by name"),
])
def test_wrong_arguments_get_one_line_that_says_what_is_wrong(tmp_path: Path, args: list[str], env: dict[str, str],
                                                              said: str):
    # "no kernels of class  in this trace"; "DIR: is a directory".
    trace = sample("bf16_causal_fwd/naive")
    given = [a.replace("TRACE", trace).replace("FOLDER", str(tmp_path)) for a in args]
    done = subprocess.run([sys.executable, "-m", "attntrace", *given], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env}, check=False)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [said.replace("FOLDER", str(tmp_path))]


def test_an_export_missing_a_time_column_is_named_as_such(tmp_path: Path):
    # SQLite reads "end" of a table without it as the text 'end': "a value of the wrong type ... of type: str".
    import sqlite3

    from nsys_build import TF32_GEMM, Export, Kernel

    path = Export(kernels=[Kernel(TF32_GEMM, 100.0, 50.0)]).write(tmp_path / "e.sqlite")
    with sqlite3.connect(path) as export:
        export.execute('ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN "end" TO finish')
    result = CliRunner().invoke(main, ["summary", str(path)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: {path}: an Nsight Systems export whose CUPTI_ACTIVITY_KIND_KERNEL table has no end column, which "
        "Nsight always writes; export it again"]


@pytest.mark.parametrize("threads", ["abc", "auto"])
def test_a_thread_count_that_is_text_is_passed_over_without_polars_warning(threads: str):
    # polars takes its default for it and warned on stderr, "sys:1: UserWarning: illegal value 'abc' ...": a second
    # line beside the run's own (none here).
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", sample("bf16_causal_fwd/sdpa_flash"), "--format",
                           "json"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "POLARS_MAX_THREADS": threads}, check=False)
    assert done.returncode == 0 and done.stderr == ""
    assert orjson.loads(done.stdout)["summary"]["traces"] == 1


def test_dev_null_as_a_config_is_no_settings():
    # "--config /dev/null", the usual way to say "no settings" (and to keep the nearest pyproject.toml out), was
    # refused as "not a file or a pipe"; other devices still are.
    trace = sample("bf16_causal_fwd/naive")
    plain = CliRunner().invoke(main, ["lint", trace, "--format", "json", "--jobs", "1"])
    nulled = CliRunner().invoke(main, ["lint", trace, "--format", "json", "--jobs", "1", "--config", os.devnull])
    assert nulled.exit_code == plain.exit_code == 1
    assert nulled.stdout == plain.stdout
    zero = CliRunner().invoke(main, ["lint", trace, "--config", "/dev/zero"])
    assert zero.exit_code == 2 and "not a file or a pipe" in zero.stderr


def test_diff_gives_no_verdict_where_a_sides_cpu_events_have_no_duration(tmp_path: Path):
    # Runtime calls of 0 us: the step without the profiler is replayed from them, and one program's trace was +7.8%
    # slower than itself, a REGRESSION (exit 1); lint said nothing of the missing times.
    import gzip

    doc = orjson.loads(gzip.decompress(Path(sample("heldout/resnet18_infer_fp32.plain")).read_bytes()))
    intact = tmp_path / "intact.json"
    intact.write_bytes(orjson.dumps(doc))
    calls = 0
    for event in doc["traceEvents"]:
        if event.get("cat") == "cuda_runtime":
            event["dur"] = 0
            calls += 1
    emptied = tmp_path / "emptied.json"
    emptied.write_bytes(orjson.dumps(doc))
    result = CliRunner().invoke(main, ["diff", str(emptied), str(intact), "--fail-over", "5", "--format", "json"])
    assert result.exit_code == 0, result.output
    step = orjson.loads(result.stdout)["comparisons"][0]["step"]
    assert step["not_compared"] == (f"not compared: the base trace's {calls} runtime call(s) all last 0 us (the CPU's "
                                    "times are missing); to compare, capture it again")
    summary = CliRunner().invoke(main, ["summary", str(emptied), "--format", "json"])
    assert (f"{calls} runtime call(s) all last 0 us (the CPU's times are missing): the steps replayed without the "
            "profiler lack the CPU's work") in orjson.loads(summary.stdout)["traces"][0]["notes"]


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_trace_with_ustar_at_byte_257_is_no_tar(tmp_path: Path, gzipped: bool):
    # A string that put "ustar" at byte 257 made a valid trace "a tar archive, not a trace".
    import gzip

    text = gzip.decompress(Path(sample("bf16_causal_fwd/naive")).read_bytes())
    prefix = b'{"pad": "'
    data = prefix + b"a" * (257 - len(prefix)) + b'ustar", ' + text.lstrip()[1:]
    path = tmp_path / ("t.pt.trace.json.gz" if gzipped else "t.pt.trace.json")
    path.write_bytes(gzip.compress(data) if gzipped else data)
    result = CliRunner().invoke(main, ["lint", str(path), "--format", "json", "--fail-on", "never", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["summary"]["errors"] == 0


@pytest.mark.parametrize(("events", "said"), [(b"null", "null"), (b"5", "a number"), (b"{}", "an object"),
                                               (b'"x"', "a string")])
def test_a_trace_events_value_that_is_no_list_is_named_by_its_json_type(tmp_path: Path, events: bytes, said: str):
    # "traceEvents is a NoneType" (or "a int", "a dict"): Python's names, not the file's.
    path = tmp_path / "t.json"
    path.write_bytes(b'{"traceEvents": ' + events + b"}")
    assert _first_error(path) == (2, f"error: {path}: traceEvents is {said}, not a list")


@pytest.mark.parametrize("command", [["rules"], ["explain", "AT101"]])
def test_rules_and_explain_with_stdout_closed_say_so(command: list[str]):
    # They exited 0 having printed nothing, where lint, diff and summary give one line and exit 2.
    done = subprocess.run([sys.executable, "-m", "attntrace", *command], stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: os.close(1), timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["error: stdout is closed: send it to a file (> FILE)"]
