"""Measured, not modelled: attntrace.profile times the steps without the profiler and keeps them in the trace
("attntrace_measured"); lint and summary take the step from there, the replay is fitted to it, and diff compares
the steps without the profiler."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import DATA, sample

import attntrace
from attntrace.cli import main
from attntrace.model.loading import load

MEASURED = DATA / "measured"
CALIBRATION = Path(__file__).parent.parent / "sample_traces" / "calibration"


def _cli(*args: str) -> tuple[int, str]:
    done = CliRunner().invoke(main, list(args))
    return done.exit_code, done.stdout


def _words(text: str) -> str:
    """The text with its line folds undone: the summary folds its sentences to the terminal's width."""
    return " ".join(text.split())


def _profiled_loop(tmp_path: Path, **schedule: int) -> tuple[Path, dict]:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    hook = attntrace.on_trace_ready(tmp_path / "traces", worker_name="w0", quiet=True)
    steps = sum(schedule.values())
    with attntrace.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                           schedule=torch.profiler.schedule(**schedule, repeat=1), on_trace_ready=hook) as prof:
        for _ in range(steps):
            model(torch.randn(8, 16)).sum().backward()
            prof.step()
    (written,) = sorted((tmp_path / "traces").iterdir())
    (record,) = prof.measured
    return written, record


