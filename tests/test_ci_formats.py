"""CI formats: SARIF against the official schema, the JSON report against ours, GitHub annotations,
Markdown, and the baseline round trip."""

from __future__ import annotations

import json
import shutil
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from click.testing import CliRunner
from conftest import ROOT, sample

from attntrace.checks.catalog import load_rules
from attntrace.cli import main
from attntrace.formats import github, markdown
from attntrace.formats.printable import printable

# Vendored (OASIS SARIF 2.1.0, draft-07) so that the check runs in any clone, not only beside ../shared.
SARIF_SCHEMA = ROOT / "tests" / "data" / "sarif-schema-2.1.0.json"
WITH_FINDINGS = sample("bf16_causal_fwd/sdpa_math")
NO_FINDINGS = sample("bf16_causal_fwd/sdpa_flash")
WITH_STACK = sample("bf16_causal_fwd_stack/naive")


def lint(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["lint", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout


def report_schema() -> dict:
    return json.loads(files("attntrace").joinpath("schema/report.schema.json").read_text())


@pytest.mark.parametrize("paths", [[WITH_FINDINGS], [NO_FINDINGS], [WITH_STACK], [WITH_FINDINGS, "missing.json"]])
def test_sarif_validates_against_official_schema(paths):
    _, out = lint(*paths, "--format", "sarif")
    doc = json.loads(out)
    jsonschema.validate(doc, json.loads(SARIF_SCHEMA.read_text()))
    run = doc["runs"][0]
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == sorted(load_rules())
    for result in run["results"]:
        assert result["partialFingerprints"]["attntrace/v1"]
        assert result["level"] in ("error", "warning", "note")


def test_sarif_points_at_user_source_with_stacks():
    _, out = lint(WITH_STACK, "--format", "sarif")
    (result,) = [r for r in json.loads(out)["runs"][0]["results"] if r["ruleId"] == "AT102"]
    # The copy that fusing the attention removes is inside its cause, not a result of its own.
    assert "AT101" not in {r["ruleId"] for r in json.loads(out)["runs"][0]["results"]}
    assert [loc["message"]["text"][:5] for loc in result["relatedLocations"]] == ["AT101"]
    first = result["locations"][0]["physicalLocation"]
    assert first["artifactLocation"]["uri"] == "attntrace/capture/variants.py"
    assert first["region"]["startLine"] > 0
    assert result["locations"][1]["physicalLocation"]["artifactLocation"]["uri"] == WITH_STACK


@pytest.mark.parametrize("paths", [[WITH_FINDINGS], [NO_FINDINGS], [WITH_STACK, "missing.json"],
                                   [sample("workloads/launch_bound_tiny_ops")]])
def test_json_report_validates_against_our_schema(paths):
    _, out = lint(*paths, "--format", "json")
    jsonschema.validate(orjson.loads(out), report_schema())


def test_github_annotations():
    code, out = lint(WITH_STACK, "--format", "github")
    assert code == 1
    (line,) = [x for x in out.splitlines() if "AT10" in x]  # one annotation for the cause and its consequence
    assert line.startswith("::warning file=attntrace/capture/variants.py,line=")
    assert "title=AT102 materialized-scores::" in line and "\n" not in line
    assert "%0AIncludes AT101 hidden-copy" in line


def test_markdown_report():
    _, out = lint(WITH_FINDINGS, sample("bf16_causal_fwd/naive_inplace"), "--format", "markdown")
    assert out.startswith("## attntrace:")
    assert "| trace" in out and "AT202 sdpa-math-fallback" in out
    assert "↳ includes AT201 fp32-gemm" in out  # the math backend's FP32 GEMMs, inside their cause


def test_baseline_round_trip(tmp_path: Path):
    # One trace name, re-captured three times: the baseline run, a run with one more problem, a fixed run.
    trace = tmp_path / "attention.pt.trace.json.gz"
    base = tmp_path / "baseline.json"
    shutil.copy(sample("bf16_causal_fwd/naive"), trace)
    code, _ = lint(str(trace), "--write-baseline", str(base), "--select", "AT101,AT201")
    assert code == 1 and len(orjson.loads(base.read_bytes())["findings"]) == 1

    code, out = lint(str(trace), "--baseline", str(base), "--format", "json", "--select", "AT101,AT201")
    report = orjson.loads(out)
    assert code == 0 and [f["baseline"] for f in report["findings"]] == ["known"]

    shutil.copy(sample("fp32_causal_fwd/naive"), trace)  # the same copy, plus FP32 GEMMs
    code, out = lint(str(trace), "--baseline", str(base), "--format", "json", "--select", "AT101,AT201")
    report = orjson.loads(out)
    new = [f["rule"] for f in report["findings"] if f["baseline"] == "new"]
    assert code == 1 and new == ["AT201"] and report["baseline"]["known"] == 1

    shutil.copy(sample("bf16_causal_fwd/naive_inplace"), trace)  # the copy is gone
    code, out = lint(str(trace), "--baseline", str(base), "--format", "json", "--select", "AT101,AT201")
    report = orjson.loads(out)
    assert code == 0 and [e["rule"] for e in report["baseline"]["fixed"]] == ["AT101"]


def test_github_annotations_with_a_baseline_warn_only_of_new_findings(tmp_path: Path):
    trace = tmp_path / "attention.pt.trace.json.gz"
    base = tmp_path / "baseline.json"
    shutil.copy(sample("bf16_causal_fwd/naive"), trace)
    lint(str(trace), "--write-baseline", str(base), "--select", "AT101,AT201", "--fail-on", "never")
    shutil.copy(sample("fp32_causal_fwd/naive"), trace)  # the same copy, plus FP32 GEMMs
    _, out = lint(str(trace), "--baseline", str(base), "--format", "github", "--select", "AT101,AT201")
    commands = [(line.split(" ")[0], line.split("title=")[1].split("::")[0]) for line in out.splitlines()]
    assert sorted(commands) == [("::notice", "AT101 hidden-copy (known%3A in the baseline)"),
                                ("::warning", "AT201 fp32-gemm")]


def test_following_the_copy_fix_keeps_the_unfused_attention_known(tmp_path: Path):
    # AT101's fix (masked_fill -> masked_fill_) changes an op of AT102's chain: the attention is the same finding.
    trace = tmp_path / "attention.pt.trace.json.gz"
    base = tmp_path / "baseline.json"
    shutil.copy(sample("bf16_causal_fwd/naive"), trace)
    lint(str(trace), "--write-baseline", str(base), "--fail-on", "never")
    shutil.copy(sample("bf16_causal_fwd/naive_inplace"), trace)
    code, out = lint(str(trace), "--baseline", str(base), "--format", "json")
    report = orjson.loads(out)
    assert [(f["rule"], f["baseline"]) for f in report["findings"]] == [("AT102", "known")]
    assert [e["rule"] for e in report["baseline"]["fixed"]] == ["AT101"] and code == 0


def test_fingerprints_ignore_timings_and_capture_names(tmp_path: Path):
    # The same program captured twice (different timings, tensorboard-style timestamped names).
    first = tmp_path / "host_1.1700000000001.pt.trace.json.gz"
    second = tmp_path / "host_2.1700000009999.pt.trace.json.gz"
    shutil.copy(sample("bf16_causal_fwd/naive"), first)
    shutil.copy(sample("bf16_causal_fwd_stack/naive"), second)
    _, a = lint(str(first), "--format", "json")
    _, b = lint(str(second), "--format", "json")
    fa, fb = orjson.loads(a)["findings"][0], orjson.loads(b)["findings"][0]
    assert fa["evidence"]["gpu_us_per_step"] != fb["evidence"]["gpu_us_per_step"]
    assert fa["fingerprint"] == fb["fingerprint"]


def test_bad_baseline_is_one_line_error(tmp_path: Path):
    bad = tmp_path / "b.json"
    bad.write_text("[1, 2]")
    result = CliRunner().invoke(main, ["lint", NO_FINDINGS, "--baseline", str(bad)])
    assert result.exit_code == 2 and "not an attntrace baseline" in result.stderr


def test_the_stack_samples_source_lines_are_the_functions_that_ran():
    # Kineto names a Python frame by its function's first line: the committed sample must point at today's
    # code (re-capture with bench/gpu/capture_stack_sample.py when attntrace/capture/variants.py moves).
    report = orjson.loads(lint(WITH_STACK, "--format", "json", "--fail-on", "never")[1])
    lines = (Path(__file__).resolve().parent.parent / "attntrace/capture/variants.py").read_text().splitlines()
    sources = [f["where"]["source"] for f in report["findings"] if f["where"].get("source")]
    assert sources
    for source in sources:
        assert lines[source["line"] - 1].strip().startswith(f"def {source['function']}("), source


def test_markdown_of_every_sample_fits_a_pull_request_comment(samples_report: dict[str, Any]):
    # Seen on CI: a checkout path longer than this machine's, in every row, left no room for any folded cause.
    # Every sample's report (linted once for the session) with its traces moved under such a checkout.
    deep = "/tmp/" + "checkout-" * 12 + "/of/a/long/named/job/samples/"
    moved = orjson.loads(orjson.dumps(samples_report).replace(b'"sample_traces/', f'"{deep}'.encode()))
    out = markdown.render(printable(moved))
    assert len(out) <= 65_536 and out.count(f"`{deep.rstrip('/')}") == 1  # the folder named once, not in each row
    assert out.count("<details><summary>") == 2  # traces and causes past the top rows folded
    assert "more trace(s)" in out and "did not fit in a comment" in out  # the cut said


def test_github_annotations_stay_within_what_a_step_shows(samples_report: dict[str, Any]):
    out = github.render(samples_report)  # `lint sample_traces/ --format github`, from the session's one lint
    lines = out.splitlines()
    for level in ("warning", "notice"):
        mine = [x for x in lines if x.startswith(f"::{level} ")]
        assert len(mine) <= 10, level
    assert any(x.startswith("::warning title=attntrace%3A ") and "more warnings" in x for x in lines)
