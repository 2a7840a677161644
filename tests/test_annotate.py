"""lint --annotate: the trace with its findings on the timeline, as Perfetto and chrome://tracing read it."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import orjson
from click.testing import CliRunner
from conftest import SAMPLES, sample

from attntrace.cli import main
from attntrace.formats.annotate import CATEGORY, PROCESS_NAME
from attntrace.report import all_findings

NAIVE = sample("bf16_causal_fwd/naive")
SDPA_MATH = sample("bf16_causal_fwd/sdpa_math")


def invoke(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def lint_json(path: str) -> dict:
    return orjson.loads(invoke("lint", path, "--format", "json", "--fail-on", "never").stdout)


def assert_one_insertion(original: bytes, annotated: bytes) -> None:
    """The annotated copy is the original with one run of bytes inserted: every original byte is kept."""
    at = next(i for i, (a, b) in enumerate(zip(original, annotated, strict=False)) if a != b)
    added = len(annotated) - len(original)
    assert added > 0 and annotated[:at] == original[:at] and annotated[at + added:] == original[at:]


def annotation(events: list[dict]) -> tuple[int, list[dict]]:
    pid = next(e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and e["args"]["name"] == PROCESS_NAME)
    ours = [e for e in events if e.get("pid") == pid or e.get("cat") == CATEGORY]
    return pid, ours


def test_annotated_copy_keeps_every_original_byte_and_compression(tmp_path: Path):
    out = tmp_path / "naive.annotated.pt.trace.json.gz"
    result = invoke("lint", NAIVE, "--annotate", str(out), "--fail-on", "never")
    assert result.exit_code == 0, result.output
    original = gzip.decompress(Path(NAIVE).read_bytes())
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    annotated = gzip.decompress(out.read_bytes())
    assert_one_insertion(original, annotated)
    # Valid Trace Event Format, and the original events are the same objects in the same order.
    before, after = json.loads(original), json.loads(annotated)
    _, ours = annotation(after["traceEvents"])
    assert len(after["traceEvents"]) == len(before["traceEvents"]) + len(ours)
    assert [e for e in after["traceEvents"] if e not in ours] == before["traceEvents"]
    assert {k: v for k, v in after.items() if k != "traceEvents"} == {
        k: v for k, v in before.items() if k != "traceEvents"}
    # Same input, same bytes.
    again = tmp_path / "again.json.gz"
    invoke("lint", NAIVE, "--annotate", str(again), "--fail-on", "never")
    assert again.read_bytes() == out.read_bytes()
    # A name without .gz gets plain JSON, whatever the input was.
    plain = tmp_path / "naive.annotated.json"
    invoke("lint", NAIVE, "--annotate", str(plain), "--fail-on", "never")
    assert plain.read_bytes() == annotated


def test_each_finding_has_a_track_and_slices_covering_its_flagged_events(tmp_path: Path):
    out = tmp_path / "naive.json.gz"
    invoke("lint", NAIVE, "--annotate", str(out), "--fail-on", "never")
    events = json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    _, ours = annotation(events)
    report = lint_json(NAIVE)
    # One track per finding's rule, beside the critical path's (annotate.PATH_TID: tests/test_whatif.py).
    tracks = {e["tid"]: e["args"]["name"] for e in ours if e.get("name") == "thread_name"
              and not e["args"]["name"].startswith("critical path")}
    assert set(tracks.values()) == {f"{f['rule']} {f['name']}" for f in all_findings(report)} and len(tracks) == 2
    slices = [e for e in ours if e["ph"] == "X" and e["tid"] in tracks]
    for finding in report["findings"]:
        mine = [s for s in slices if s["args"]["fingerprint"] == finding["fingerprint"]]
        assert sorted(s["args"]["step"] for s in mine) == finding["where"]["steps"]
        assert all(tracks[s["tid"]].startswith(finding["rule"]) for s in mine)
        assert {"message", "evidence", "impact", "fix", "fingerprint"} <= set(mine[0]["args"])
    # AT101 flags the Memcpy DtoD of masked_fill's clone: found here from the raw events, not the model.
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and "DtoD" in e["name"]]
    hidden = [s for s in slices if s["name"].startswith("AT101")]
    assert len(copies) == 3 and len(hidden) == 3
    for copy in copies:
        assert any(s["ts"] <= copy["ts"] and copy["ts"] + copy["dur"] <= s["ts"] + s["dur"] + 1e-3 for s in hidden)


def test_flow_arrows_land_on_the_flagged_events(tmp_path: Path):
    out = tmp_path / "sdpa_math.json.gz"
    invoke("lint", SDPA_MATH, "--annotate", str(out), "--fail-on", "never")
    events = json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    pid, ours = annotation(events)
    starts = {e["id"]: e for e in ours if e["ph"] == "s"}
    ends = {e["id"]: e for e in ours if e["ph"] == "f"}
    assert starts and starts.keys() == ends.keys()
    slices = [e for e in ours if e["ph"] == "X"]
    originals = [e for e in events if e.get("ph") == "X" and e.get("pid") != pid]
    for flow_id, end in ends.items():
        start = starts[flow_id]
        assert any(s["tid"] == start["tid"] and s["ts"] <= start["ts"] <= s["ts"] + s["dur"] for s in slices)
        hit = [e for e in originals if e["pid"] == end["pid"] and e["tid"] == end["tid"]
               and e["ts"] <= end["ts"] <= e["ts"] + e["dur"]]
        assert hit, end
    # The FP32 GEMM finding (AT201) points at the sgemm-class kernels themselves.
    at201 = next(s for s in slices if s["name"].startswith("AT201"))
    assert at201["args"]["flagged_events"] >= 1


def test_directory_is_mirrored_with_plain_json_kept_plain(tmp_path: Path):
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    shutil.copy(NAIVE, src / "naive.pt.trace.json.gz")
    (src / "sub" / "plain.pt.trace.json").write_bytes(gzip.decompress(Path(SDPA_MATH).read_bytes()))
    (src / "run.json").write_text('{"not": "a trace"}')
    out = tmp_path / "out"
    result = invoke("lint", str(src), "--annotate", str(out), "--fail-on", "never")
    assert result.exit_code == 0, result.output
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "naive.pt.trace.json.gz", "sub/plain.pt.trace.json"]
    plain = (out / "sub" / "plain.pt.trace.json").read_bytes()
    assert plain.lstrip().startswith(b"{")
    assert_one_insertion((src / "sub" / "plain.pt.trace.json").read_bytes(), plain)


def test_annotate_refuses_stdin_and_overwriting_the_input(tmp_path: Path):
    result = invoke("lint", "-", "--annotate", str(tmp_path / "x.json"))
    assert result.exit_code == 2 and "stdin" in result.stderr
    copy = tmp_path / "naive.pt.trace.json.gz"
    shutil.copy(NAIVE, copy)
    before = copy.read_bytes()
    result = invoke("lint", str(copy), "--annotate", str(copy), "--fail-on", "never")
    assert result.exit_code == 2 and "overwrite" in result.stderr and result.stderr.count("\n") == 1
    assert copy.read_bytes() == before
    assert "unreadable" not in result.stdout  # refused before the run: the trace is not counted as unreadable


def test_annotate_leaves_the_report_unchanged(tmp_path: Path):
    args = ("lint", str(SAMPLES / "bf16_causal_fwd"), "--format", "json", "--fail-on", "never")
    plain = invoke(*args)
    annotated = invoke(*args, "--annotate", str(tmp_path / "out"))
    assert plain.exit_code == annotated.exit_code == 0
    assert plain.stdout_bytes == annotated.stdout_bytes
    assert len(list((tmp_path / "out").glob("*.json.gz"))) == 10


def test_overlapping_findings_of_one_rule_get_their_own_lanes():
    from attntrace.formats.annotate import _lanes
    from attntrace.report.flagged import Span

    spans = [Span(0, 1, 0.0, 10.0), Span(1, 1, 5.0, 15.0), Span(2, 1, 10.0, 20.0), Span(3, 1, 16.0, 18.0)]
    # A slice that overlaps another in part goes to a second track; one that starts after an end reuses it.
    assert _lanes(spans) == [0, 1, 0, 1]
