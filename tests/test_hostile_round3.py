"""Hostile inputs found by this round's probe (340 generated cases): each was a traceback, an internal error or a
hang, and the good trace beside it was lost. Each trace here is a real sample changed in one way."""

from __future__ import annotations

import copy
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import sample

from attntrace.cli import main
from attntrace.model import taxonomy
from attntrace.model.loading import load
from attntrace.model.summary import device_summary

NAIVE = sample("bf16_causal_fwd/naive")
SDPA = sample("bf16_causal_fwd/sdpa")


def _doc(path: str = SDPA) -> dict[str, Any]:
    return json.loads(gzip.decompress(Path(path).read_bytes()))


def _write(doc: dict[str, Any], path: Path) -> str:
    path.write_bytes(json.dumps(doc).encode())
    return str(path)


def _both_reported(stdout: str, bad: str, good: str = NAIVE) -> None:
    """Both traces analysed: in lint's report with no error, in summary's with none listed in `errors`."""
    report = json.loads(stdout)
    assert {t["path"] for t in report["traces"]} == {bad, good}
    assert all(t.get("error") is None for t in report["traces"]) and not report.get("errors")


@pytest.mark.parametrize("rank", [2**70, -(2**63) - 1])
@pytest.mark.parametrize("command", [["lint", "--fail-on", "never"], ["summary"]])
def test_a_rank_past_64_bits_is_no_rank(tmp_path: Path, rank: int, command: list[str]) -> None:
    """orjson cannot write such an integer: the JSON report was a traceback and no output at all."""
    doc = _doc()
    doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    bad = _write(doc, tmp_path / "rank.json")
    result = CliRunner().invoke(main, [*command, "--format", "json", bad, NAIVE])
    assert result.exit_code == 0 and result.exception is None, result.output
    _both_reported(result.stdout, bad)
    assert load(bad).meta.rank is None


def test_a_device_name_that_is_not_text_is_no_name(tmp_path: Path) -> None:
    """AT401 matched the name against peaks.toml: an internal error (TypeError) in place of the findings."""
    doc = _doc(NAIVE)  # its kernels have recorded shapes: AT401 asks how near the device's peak they run
    doc["deviceProperties"][0]["name"] = 5
    bad = _write(doc, tmp_path / "name.json")
    result = CliRunner().invoke(main, ["lint", "--format", "json", "--fail-on", "never", bad, SDPA])
    assert result.exit_code == 0 and "internal error" not in result.stderr, result.stderr
    _both_reported(result.stdout, bad, SDPA)


def test_a_kernel_name_made_to_defeat_a_backtracking_regex_is_classified(tmp_path: Path) -> None:
    """`gemm_.*(sm90|sm100)` searched by Python's regex took time quadratic in this name: minutes for 200 KB.
    The good trace beside it was lost to the hang; the run now takes about a second."""
    doc = _doc()
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    kernel["name"] = "gemm_" * 40_000
    bad = _write(doc, tmp_path / "long_name.json")
    done = subprocess.run([sys.executable, "-m", "attntrace", "lint", "--format", "json", "--fail-on", "never",
                           bad, NAIVE], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    _both_reported(done.stdout, bad)
    # The same class as Python's regex gives, where it still can: on a name of the same form 1% as long.
    short = "gemm_" * 400
    expected = next((c.id for c in taxonomy.load().classes if re.search(c.pattern, short)), "other")
    assert taxonomy.load().classify(short) == taxonomy.load().classify(kernel["name"]) == expected


def test_devices_are_summarised_together_as_each_alone(tmp_path: Path) -> None:
    """device_summary computes every device's figures at once (a query per device took 47 s for 5,000
    devices): a second device running the same kernels 0.5 us later has the same busy time as the first."""
    doc = _doc(NAIVE)
    second = []
    for event in doc["traceEvents"]:
        if isinstance(event.get("args"), dict) and event["args"].get("device") == 0 and "dur" in event:
            twin = copy.deepcopy(event)
            twin["args"]["device"], twin["ts"] = 1, event["ts"] + 0.5
            second.append(twin)
    doc["traceEvents"] += second
    doc["deviceProperties"].append({**doc["deviceProperties"][0], "id": 1})
    devices = device_summary(load(_write(doc, tmp_path / "two_devices.json")))
    alone = device_summary(load(NAIVE))[0]
    assert [d["device"] for d in devices] == [0, 1]
    for device in devices:
        assert {k: v for k, v in device.items() if k != "device"} == {k: v for k, v in alone.items()
                                                                       if k != "device"}
