"""The command line as a user meets it: exit codes, one-line errors, formats, settings, the catalogue."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import SAMPLES, sample

from attntrace.checks.catalog import DOC_FIELDS, RuleFileError, load_rules, parse_rule
from attntrace.cli import main

NAIVE = sample("bf16_causal_fwd/naive")
CLEAN = sample("bf16_causal_fwd/sdpa_flash")  # only an info finding: exit 0 at the default --fail-on


def invoke(*args: str, input: bytes | None = None):
    result = CliRunner().invoke(main, list(args), input=input)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_lint_exit_codes():
    assert invoke("lint", NAIVE).exit_code == 1
    assert invoke("lint", CLEAN).exit_code == 0
    assert invoke("lint", NAIVE, "--fail-on", "never").exit_code == 0
    assert invoke("lint", NAIVE, "--ignore", "AT101,materialized-scores").exit_code == 0
    assert invoke("lint", NAIVE, "--fail-on", "error").exit_code == 0


def test_bad_input_one_line_error_and_others_still_analysed(tmp_path: Path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"traceEvents": [')
    result = invoke("lint", str(bad), NAIVE, "--format", "json")
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "broken.json" in result.stderr
    assert "Traceback" not in result.output
    report = orjson.loads(result.stdout)
    assert [t["error"] is None for t in report["traces"]] == [False, True]
    assert {f["rule"] for f in report["findings"]} >= {"AT102"}
    assert "AT101" in {c["rule"] for f in report["findings"] for c in f.get("consequences", ())}


def test_json_is_deterministic_and_complete():
    first = invoke("lint", NAIVE, sample("bf16_causal_fwd/sdpa_math"), "--format", "json").stdout_bytes
    second = invoke("lint", NAIVE, sample("bf16_causal_fwd/sdpa_math"), "--format", "json", "-j", "1").stdout_bytes
    assert first == second
    report = orjson.loads(first)
    assert report["schema_version"] == 1 and report["summary"]["traces"] == 2
    for f in report["findings"]:
        assert set(f) >= {"rule", "name", "severity", "trace", "message", "where", "evidence", "impact", "fix",
                          "fingerprint"}
        assert set(f["impact"]) >= {"gpu_us_per_step", "share_of_step", "saving", "step_us", "assumption"}


def test_output_file_and_unwritable_output(tmp_path: Path):
    out = tmp_path / "report.json"
    assert invoke("lint", CLEAN, "--format", "json", "--output", str(out)).exit_code == 0
    assert orjson.loads(out.read_bytes())["summary"]["errors"] == 0
    result = invoke("lint", CLEAN, "--output", str(tmp_path / "missing" / "r.json"))
    assert result.exit_code == 2 and "cannot write" in result.stderr


def test_stdin_and_directories():
    data = gzip.decompress(Path(NAIVE).read_bytes())
    assert invoke("lint", "-", input=data).exit_code == 1
    result = invoke("lint", str(SAMPLES / "bf16_causal_fwd"), "--format", "json", "--fail-on", "never")
    assert orjson.loads(result.stdout)["summary"]["traces"] == 10


def test_set_and_config(tmp_path: Path):
    # A threshold above the 512 MiB copy silences AT101, from the CLI and from a config file.
    assert invoke("lint", NAIVE, "--select", "AT101", "--set", "AT101.min_bytes=1000000000").exit_code == 0
    cfg = tmp_path / "attntrace.toml"
    cfg.write_text('[tool.attntrace]\nfail-on = "error"\n[tool.attntrace.rules.AT101]\nmin_bytes = 1\n')
    assert invoke("lint", NAIVE, "--config", str(cfg)).exit_code == 0
    bad = invoke("lint", NAIVE, "--set", "AT101.nope=1")
    assert bad.exit_code == 2 and "no parameter 'nope'" in bad.stderr


def test_rules_and_explain_every_rule():
    listing = invoke("rules").stdout
    for rule in load_rules().values():
        assert rule.id in listing
        text = invoke("explain", rule.id).stdout
        assert "What it detects" in text and "Fix" in text
        for param in rule.parameters:
            assert param in text
    assert invoke("explain", "hidden-copy").exit_code == 0
    assert invoke("explain", "AT999").exit_code == 2


def test_every_rule_file_is_documented():
    for rule in load_rules().values():
        for key in DOC_FIELDS:
            assert len(rule.docs[key]) > 40, (rule.id, key)
        for p in rule.parameters.values():
            assert p.unit and p.description


def test_broken_rule_file_is_named(tmp_path: Path):
    path = tmp_path / "AT999.toml"
    path.write_text('id = "AT999"\nname = "x"\nseverity = "loud"\nsummary = "s"\n')
    with pytest.raises(RuleFileError, match=r"AT999\.toml: severity 'loud'"):
        parse_rule(path)


def test_summary_command():
    result = invoke("summary", NAIVE, "--format", "json")
    (s,) = orjson.loads(result.stdout)["traces"]
    assert s["steps"] == 3 and s["memcpy"] == 3 and s["tensor_core_share_of_gemm"] == 1.0
    assert invoke("summary", NAIVE).exit_code == 0


def test_lint_path_never_imports_torch():
    code = ("import sys; from attntrace.cli import main; sys.argv=['attntrace','lint','--fail-on','never','"
            + NAIVE + "'];\ntry: main()\nexcept SystemExit: pass\nassert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_exit_without_teardown_keeps_output_status_and_atexit(tmp_path: Path, jobs: str):
    # The console entry leaves with os._exit when nothing else runs: the report must still reach a file (not
    # only a pipe), the status must be the one the command chose, and atexit functions must run. With --jobs,
    # a pool was used: whichever way the process leaves, the same holds.
    runner = ("import atexit, sys\n"
              "atexit.register(lambda: sys.stderr.write('atexit ran\\n'))\n"
              "sys.argv = ['attntrace', *sys.argv[1:]]\n"
              "from attntrace.__main__ import entry\n"
              "entry()\n")
    out = tmp_path / "report.json"
    with out.open("wb") as fh:
        done = subprocess.run([sys.executable, "-c", runner, "lint", NAIVE, CLEAN, "--format", "json", "--jobs", jobs],
                              stdout=fh, stderr=subprocess.PIPE, text=True)
    assert done.returncode == 1, done.stderr  # the naive trace's warnings
    # In (not at the end of) stderr: the pool's helper processes share the pipe and may write after this one.
    assert "atexit ran\n" in done.stderr
    report = orjson.loads(out.read_bytes())
    assert {t["path"] for t in report["traces"]} == {NAIVE, CLEAN} and report["findings"]


@pytest.mark.parametrize(("setting", "message"), [
    ("AT101.min_bytes=1.5", "is not a size"), ("AT101.min_share=2", "out of range"),
    ("AT101.min_share=nan", "out of range"), ("AT501.launch_bound_ratio=0", "above 0"),
    ("AT501.min_launches=true", "whole number"), ("AT101.nope=1", "no parameter 'nope'"),
])
def test_a_bad_set_names_the_option_and_the_problem(setting: str, message: str) -> None:
    result = CliRunner().invoke(main, ["lint", NAIVE, "--set", setting])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert f"--set '{setting}'" in result.stderr and message in result.stderr


def test_a_size_parameter_takes_units() -> None:
    quiet = CliRunner().invoke(main, ["lint", NAIVE, "--select", "AT101", "--set", "AT101.min_bytes=1G"])
    loud = CliRunner().invoke(main, ["lint", NAIVE, "--select", "AT101", "--set", "AT101.min_bytes=1M"])
    assert (quiet.exit_code, loud.exit_code) == (0, 1)


@pytest.mark.parametrize("args", [["lint", NAIVE, "--format", "nope"], ["lint", NAIVE, "-j", "0"],
                                  ["summary", NAIVE, "--jobs", "abc"], ["diff", NAIVE, "-"],
                                  ["diff", NAIVE, NAIVE, "--fail-over", "nan"], ["nosuch"], ["lint"]])
def test_a_usage_error_is_one_line_and_exit_2(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "attntrace", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr


def test_a_quoted_pattern_is_expanded_like_a_urls() -> None:
    pattern = str(Path(NAIVE).parent / "sdpa*.pt.trace.json.gz")
    result = CliRunner().invoke(main, ["lint", pattern, "--format", "json", "--fail-on", "never"])
    paths = [t["path"] for t in orjson.loads(result.stdout)["traces"]]
    assert result.exit_code == 0 and len(paths) == 5 and paths == sorted(paths)
    nothing = CliRunner().invoke(main, ["lint", str(Path(NAIVE).parent / "nothing*.json")])
    assert nothing.exit_code == 2 and "no trace file matches this pattern" in nothing.stderr


def test_scheduler_without_dask_is_one_line_and_exit_2(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("dask", "distributed")
                        else real(name, *a))
    result = CliRunner().invoke(main, ["lint", sample("bf16_causal_fwd/naive"), "--scheduler", "local:2"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    from attntrace.install import pip_install

    assert pip_install("dask") in result.stderr and result.stderr.strip().count("\n") == 0


def test_help_describes_every_option_and_cuts_no_command_description():
    top = CliRunner().invoke(main, ["--help"]).output
    assert "..." not in top.split("Commands:")[1]
    for command in ("run", "lint", "summary", "diff", "rules", "explain"):
        assert f"  {command} " in top
    helped = CliRunner().invoke(main, ["run", "--help"]).output
    for option in ("--batch", "--head-dim", "--dtype", "--out "):
        line = next(x for x in helped.splitlines() if x.strip().startswith(option.strip()))
        assert not line.split(None, 2)[-1].startswith("[default"), line


@pytest.mark.parametrize("value", ["0.25", "25%"])
def test_a_share_parameter_takes_a_fraction_or_a_percentage(value):
    report = orjson.loads(CliRunner().invoke(main, [
        "lint", sample("workloads/low_occupancy_kernel"), "--select", "AT401", "--set",
        f"AT401.max_occupancy={value}", "--format", "json", "--fail-on", "never"]).stdout)
    assert [f["rule"] for f in report["findings"]] == ["AT401"]


def test_a_bare_percentage_for_a_fraction_is_refused_with_the_spelling_that_works():
    result = CliRunner().invoke(main, ["lint", NAIVE, "--set", "AT401.max_occupancy=25"])
    assert result.exit_code == 2 and '"25%" or 0.25' in result.stderr


def test_summary_never_shows_two_top_kernels_as_one_name():
    from attntrace.formats.summary_text import distinct_short

    head = "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_" + "x" * 80
    names = [head + "_nn_align8>(Params)", head + "_tn_align8>(Params)", "short"]
    shown = distinct_short(names)
    assert len(set(shown)) == 3 and all(len(s) <= 90 for s in shown) and shown[2] == "short"


def test_text_report_fits_the_terminal_with_its_impact_first():
    out = CliRunner().invoke(main, ["lint", str(SAMPLES / "bf16_causal_fwd"), "--fail-on", "never"],
                             env={"COLUMNS": "100"}).output
    heads = [line for line in out.splitlines() if line.startswith("  AT") or line.startswith("  known AT")]
    assert heads and all(len(line) <= 100 for line in heads)
    assert all(" ~" in line and "per step" in line for line in heads)  # the impact is on the headline
    skipped = [line for line in out.splitlines() if "skipped" in line]
    assert all(line.count("skipped") == 1 for line in skipped)  # one line per trace, grouped by reason
