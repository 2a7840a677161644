from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import DATA, SAMPLES, sample

from attntrace.cli import main

NAIVE, INPLACE = sample("bf16_causal_fwd/naive"), sample("bf16_causal_fwd/naive_inplace")


def diff(*args: str):
    result = CliRunner().invoke(main, ["diff", *args, "--format", "json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, orjson.loads(result.stdout)


def test_naive_to_inplace_removes_the_copy_and_saves_gpu_time():
    code, result = diff(NAIVE, INPLACE, "--fail-over", "5")
    (c,) = result["comparisons"]
    assert code == 0 and not c["regression"]
    assert c["metrics"]["memcpy"]["base"] == 1 and c["metrics"]["memcpy"]["new"] == 0
    saved = c["metrics"]["gpu_busy_us"]["base"] - c["metrics"]["gpu_busy_us"]["new"]
    assert 200 < saved < 300  # the 512 MiB Memcpy DtoD took ~256 us per step
    fixed = [f["rule"] for f in c["findings"]["fixed"]]
    assert "AT101" in fixed and "AT101" not in [f["rule"] for f in c["findings"]["new"]]
    assert c["kernel_classes"]["base"]["memcpy"] == 1 and "memcpy" not in c["kernel_classes"]["new"]


def test_self_diff_is_not_a_regression():
    code, result = diff(NAIVE, NAIVE, "--fail-over", "0")
    (c,) = result["comparisons"]
    assert code == 0 and not c["regression"] and not c["outside_noise"]
    assert c["findings"] == {"new": [], "fixed": [], "changed": [], "not_judged": []}


def test_slower_outside_the_spread_fails():
    code, result = diff(INPLACE, NAIVE, "--fail-over", "5")
    assert code == 1 and result["comparisons"][0]["regression"]
    assert diff(INPLACE, NAIVE, "--fail-over", "50")[0] == 0  # +12.7% is under a 50% threshold


def test_directories_matched_by_name():
    code, result = diff(str(SAMPLES / "bf16_causal_fwd"), str(SAMPLES / "bf16_causal_fwd_stack"))
    assert code == 0
    assert sorted(c["base"].rsplit("/", 1)[1] for c in result["comparisons"]) == [
        "naive.pt.trace.json.gz", "sdpa_math.pt.trace.json.gz"]
    assert len(result["unmatched"]) == 8


def test_a_trace_on_one_side_only_is_still_read(tmp_path):
    # A broken trace that only one directory holds fails the run (exit 2, named), as it would in a pair; a good
    # one is listed as only there; the pair beside them is still compared; other JSON (run.json) is left out.
    base, new = tmp_path / "base", tmp_path / "new"
    base.mkdir(), new.mkdir()
    for side in (base, new):
        shutil.copy(NAIVE, side / "naive.pt.trace.json.gz")
    shutil.copy(INPLACE, base / "naive_inplace.pt.trace.json.gz")
    shutil.copy(SAMPLES / "bf16_causal_fwd" / "run.json", base / "run.json")
    real = gzip.decompress(Path(sample("bf16_causal_fwd/sdpa")).read_bytes())
    (new / "cut.pt.trace.json").write_bytes(real[: len(real) // 3])  # a writer that died a third of the way in
    code, result = diff(str(base), str(new))
    assert code == 2 and result["errors"] == 1
    assert len(result["comparisons"]) == 1 and not result["comparisons"][0]["errors"]
    one_sided = {Path(u["base"] or u["new"]).name: u["error"] for u in result["unmatched"]}
    assert one_sided.keys() == {"naive_inplace.pt.trace.json.gz", "cut.pt.trace.json"}
    assert one_sided["naive_inplace.pt.trace.json.gz"] is None
    assert one_sided["cut.pt.trace.json"].startswith(str(new / "cut.pt.trace.json") + ": ")
    (new / "cut.pt.trace.json").unlink()
    assert diff(str(base), str(new))[0] == 0


def test_a_2x_step_as_recorded_is_judged_on_the_step_without_the_profiler():
    # FlexAttention causal vs grouped-query: the same kernel time, the step 2.4x as recorded, each launch call 2.3x
    # slower (the host, or the profiler).
    code, result = diff(sample("bf16_causal_fwd/flex"), sample("bf16_gqa_fwd/flex"), "--fail-over", "5")
    (c,) = result["comparisons"]
    recorded = c["step"]["recorded"]
    assert recorded["change_pct"] > 100 and recorded["confidence_slower"] >= 0.95
    assert recorded["steady_steps"] == {"base": 2, "new": 2}  # the slow first step of each left out
    assert abs(c["metrics"]["gpu_busy_us"]["change_pct"]) < 2
    # The gate judges the programs: without the profiler (estimated, its cost scaled to each trace's host) the new
    # steps take 285 and 211 us against 134 and 130, +88%, which two steps a side cannot call real at 95%.
    assert c["step"]["basis"] == {"base": "estimated", "new": "estimated"}
    assert 50 < c["step"]["change_pct"] < recorded["change_pct"] and 0.5 < c["step"]["confidence_slower"] < 0.95
    assert code == 0 and not c["regression"] and c["why"] is None


@pytest.mark.parametrize("variant", ["naive", "naive_inplace", "sdpa_math", "compiled", "sdpa_efficient",
                                     "triton"])
def test_a_recapture_of_the_same_program_is_not_a_regression(variant):
    code, result = diff(sample(f"bf16_causal_fwd/{variant}"), sample(f"bf16_causal_fwd_v2/{variant}"),
                        "--fail-over", "5")
    (c,) = result["comparisons"]
    assert code == 0 and not c["regression"] and abs(c["step"]["change_pct"]) < 5
    assert c["findings"]["new"] == [] and c["findings"]["fixed"] == []


def test_diff_and_the_baseline_use_one_identity(tmp_path: Path):
    # A trace re-captured in place after the masked_fill_ fix: the unfused attention is the same cause, known to
    # the baseline written before the fix, and neither new nor fixed in a diff against the saved earlier capture.
    trace, saved = tmp_path / "attention.pt.trace.json.gz", tmp_path / "saved" / "attention.pt.trace.json.gz"
    saved.parent.mkdir()
    shutil.copy(NAIVE, trace)
    shutil.copy(NAIVE, saved)
    baseline = tmp_path / "baseline.json"
    CliRunner().invoke(main, ["lint", str(trace), "--write-baseline", str(baseline), "--fail-on", "never"])
    shutil.copy(INPLACE, trace)
    linted = orjson.loads(CliRunner().invoke(main, ["lint", str(trace), "--baseline", str(baseline), "--format",
                                                    "json"]).stdout)
    _, result = diff(str(saved), str(trace))
    (c,) = result["comparisons"]
    known = {f["fingerprint"] for f in linted["findings"] if f["baseline"] == "known"}
    assert [(f["rule"], f["baseline"]) for f in linted["findings"]] == [("AT102", "known")]
    assert c["findings"]["new"] == [] and [f["rule"] for f in c["findings"]["fixed"]] == ["AT101"]
    assert known and [e["rule"] for e in linted["baseline"]["fixed"]] == ["AT101"]  # the copy, gone in both


def test_a_directory_baseline_has_one_entry_per_finding_and_knows_no_other_traces(tmp_path: Path):
    baseline = tmp_path / "baseline.json"
    # Three folders whose variants share file names (naive.pt.trace.json.gz in each): every sample took 40 s.
    folders = [str(SAMPLES / name) for name in ("bf16_causal_fwd", "fp32_causal_fwd", "bf16_causal_fwdbwd")]
    result = CliRunner().invoke(main, ["lint", *folders, "--write-baseline", str(baseline), "--format", "json",
                                       "--fail-on", "never"])
    report = orjson.loads(result.stdout)
    every = [g for f in report["findings"] for g in (f, *f.get("consequences", ()))]
    entries = orjson.loads(baseline.read_bytes())["findings"]
    assert len(entries) == len(every) == len({f["fingerprint"] for f in every})
    # A baseline of one directory: the same variants elsewhere are other traces, their findings new.
    small = tmp_path / "bf16.json"
    CliRunner().invoke(main, ["lint", str(SAMPLES / "bf16_causal_fwd"), "--write-baseline", str(small),
                              "--fail-on", "never"])
    other = CliRunner().invoke(main, ["lint", str(SAMPLES / "fp32_causal_fwd"), str(SAMPLES / "bf16_window_fwd"),
                                      "--baseline", str(small), "--format", "json", "--fail-on", "never"])
    assert all(f["baseline"] == "new" for f in orjson.loads(other.stdout)["findings"])


def test_findings_of_a_rule_the_new_trace_cannot_be_judged_by_are_not_fixed():
    # GPT-2 training on the H200 against the same model traced on a CPU: every GPU rule is skipped on the CPU trace,
    # and diff called its three findings "fixed".
    base = str(SAMPLES / "from_trace/gpt2_train_eager.pt.trace.json.gz")
    new = str(DATA / "hf_tiny_cpu/gpt2_train_eager.pt.trace.json.gz")
    _, result = diff(base, new)
    (c,) = result["comparisons"]
    assert c["findings"]["fixed"] == []
    assert sorted(f["rule"] for f in c["findings"]["not_judged"]) == ["AT101", "AT102", "AT302"]
    assert all("no GPU events" in f["reason"] for f in c["findings"]["not_judged"])
    text = CliRunner().invoke(main, ["diff", base, new]).output
    assert "fixed:" not in text and "not judged in the new trace (no GPU events" in text


def test_two_folders_end_with_one_verdict_over_every_pair():
    # Ten pairs of one run captured twice: the reader had ten verdicts to add up, and no line that said them all.
    base, new = str(SAMPLES / "bf16_causal_fwd"), str(SAMPLES / "bf16_causal_fwd_v2")
    text = CliRunner().invoke(main, ["diff", base, new]).stdout
    last = text.rstrip("\n").splitlines()[-1]
    assert last.startswith("overall: 10 pair(s): ")
    counted = [int(part.split()[0]) for part in last.split(": ", 2)[2].split(", ")]
    assert sum(counted) == 10
    single = CliRunner().invoke(main, ["diff", f"{base}/naive.pt.trace.json.gz", f"{new}/naive.pt.trace.json.gz"])
    assert "overall:" not in single.stdout  # one pair: its own verdict is the verdict
