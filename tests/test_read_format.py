"""Reading what the Trace Event Format allows, on a real H200 trace rewritten as other writers write it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner
from conftest import sample

from attntrace import read
from attntrace.cli import main

NAIVE = sample("bf16_causal_fwd/naive")


def _events() -> list[dict[str, Any]]:
    return json.loads(gzip.decompress(Path(NAIVE).read_bytes()))["traceEvents"]


def _lint(path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(main, ["lint", str(path), "--format", "json", "--fail-on", "never", *args])
    return result.exit_code, orjson.loads(result.stdout), result.stderr


def test_the_array_form_without_its_closing_bracket_is_read_with_a_note(tmp_path: Path):
    whole = json.dumps(_events())
    died = tmp_path / "died.json"
    died.write_text(whole[:-1] + ",\n")  # a process that died after its last event: no "]"
    code, report, _ = _lint(died)
    (trace,) = report["traces"]
    assert code == 0 and trace["error"] is None and not trace["incomplete"]
    assert any("no closing ']'" in note for note in trace["summary"]["notes"])
    assert [f["rule"] for f in report["findings"]] == ["AT102"]  # the same cause as the complete trace
    cut = tmp_path / "cut.json"
    cut.write_text(whole[: len(whole) // 2])  # cut inside an event: that is a cut-off file
    code, report, stderr = _lint(cut)
    assert code == 2 and "--salvage" in stderr


def test_a_repeated_trace_events_key_gives_the_last_one_at_every_size(tmp_path: Path):
    events = json.dumps(_events())
    padding = json.dumps([{"ph": "i", "name": "pad", "pid": 9, "tid": 9, "ts": 0, "s": "t", "args": {"x": "y" * 200}}]
                         * (read.CHUNK_BYTES // 250 + 10))
    for name, body in (("small", events), ("large", events[:-1] + ", " + padding[1:])):
        first_empty = tmp_path / f"{name}_last.json"
        first_empty.write_text('{"traceEvents": [], "traceEvents": ' + body + "}")
        last_empty = tmp_path / f"{name}_first.json"
        last_empty.write_text('{"traceEvents": ' + body + ', "traceEvents": []}')
        code, report, _ = _lint(first_empty)
        assert code == 0 and report["traces"][0]["events"] > 0, name
        code, report, stderr = _lint(last_empty)
        assert code == 2 and "no trace events" in stderr, name


def test_input_dims_that_hold_integers_are_coerced(tmp_path: Path):
    events = _events()
    for event in events:
        args = event.get("args") or {}
        if "Input Dims" in args:
            args["Input Dims"] = 5 if event["name"] == "aten::softmax" else [
                d[0] if isinstance(d, list) and d else 1 for d in args["Input Dims"]]
    path = tmp_path / "ints.json"
    path.write_text(json.dumps({"traceEvents": events}))
    code, report, stderr = _lint(path)
    assert code == 0 and report["traces"][0]["error"] is None and "internal" not in stderr
    plan = CliRunner().invoke(main, ["run", "--from-trace", str(path), "--plan"])
    assert plan.exception is None or isinstance(plan.exception, SystemExit)
    assert "Traceback" not in plan.output
