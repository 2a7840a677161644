"""The what-if replay (model/replay.py Change), the critical path (model/critical_path.py) and `attntrace whatif`,
on real H200 captures."""

from __future__ import annotations

import orjson
from click.testing import CliRunner
from conftest import SAMPLES, sample

from attntrace.cli import main
from attntrace.model.loading import load
from attntrace.model.replay import Change
from attntrace.model.summary import critical_path
from attntrace.report.engine import lint_trace

TINY_OPS = sample("workloads/launch_bound_tiny_ops")  # 200 tiny kernels a step, launch-bound
GPU_BOUND = sample("bf16_causal_fwd/naive")  # the GPU runs steps behind the CPU
ITEM_SYNC = sample("calibration/mlp_item_sync.shapes")  # a .item() per micro-batch


def test_no_change_saves_nothing_and_a_graph_saves_a_launch_bound_step():
    trace = load(TINY_OPS)
    (unchanged,) = trace.whatif(Change())
    assert unchanged.saved_us == 0.0
    (graphed,) = trace.whatif(Change(graph=True))
    assert graphed.after_us < 0.5 * graphed.before_us


def test_a_gpu_bound_step_gains_nothing_on_the_host():
    trace = load(GPU_BOUND)
    for change in (Change(graph=True), Change(drop_syncs=None, pin_copies=None)):
        (saving,) = trace.whatif(change)
        assert saving.saved_us < 0.02 * saving.before_us


def test_kernels_sped_up_shorten_a_gpu_bound_step_by_their_time():
    trace = load(GPU_BOUND)
    kernels = trace.gpu.filter(trace.gpu["kind"] == "kernel")
    (twice,) = trace.whatif(Change(speedup=tuple((int(i), 2.0) for i in kernels["idx"].to_list())))
    # Kernels are most of the step: twice as fast saves over a third of it, never more than half.
    assert 0.35 * twice.before_us < twice.saved_us <= 0.5 * twice.before_us


def test_critical_path_shares_add_up_to_the_step_and_name_the_cause():
    for path, top in ((GPU_BOUND, "gpu: "), (TINY_OPS, "cpu: ")):
        paths = critical_path(load(path))
        (device,) = paths["devices"]
        assert abs(sum(p["us"] for p in device["parts"]) - device["step_us"]) < 0.01 * device["step_us"]
        assert device["parts"][0]["on"].startswith(top)


def test_whatif_command_text_and_json():
    runner = CliRunner()
    result = runner.invoke(main, ["whatif", ITEM_SYNC, "--graph", "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.output)
    (device,) = doc["devices"]
    assert device["after_us"] < device["before_us"] and doc["critical_path_before"][0]["parts"]
    text = runner.invoke(main, ["whatif", ITEM_SYNC, "--drop-syncs"])
    assert text.exit_code == 0 and "host syncs removed" in text.output and "critical path before" in text.output


def test_whatif_refuses_an_unknown_class_in_one_line():
    result = CliRunner().invoke(main, ["whatif", TINY_OPS, "--speedup", "no_such_class=2"])
    assert result.exit_code == 2
    assert "no kernels of class no_such_class" in result.output and "Traceback" not in result.output
    bad = CliRunner().invoke(main, ["whatif", TINY_OPS, "--speedup", "gemm"])
    assert bad.exit_code == 2 and "CLASS=FACTOR" in bad.output


def test_syncs_timed_to_save_nothing_are_info_with_their_wall_saving():
    """The .item() per micro-batch (MLP) and per step (GPT-2) were timed on the H200 with and without the sync
    (sample_traces/calibration/sync_saving.json, its 25-round sitting): the saving is within the host's noise, under 5%
    of the step. AT302 gives each sync's wall saving, replayed, and that saving keeps it info."""
    import statistics

    timed = orjson.loads((SAMPLES / "calibration" / "sync_saving.json").read_bytes())
    longest = max(timed["sittings"], key=lambda s: s["_rounds"])  # 25 rounds: the 3-round sitting is noise
    for name in ("mlp_item_sync", "gpt2_train_item"):
        with_sync = statistics.median(longest[name]["with_sync_ms"])
        saved = with_sync - statistics.median(longest[name]["without_sync_ms"])
        assert saved < 0.05 * with_sync
    for name in ("mlp_item_sync", "gpt2_train_item"):
        for setting in ("plain", "shapes", "shapes_stack"):
            report = lint_trace(load(sample(f"calibration/{name}.{setting}")))
            syncs = [f for f in report.findings if f["rule"] == "AT302"]
            assert syncs, (name, setting)
            for f in syncs:
                assert f["severity"] == "info", (name, setting, f["message"])
                assert f["impact"]["wall_us_per_step"] < 0.02 * f["impact"]["step_us"]
                assert "wall time" in f["message"]


def test_annotate_marks_the_critical_path(tmp_path):
    out = tmp_path / "annotated.json"
    result = CliRunner().invoke(main, ["lint", ITEM_SYNC, "--annotate", str(out), "--fail-on", "never"])
    assert result.exit_code == 0, result.output
    events = orjson.loads(out.read_bytes())["traceEvents"]
    names = [e for e in events if e.get("ph") == "M" and "critical path" in str(e.get("args", {}).get("name"))]
    assert names
    track = names[0]["tid"]
    path = [e for e in events if e.get("ph") == "X" and e.get("tid") == track and e.get("pid") == names[0]["pid"]]
    # A CPU-bound step: its path is mostly the CPU's own work, drawn on the trace's timeline in order.
    assert any(e["name"].startswith("cpu: ") for e in path)
    starts = [e["ts"] for e in path if e["args"]["step"] == path[0]["args"]["step"]]
    assert starts == sorted(starts)
