from __future__ import annotations

import orjson
from click.testing import CliRunner
from conftest import SAMPLES, sample

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
    assert c["findings"] == {"new": [], "fixed": [], "changed": []}


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
