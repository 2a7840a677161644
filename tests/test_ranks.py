"""`lint --group ranks`: one job's rank traces give each finding once, "on K of N ranks", with the spread of
its impact, the ranks that miss it and the step time per rank; baselines work on the grouped findings."""

from __future__ import annotations

import gzip
import json
import shutil
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from click.testing import CliRunner
from conftest import DATA, sample

from attntrace.cli import main
from attntrace.report.ranks import spans

NAIVE, MATH = sample("bf16_causal_fwd/naive"), sample("bf16_causal_fwd/sdpa_math")


def _lint(*args: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(main, ["lint", *args, "--format", "json"])
    return result.exit_code, orjson.loads(result.stdout_bytes), result.stderr


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """Four ranks named by file: ranks 0-2 run the naive attention, rank 3 (the straggler) the math backend."""
    for rank in range(3):
        shutil.copy(NAIVE, tmp_path / f"rank{rank}.pt.trace.json.gz")
    shutil.copy(MATH, tmp_path / "rank3.pt.trace.json.gz")
    return tmp_path


def _with_distributed_info(source: str, target: Path, rank: int, world_size: int) -> None:
    document = json.loads(gzip.decompress(Path(source).read_bytes()))
    document["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
    target.write_bytes(gzip.compress(json.dumps(document).encode(), mtime=0))


def test_a_finding_on_many_ranks_is_reported_once_with_its_spread(job: Path) -> None:
    _, per_trace, _ = _lint(str(job), "--fail-on", "never", "--group", "none")
    code, report, _ = _lint(str(job), "--fail-on", "never")  # auto: the files are one job's ranks
    assert code == 0 and "job" not in per_trace
    copy = [f for f in report["findings"] if f["rule"] == "AT102"]
    assert len(copy) == 1 and len([f for f in per_trace["findings"] if f["rule"] == "AT102"]) == 3
    assert copy[0]["ranks"]["on"] == 3 and copy[0]["ranks"]["of"] == 4 and copy[0]["ranks"]["missing"] == [3]
    assert copy[0]["message"].endswith("[on 3 of 4 ranks (missing on 3)]")
    spread = copy[0]["ranks"]["gpu_us_per_step"]
    assert spread["min"] <= spread["median"] <= spread["max"] and spread["median"] > 0
    # Every finding of every rank is in exactly one grouped finding.
    assert sum(f["ranks"]["on"] for f in report["findings"]) == len(per_trace["findings"])
    assert report["summary"]["findings"] == {s: sum(f["severity"] == s for f in report["findings"])
                                             for s in ("error", "warning", "info")}
    assert len(report["traces"]) == 4  # each rank's own summary stays
    jsonschema.validate(report, json.loads(files("attntrace").joinpath("schema/report.schema.json").read_text()))


def test_the_job_summary_shows_the_straggler(job: Path) -> None:
    _, report, _ = _lint(str(job), "--fail-on", "never", "--group", "ranks")
    summary = report["job"]
    assert summary["ranks"] == 4 and summary["rank_from"] == "name"
    assert summary["slowest_ranks"][0]["rank"] == 3
    assert summary["step_us"]["max"] == summary["slowest_ranks"][0]["step_us"] > summary["step_us"]["min"]
    assert [row["rank"] for row in summary["per_rank"]] == [0, 1, 2, 3]
    text = CliRunner().invoke(main, ["lint", str(job), "--fail-on", "never"]).stdout
    assert "job: 4 ranks (rank from name)" in text and "slowest: rank 3 " in text
    assert text.count("AT101") == 1


def test_distributed_info_gives_the_rank_and_the_missing_ranks(tmp_path: Path) -> None:
    # File names that say nothing of the rank: the trace's own distributedInfo does.
    for rank, name in ((5, "host-a"), (2, "host-b")):
        _with_distributed_info(NAIVE, tmp_path / f"{name}.pt.trace.json.gz", rank, world_size=8)
    _, report, _ = _lint(str(tmp_path), "--fail-on", "never")
    assert report["job"]["rank_from"] == "distributedInfo" and report["job"]["world_size"] == 8
    assert report["job"]["ranks_without_trace"] == [0, 1, 3, 4, 6, 7]
    assert [row["rank"] for row in report["job"]["per_rank"]] == [2, 5]


def test_traces_that_are_not_one_job_are_not_grouped(tmp_path: Path) -> None:
    shutil.copy(NAIVE, tmp_path / "rank0.pt.trace.json.gz")
    shutil.copy(NAIVE, tmp_path / "other_rank0.pt.trace.json.gz")  # rank 0 twice: two jobs
    shutil.copy(MATH, tmp_path / "plain.pt.trace.json.gz")
    _, auto, _ = _lint(str(tmp_path), "--fail-on", "never")
    _, none, _ = _lint(str(tmp_path), "--fail-on", "never", "--group", "none")
    assert auto == none and "job" not in auto
    _, forced, _ = _lint(str(tmp_path), "--fail-on", "never", "--group", "ranks")
    # A rank the name gives is kept where no earlier trace took it; the others are numbered by input order.
    assert forced["job"]["rank_from"] == "name, input order" and forced["job"]["ranks"] == 3
    assert forced["job"]["ranks_from_input_order"] == [1, 2]


def test_a_baseline_of_the_grouped_findings_marks_a_new_rank_problem_new(job: Path, tmp_path_factory: Any) -> None:
    baseline = tmp_path_factory.mktemp("baseline") / "baseline.json"
    straggler = job / "rank3.pt.trace.json.gz"
    shutil.move(straggler, baseline.with_name("rank3.pt.trace.json.gz"))
    code, _, _ = _lint(str(job), "--write-baseline", str(baseline), "--fail-on", "never")
    assert code == 0
    code, report, _ = _lint(str(job), "--baseline", str(baseline))
    assert code == 0 and report["baseline"]["new"] == 0 and report["baseline"]["known"] == len(report["findings"])
    shutil.move(baseline.with_name("rank3.pt.trace.json.gz"), straggler)
    code, report, _ = _lint(str(job), "--baseline", str(baseline))
    new = {f["rule"] for f in report["findings"] if f["baseline"] == "new"}
    inside = {c["rule"] for f in report["findings"] if f["baseline"] == "new" for c in f.get("consequences", ())}
    assert code == 1 and new == {"AT202"} and "AT201" in inside


def test_spans_fold_runs_of_ranks() -> None:
    assert spans([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    assert spans([]) == ""


def test_the_python_api_groups_ranks_as_the_cli_does(job: Path) -> None:
    import attntrace

    cli = CliRunner().invoke(main, ["lint", str(job), "--format", "json", "--fail-on", "never"])
    report = attntrace.lint(job)
    assert report.to_json() == cli.stdout and "job" in orjson.loads(cli.stdout)
    causes = orjson.loads(cli.stdout)["findings"]
    assert report.to_polars().height == len(causes) + sum(len(f.get("consequences", ())) for f in causes)


def test_one_cause_on_ranks_that_use_different_gpu_indices_is_one_finding() -> None:
    """HTA's trace_filter job: rank 0 ran on cuda:0, rank 1 on cuda:1. The device index was part of AT402's
    identity, so its one idle-GPU cause came out twice, "on 1 of 2 ranks (missing on 1)" and "(missing on 0)"."""
    code, report, _ = _lint(str(DATA / "hta_trace_filter"), "--fail-on", "never", "--group", "ranks")
    assert code == 0 and report["job"]["ranks"] == 2
    (idle,) = [f for f in report["findings"] if f["rule"] == "AT402"]
    assert idle["ranks"]["on"] == 2 and idle["ranks"]["missing"] == []
    assert idle["message"].endswith("[on 2 of 2 ranks]")