def test_profile_writes_the_steps_without_the_profiler_and_lint_reads_them(tmp_path: Path):
    written, record = _profiled_loop(tmp_path, skip_first=1, wait=3, warmup=1, active=2)
    header = json.loads(written.read_text())
    kept = header["attntrace_measured"]
    assert kept == record and kept["version"] == 1 and kept["method"] == "host_clock"
    # skip_first and wait ran without the profiler; the active steps are the trace's ProfilerStep#N.
    assert kept["unprofiled_steps"] == [0, 1, 2, 3] and len(kept["unprofiled_step_us"]) == 4
    assert kept["profiled_steps"] == [5, 6] and len(kept["warmup_step_us"]) == 1
    markers = {e["name"] for e in header["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    assert markers == {"ProfilerStep#5", "ProfilerStep#6"}
    assert kept["settings"]["record_shapes"] and kept["settings"]["schedule"]["wait"] == 3
    # lint reads it back: its report's summary has the measured step, the median of the steady steps.
    code, out = _cli("lint", str(written), "--format", "json", "--fail-on", "never")
    assert code == 0
    profiler = orjson.loads(out)["traces"][0]["summary"]["profiler"]
    steady = [us for us in kept["unprofiled_step_us"] if us <= 1.5 * min(kept["unprofiled_step_us"])]
    assert profiler["measured_step_us"] == pytest.approx(statistics.median(steady), abs=1e-3)
    assert profiler["step_basis"] == "measured" and profiler["measured"]["unprofiled_steps_timed"] == 4
    assert "measured without the profiler (" in _words(_cli("summary", str(written))[1])


def test_a_schedule_without_wait_steps_times_none_and_says_so(tmp_path: Path):
    written, record = _profiled_loop(tmp_path, wait=0, warmup=1, active=2)
    assert record["unprofiled_step_us"] == [] and len(record["profiled_step_us"]) == 2
    profiler = load(str(written)).meta.measured
    assert profiler is not None and profiler.step_us is None
    assert "no step was timed without the profiler" in _words(_cli("summary", str(written))[1])


def _with_measured(source: Path, target: Path, value: object) -> Path:
    doc = orjson.loads(gzip.decompress(source.read_bytes()))
    doc["attntrace_measured"] = value
    target.write_bytes(gzip.compress(orjson.dumps(doc)))
    return target


def _timed(name: str, setting: str) -> list[float]:
    """The capture's own un-profiled timings, before and after it (bench/gpu/profiler_rounds.py), in us."""
    timed = orjson.loads((CALIBRATION / "timings.json").read_bytes())[name]["settings"][setting]
    return [1e3 * timed["unprofiled_before_ms"], 1e3 * timed["unprofiled_after_ms"]]


def test_the_replay_is_fitted_to_the_measured_step(tmp_path: Path):
    # Llama training with SDPA, shapes and stacks, on the H200: timed 22.2 and 22.8 ms without the profiler around
    # the capture; the estimate alone says 24.9 ms.
    source = CALIBRATION / "llama_train_sdpa.shapes_stack.pt.trace.json.gz"
    timed = _timed("llama_train_sdpa", "shapes_stack")
    path = _with_measured(source, tmp_path / "llama.pt.trace.json.gz",
                          {"version": 1, "method": "cuda_events", "unprofiled_step_us": timed})
    trace = load(str(path))
    calibration = trace.calibration
    assert calibration is not None and calibration.reached and trace.step_basis == "measured"
    assert calibration.calibrated_us == pytest.approx(statistics.median(timed), rel=0.01)
    assert calibration.estimated_us == pytest.approx(load(str(source)).estimate.per_device()["est_step_us"][0])
    assert calibration.estimate_error > 0.05 and calibration.scale > 1
    profiler = orjson.loads(_cli("summary", str(path), "--format", "json")[1])["traces"][0]["profiler"]
    assert profiler["est_error"] == pytest.approx(calibration.estimate_error, abs=1e-4)
    assert profiler["replay_step_us"] == pytest.approx(calibration.calibrated_us, abs=1e-3)
    # AT402 judges the measured step, and says so; the same capture without the measurement says "estimated".
    findings = orjson.loads(_cli("lint", str(path), "--format", "json", "--select", "AT402")[1])["findings"]
    assert "(measured step, idle replayed to it:" in findings[0]["message"]
    assert findings[0]["impact"]["step_us"] == pytest.approx(calibration.calibrated_us)
    plain = orjson.loads(_cli("lint", str(source), "--format", "json", "--select", "AT402")[1])["findings"]
    assert "(estimated:" in plain[0]["message"]


@pytest.mark.parametrize("value", ["fast", {"version": 1, "unprofiled_step_us": [1.0, -2.0]},
                                   {"unprofiled_step_us": [1.0]}, {"version": True}])
def test_a_broken_measurement_is_a_note_and_the_trace_is_linted_as_before(tmp_path: Path, value: object):
    path = _with_measured(Path(sample("bf16_causal_fwd/naive")), tmp_path / "t.pt.trace.json.gz", value)
    trace = load(str(path))
    assert trace.meta.measured is None and trace.step_basis == "estimated"
    assert any(n.startswith("attntrace_measured in the trace's metadata ignored: ") for n in trace.meta.notes)


def test_diff_compares_the_programs_not_the_profiles():
    # python_heavy: tiny ops through Python functions, whose profiler (record_shapes, with_stack) costs several
    # times the step; one_matmul: one large matmul a step, the profiler nearly free. tools/measured_cpu_traces.py.
    heavy, matmul, again = (str(MEASURED / f"{n}.pt.trace.json.gz")
                            for n in ("python_heavy", "one_matmul", "python_heavy_again"))
    code, out = _cli("diff", heavy, matmul, "--fail-over", "5", "--format", "json")
    (c,) = orjson.loads(out)["comparisons"]
    assert code == 1 and c["regression"] and c["step"]["basis"] == {"base": "measured", "new": "measured"}
    # Without the profiler the step is several times longer; as recorded the change is a fraction of that.
    assert c["step"]["change_pct"] > 200 and c["step"]["recorded"]["change_pct"] < c["step"]["change_pct"] / 2
    assert "--fail-over judges the step without the profiler" in _cli("diff", heavy, matmul, "--fail-over", "5")[1]
    # Two captures of one program pass.
    code, out = _cli("diff", heavy, again, "--fail-over", "5", "--format", "json")
    assert code == 0 and not orjson.loads(out)["comparisons"][0]["regression"]


def test_no_idle_warning_where_the_measured_step_leaves_the_gpu_busy(tmp_path: Path):
    # One cuDNN SDPA call a step, captured plain on the H200: timed at 102 us without the profiler around the
    # capture (GPU busy 100 us), while its steps as recorded run 2.5 ms of CPU that no profiler cost explains. The
    # estimate reads 96% idle and warns; the measured step leaves 2% idle, and no scale of the costs reaches it.
    source = CALIBRATION / "attention_sdpa.plain.pt.trace.json.gz"
    plain = orjson.loads(_cli("lint", str(source), "--format", "json", "--select", "AT402")[1])["findings"]
    assert [f["severity"] for f in plain] == ["warning"]
    path = _with_measured(source, tmp_path / "sdpa.pt.trace.json.gz", {
        "version": 1, "method": "cuda_events", "unprofiled_step_us": _timed("attention_sdpa", "plain")})
    assert load(str(path)).calibration is not None and not load(str(path)).calibration.reached
    (finding,) = orjson.loads(_cli("lint", str(path), "--format", "json", "--select", "AT402")[1])["findings"]
    assert finding["severity"] == "info" and finding["evidence"]["profiler_only"]
    assert "(measured step: 2 us of 102 us)" in finding["message"]


def test_attntrace_run_captures_keep_their_steps_without_the_profiler(tmp_path: Path):
    torch = pytest.importorskip("torch")
    from attntrace.capture.runner import profile_steps

    x = torch.randn(64, 64)
    path = tmp_path / "variant.pt.trace.json.gz"
    profile_steps(lambda: x @ x, 3, path)
    kept = orjson.loads(gzip.decompress(path.read_bytes()))["attntrace_measured"]
    # As many steps timed without the profiler as recorded, the recorded ones the trace's steps.
    assert len(kept["unprofiled_step_us"]) == 3 and kept["profiled_steps"] == [4, 5, 6]
    assert load(str(path)).meta.measured.step_us is not None
