"""The profiler's own cost: settings read from every trace generation, the replay of a step without the profiler
on real traces (a sync, two streams, a graph launch, a CPU-only step), and the verdicts of AT402, AT501 and AT302
judged on it, checked against the same programs timed without the profiler on the H200
(sample_traces/calibration/timings.json, sample_traces/from_trace/*_timing.json, and the held-out set that no
fit has seen, sample_traces/heldout/timings.json)."""

from __future__ import annotations

import gzip
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import CORPUS, DATA, SAMPLES, sample

from attntrace.api import lint as lint_api
from attntrace.api import summarize as summarize_api
from attntrace.checks.config import ConfigError, read_config_file
from attntrace.cli import main
from attntrace.model.loading import load
from attntrace.model.replay import ProfilerCosts, replay

CALIBRATION = SAMPLES / "calibration"
FROM_TRACE = SAMPLES / "from_trace"
TIMINGS = orjson.loads((CALIBRATION / "timings.json").read_bytes())
FLAGS = ("record_shapes", "with_stack", "profile_memory", "with_modules", "with_flops")


def calibration(name: str) -> str:
    return str(CALIBRATION / f"{name}.pt.trace.json.gz")


def invoke(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def truth_us(workload: str, setting: str) -> float:
    paired = TIMINGS[workload]["settings"][setting]
    return (paired["unprofiled_before_ms"] + paired["unprofiled_after_ms"]) / 2 * 1e3


def header(path: Path) -> dict:
    raw = path.read_bytes()
    doc = orjson.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)
    return doc if isinstance(doc, dict) else {}


def test_settings_come_from_the_header_when_it_has_them_and_from_events_otherwise():
    # tests/data holds corpus traces of several Kineto generations (PyTorch 1.8 to 2.x, ROCm, TraceLens), so this
    # runs in CI too; ../shared/corpus/peer adds the rest where it is present.
    peer = sorted(p for p in CORPUS.iterdir() if p.name.endswith((".json", ".json.gz"))) if CORPUS.is_dir() else []
    traces = [*peer, *sorted((SAMPLES / "calibration").glob("*.shapes_stack.pt.trace.json.gz")),
              *sorted(DATA.glob("*.json.gz"))]
    sources = set()
    for path in traces:
        trace = load(str(path))
        settings = trace.replay.settings
        raw = header(path)
        if any(raw.get(flag) for flag in FLAGS):
            assert settings["source"] == "header", path
            assert {f: settings[f] for f in FLAGS} == {f: bool(raw.get(f)) for f in FLAGS}, path
        else:
            assert settings["source"] == "events", path
            assert settings["record_shapes"] == trace.has_shapes, path
            assert settings["with_stack"] == (trace.python.height > 0), path
        sources.add(settings["source"])
    assert sources == {"header", "events"}  # both generations are in the set


def test_a_gpu_bound_step_replays_at_its_gpu_time():
    # big_gemm: four 8192^2 GEMMs per step, the CPU far ahead of the GPU; 6.50 ms per step without the profiler.
    table = load(calibration("big_gemm.plain")).replay.per_device().row(0, named=True)
    assert table["est_step_us"] == pytest.approx(truth_us("big_gemm", "plain"), rel=0.05)
    assert table["est_idle_us"] < 0.02 * table["est_step_us"]


def test_a_launch_bound_step_shrinks_by_the_profilers_cost_and_stays_launch_bound():
    trace = load(calibration("tiny_ops.plain"))
    row = trace.replay.per_device().row(0, named=True)
    assert row["est_step_us"] < 0.85 * row["recorded_us"]  # the profiler's cost is taken out
    # Within issue 22's 15% (-2% on the set captured pinned to two cores; tools/fit_profiler_cost.py).
    assert row["est_step_us"] == pytest.approx(truth_us("tiny_ops", "plain"), rel=0.15)
    assert row["est_idle_us"] > 0.8 * row["est_step_us"]  # and the GPU still waits for the CPU


def test_a_sync_waits_for_the_replayed_gpu_and_its_idle_after_is_what_removing_it_saves():
    trace = load(calibration("mlp_item_sync.plain"))  # four loss.item() per step
    result = trace.replay
    assert len(result.idle_after_sync) >= 4 * result.table.height
    row = result.per_device().row(0, named=True)
    assert row["est_step_us"] == pytest.approx(truth_us("mlp_item_sync", "plain"), rel=0.2)
    assert 0 < sum(result.idle_after_sync.values()) < sum(result.table["est_step_us"])


def test_two_streams_keep_their_dependency():
    # A side stream's GEMMs, then the main stream waits for them: the step cannot be shorter than that chain.
    trace = load(calibration("two_streams.plain"))
    row = trace.replay.per_device().row(0, named=True)
    assert row["est_step_us"] >= 0.99 * row["gpu_busy_us"]
    assert row["est_step_us"] <= row["recorded_us"] * 1.05
    # The main stream's elementwise kernels wait for the side stream's GEMM to leave the SMs: that wait is the
    # GPU's and stays (dropping it made the step 33% shorter than the timed one).
    assert row["est_step_us"] == pytest.approx(truth_us("two_streams", "plain"), rel=0.05)


def test_a_graph_launch_is_charged_for_each_of_its_kernels():
    trace = load(calibration("cuda_graph.plain"))
    costs = ProfilerCosts.default()
    without = replay(trace, ProfilerCosts.from_table({"graph_kernel_us": 0.0}, costs)).per_device()
    with_graph = trace.replay.per_device()
    assert with_graph["profiler_cpu_us"][0] > without["profiler_cpu_us"][0] + 50  # ~200 kernels per replay
    assert with_graph["est_step_us"][0] == pytest.approx(truth_us("cuda_graph", "plain"), rel=0.15)


def test_a_cpu_only_trace_says_why_there_is_no_replay():
    trace = load(calibration("cpu_only.plain"))
    assert trace.replay.reason and "CPU-only" in trace.replay.reason
    report = lint_api(calibration("cpu_only.plain"), select="AT402,AT501")
    assert not report.findings
    reasons = {s["rule"]: s["reason"] for s in orjson.loads(report.to_json())["skipped"]}
    assert set(reasons) == {"AT402", "AT501"}


@pytest.mark.parametrize("model", ["llama_train", "gpt2_train", "bert_infer"])
def test_held_out_models_replay_within_15_percent_of_their_unprofiled_step(model):
    for impl in ("eager", "sdpa"):
        truth = orjson.loads((FROM_TRACE / f"{model}_timing.json").read_bytes())[f"{impl}_ms_per_step"] * 1e3
        row = load(str(FROM_TRACE / f"{model}_{impl}.pt.trace.json.gz")).replay.per_device().row(0, named=True)
        assert row["est_step_us"] == pytest.approx(truth, rel=0.15), impl


def test_gpu_idle_is_no_warning_where_the_gpu_is_busy_without_the_profiler():
    # BERT forward: the GPU is busy 98% of the step timed without the profiler; the recorded trace's CPU ran ahead.
    report = lint_api(str(FROM_TRACE / "bert_infer_eager.pt.trace.json.gz"), select="AT402")
    assert not [f for f in report.findings if f.severity == "warning"]


def test_compiled_code_pays_for_inductors_profiler_only_launch_path_and_reads_busy():
    # torch.compile'd Llama training, batch 8, record_shapes and with_stack: 31 ms a step under the profiler, 12.3 ms
    # without it, the GPU busy 10.4 ms of that. Inductor's launcher does extra work per Triton kernel only while the
    # profiler runs; without that cost the replay said 22.7 ms and AT402 warned of 54% idle.
    path = str(SAMPLES / "gpu_bound" / "llama_train_b8_compiled.shapes_stack.pt.trace.json.gz")
    timed = orjson.loads((SAMPLES / "gpu_bound" / "timings.json").read_bytes())["llama_train_b8_compiled"]
    truth = sum(timed["settings"]["shapes_stack"][k] for k in ("unprofiled_before_ms", "unprofiled_after_ms")) * 500
    trace = load(path)
    # +15% in this capture (+8 and +9% in the two others of its sitting, sample_traces/calibration/rounds_results.json)
    assert trace.replay.per_device()["est_step_us"][0] == pytest.approx(truth, rel=0.2)
    without = replace(ProfilerCosts.default(), inductor_kernel_us=0.0, inductor_kernel_shapes_us=0.0,
                      inductor_kernel_stack_us=0.0, inductor_wrapper_event_us=0.0, inductor_wrapper_statement_us=0.0)
    assert replay(trace, without).per_device()["est_step_us"][0] > 1.5 * truth
    report = lint_api(path, select="AT402")
    assert not [f for f in report.findings if f.severity == "warning"]


def test_compiled_code_pays_for_inductors_launch_path_without_shapes_or_stacks():
    # torch.compile'd GPT-2 training, batch 16, captured plain: 29 ms a step under the profiler, 18.2 ms without it.
    # Inductor's launcher leaves its fast path whenever the profiler is on, whatever the settings; without that
    # cost the replay said +20% (+20, +18, +20% in the three rounds, sample_traces/calibration/rounds_results.json).
    folder = SAMPLES / "compiled"
    timed = orjson.loads((folder / "timings.json").read_bytes())["gpt2_train_compiled_b16"]["settings"]["plain"]
    truth = (timed["unprofiled_before_ms"] + timed["unprofiled_after_ms"]) * 500
    trace = load(str(folder / "gpt2_train_compiled_b16.plain.pt.trace.json.gz"))
    assert not trace.replay.settings["record_shapes"] and not trace.replay.settings["with_stack"]
    assert trace.replay.per_device()["est_step_us"][0] == pytest.approx(truth, rel=0.1)
    without = replace(ProfilerCosts.default(), inductor_kernel_us=0.0)
    assert replay(trace, without).per_device()["est_step_us"][0] > 1.15 * truth


def test_compiled_code_under_with_stack_pays_by_the_length_of_inductors_wrapper():
    # torch.compile'd ViT-S training, record_shapes and with_stack: 78 ms a step under the profiler, 18.1 ms without
    # it, the GPU busy 5.0 ms. Its wrappers are long (980 and 1,435 statements), and under with_stack the time
    # between two of their statements grows with that length: a flat cost per Triton kernel (60 us, which fitted
    # Llama's short wrappers) left the replay at +54%.
    folder = SAMPLES / "compiled"
    timed = orjson.loads((folder / "timings.json").read_bytes())["vit_small_train_compiled"]["settings"]
    truth = (timed["shapes_stack"]["unprofiled_before_ms"] + timed["shapes_stack"]["unprofiled_after_ms"]) * 500
    trace = load(str(folder / "vit_small_train_compiled.shapes_stack.pt.trace.json.gz"))
    assert trace.replay.settings["with_stack"]
    assert trace.replay.per_device()["est_step_us"][0] == pytest.approx(truth, rel=0.2)  # +14%
    flat = replace(ProfilerCosts.default(), inductor_wrapper_event_us=0.0, inductor_wrapper_statement_us=0.0,
                   inductor_kernel_stack_us=60.0)
    assert replay(trace, flat).per_device()["est_step_us"][0] > 1.4 * truth
    # The GPU is idle 72% of the timed step. The idle it estimates (16 ms) is 23% over the real idle, the replay's
    # +14% on a step that is mostly idle; with the flat cost it was 1.75x the real idle. The profiler's cost is
    # 2.8x the step. On the calibration captures of compiled code with stacks its real cost was 0.89x to 1.05x the
    # estimate's (quartiles, attntrace/profiler_spread.toml): the idle lies at 72% to 82% of the step, all of it over
    # the threshold, a warning that gives its range. (A fixed quarter either way, as before, made it 18% to 86%: info
    # that could not tell, while the GPU idles 72% of the timed step.)
    (finding,) = orjson.loads(lint_api(str(folder / "vit_small_train_compiled.shapes_stack.pt.trace.json.gz"),
                                       select="AT402").to_json())["findings"]
    real_idle = truth - trace.replay.per_device()["gpu_busy_us"][0]
    assert finding["severity"] == "warning" and not finding["evidence"]["undetermined"]
    assert "(estimated: 16 ms of 21 ms; likely 72% to 81%)" in finding["message"]
    assert finding["impact"]["gpu_us_per_step"] == pytest.approx(real_idle, rel=0.25)
    low, high = finding["evidence"]["est_idle_share_range"]
    assert low - 0.01 < real_idle / truth < high


def test_gpu_idle_fires_with_both_figures_where_the_program_really_waits():
    report = orjson.loads(lint_api(calibration("llama_train_sdpa.shapes_stack"), select="AT402").to_json())
    (finding,) = report["findings"]
    assert finding["severity"] == "warning"
    assert "without the profiler (estimated" in finding["message"] and "as recorded" in finding["message"]
    assert "record_shapes and with_stack cost" in finding["message"]
    impact, evidence = finding["impact"], finding["evidence"]
    assert impact["saving"] == "idle removed" and impact["assumption"]
    assert impact["step_us"] == pytest.approx(evidence["est_step_us"], rel=1e-3)
    assert evidence["est_idle_share"] < evidence["recorded_idle_share"]


def test_idle_that_is_the_profilers_own_is_info_not_a_warning():
    # One SDPA call per step captured by `attntrace run`: idle as recorded, back to back without the profiler in
    # one capture; the same program captured twice gets the same verdict.
    for folder in ("bf16_causal_fwd", "bf16_causal_fwd_v2"):
        report = lint_api(str(SAMPLES / folder / "sdpa.pt.trace.json.gz"), select="AT402")
        assert not [f for f in report.findings if f.severity == "warning"], folder


def test_launch_overhead_still_fires_on_a_launch_bound_decode_loop():
    report = orjson.loads(lint_api(calibration("llama_generate.shapes"), select="AT501").to_json())
    (finding,) = report["findings"]
    assert finding["severity"] == "warning"
    evidence = finding["evidence"]
    assert evidence["launch_cpu_us_per_step"] < evidence["recorded_launch_cpu_us_per_step"]
    assert evidence["launch_cpu_us_per_step"] > evidence["gpu_busy_us_per_step"]


def test_launch_overhead_is_silent_on_a_gpu_bound_step():
    assert not lint_api(calibration("big_gemm.shapes"), select="AT501").findings


def test_host_sync_idle_is_judged_without_the_profiler():
    report = orjson.loads(lint_api(calibration("mlp_item_sync.plain"), select="AT302").to_json())
    (finding,) = [f for f in report["findings"] if "item" in f["where"]["op_chain"]]
    evidence = finding["evidence"]
    assert evidence["without_profiler"] is True
    assert 0 < evidence["gpu_idle_us_per_step"] < evidence["recorded_gpu_idle_us_per_step"]
    assert finding["impact"]["saving"] == "idle removed"


def test_summary_json_carries_the_profiler_contract():
    result = invoke("summary", calibration("llama_train_sdpa.shapes_stack"), "--format", "json")
    profiler = orjson.loads(result.stdout_bytes)["traces"][0]["profiler"]
    assert {"settings", "cpu_us_per_step", "est_step_us", "recorded_step_us"} <= set(profiler)
    assert profiler["settings"]["record_shapes"] and profiler["settings"]["with_stack"]
    assert 0 < profiler["est_step_us"] < profiler["recorded_step_us"]
    assert profiler["cpu_us_per_step"] > 0
    steps = orjson.loads(result.stdout_bytes)["traces"][0]["per_step"]
    assert steps and all(0 < row["est_step_us"] <= row["recorded_step_us"] for row in steps)
    # The profiler line's medians are over the steady steps, which the rows mark: the line can be checked against
    # them (it could not: flex's line said 0.324 ms beside rows of 0.907, 0.615 and 0.324 ms).
    flex = orjson.loads(invoke("summary", sample("bf16_window_fwd/flex"), "--format", "json").stdout_bytes)["traces"][0]
    marked = [row["step"] for row in flex["per_step"] if row["steady"]]
    assert marked == [3]  # the first two ran slow (0.907 and 0.615 ms against 0.324)
    (row,) = [row for row in flex["per_step"] if row["steady"]]
    assert flex["profiler"]["recorded_step_us"] == row["recorded_step_us"]
    text = invoke("summary", calibration("llama_train_sdpa.shapes_stack")).output
    words = " ".join(text.split())  # the profiler line is folded to the terminal's width
    assert "estimated without the profiler" in words and "step ms as recorded" in text
    assert "est. ms w/o profiler" in text
    assert "medians of the steady steps, marked *" in words and "\n  1 *     " in text
    flex_text = invoke("summary", sample("bf16_window_fwd/flex")).output
    assert "\n  1       " in flex_text and "\n  3 *     " in flex_text


def test_summary_never_estimates_a_step_longer_than_recorded_where_the_gpu_runs_behind():
    # HTA's trace-diff test trace: the GPU a step behind, each step's kernels spread over the next windows; the
    # medians of the windows alone (116.9 ms) came out under the median estimate (122.2 ms).
    trace = DATA / "hta_trace_diff_v100.json.gz"
    profiler = orjson.loads(invoke("summary", str(trace), "--format", "json").stdout_bytes)["traces"][0]["profiler"]
    assert profiler["gpu_busy_us"] <= profiler["est_step_us"] <= profiler["recorded_step_us"]


def test_the_config_sets_the_costs_and_bad_costs_are_one_line(tmp_path):
    config = tmp_path / "attntrace.toml"
    config.write_text("[profiler_cost]\ncpu_op_us = 0.0\nruntime_call_us = 0.0\npython_function_us = 0.0\n"
                      "cpu_op_shapes_us = 0.0\ncpu_op_stack_us = 0.0\ngraph_kernel_us = 0.0\n")
    free = orjson.loads(lint_api(calibration("tiny_ops.plain"), select="AT402", config=str(config)).to_json())
    default = orjson.loads(lint_api(calibration("tiny_ops.plain"), select="AT402").to_json())
    assert free["traces"][0]["summary"]["profiler"]["cpu_us_per_step"] == 0
    assert (free["findings"][0]["evidence"]["est_step_us"]
            > default["findings"][0]["evidence"]["est_step_us"])
    config.write_text("[profiler_cost]\ncpu_op_us = -1\n")
    with pytest.raises(ConfigError, match="cpu_op_us"):
        read_config_file(config)
    config.write_text("[profiler_cost]\nop_us = 1\n")
    with pytest.raises(ConfigError, match="unknown key"):
        read_config_file(config)


def test_summary_uses_the_costs_lint_uses(tmp_path, monkeypatch):
    # `run --calibrate-profiler` writes the costs to pyproject.toml; summary read only the defaults, so its step
    # without the profiler disagreed with lint's for the same trace.
    (tmp_path / "pyproject.toml").write_text("[tool.attntrace.profiler_cost]\ncpu_op_us = 1.0\n"
                                             "runtime_call_us = 0.5\n")
    monkeypatch.chdir(tmp_path)
    trace = calibration("tiny_ops.plain")
    summarized = orjson.loads(invoke("summary", trace, "--format", "json").stdout_bytes)["traces"][0]["profiler"]
    linted = orjson.loads(invoke("lint", trace, "--format", "json", "--fail-on", "never").stdout_bytes)
    assert summarized["costs_from"] == "config"
    assert summarized == linted["traces"][0]["summary"]["profiler"]
    from_python = summarize_api(trace, config=tmp_path / "pyproject.toml").data["profiler"]
    assert from_python["costs_from"] == "config" and from_python["est_step_us"] == summarized["est_step_us"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[profiler_cost]\ncpu_op_us = -1\n")
    result = invoke("summary", trace, "--config", str(bad))
    assert result.exit_code == 2 and "cpu_op_us" in result.output and "Traceback" not in result.output


def test_calibrate_profiler_writes_the_costs_where_lint_reads_them(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    project = tmp_path / "pyproject.toml"
    project.write_text('[project]\nname = "x"\n\n[tool.attntrace.profiler_cost]\ncpu_op_us = 99.0\n'
                       '[tool.attntrace.profiler_cost.measured_on]\nhost = "old"\n\n[tool.other]\na = 1\n')
    monkeypatch.chdir(tmp_path)
    result = invoke("run", "--calibrate-profiler", "--device", "cpu", "--write")
    assert result.exit_code == 0, result.output
    assert f"written to {project}" in result.output and "lint applies them to CPU traces only" in result.output
    text = project.read_text()
    assert text.startswith('[project]\nname = "x"\n') and "[tool.other]\na = 1\n" in text
    assert text.count("[tool.attntrace.profiler_cost]") == 1 and "99.0" not in text and '"old"' not in text
    # Measured on the CPU alone, no launch was timed: no launch time is written to scale GPU traces by (one from the
    # op loop, 1.1 us, scaled every GPU trace 3x), and lint says whose costs its estimate used.
    assert "launch_call_us" not in text
    # Nor are a CPU's costs applied to a GPU trace at all: it keeps the defaults, and says why.
    gpu_trace = calibration("tiny_ops.plain")
    linted = orjson.loads(invoke("lint", gpu_trace, "--format", "json", "--select", "AT402",
                                 "--fail-on", "never").stdout_bytes)
    project.write_text('[project]\nname = "x"\n')
    default = orjson.loads(invoke("lint", gpu_trace, "--format", "json", "--select", "AT402",
                                  "--fail-on", "never").stdout_bytes)
    assert linted["traces"][0]["summary"]["profiler"]["est_step_us"] == \
        default["traces"][0]["summary"]["profiler"]["est_step_us"]
    assert linted["traces"][0]["summary"]["profiler"]["costs_from"] == (
        "defaults (attntrace/profiler_cost.toml); the config's were measured on a CPU, not applied to a GPU trace")
    (idle,) = linted["findings"]
    assert "the config's were measured on a CPU, not applied to a GPU trace" in idle["impact"]["assumption"]
    project.write_text(text)
    costs = read_config_file(project)["profiler_cost"]
    assert set(costs) == {*ProfilerCosts.__dataclass_fields__} - {"launch_call_us"}
    assert costs["measured_on"]["device"] == "cpu" and costs["measured_on"]["loops"]["cpu_op_us"] > 0


def test_calibrate_profiler_writes_nothing_unless_asked(tmp_path, monkeypatch):
    """It wrote the current directory's pyproject.toml (or created one) unasked: without --write it prints the
    costs and says where --write would put them. (The measurement is the one the test above makes; here only
    what the command does with its result matters, so this one is taken from a measurement's shape.)"""
    pytest.importorskip("torch")
    from attntrace.capture import profiler_cost

    measured = {"costs": {"cpu_op_us": 2.0}, "loops": {"cpu_op_us": 1.0},
                "measured_on": {"host": "here", "device": "cpu"}}
    monkeypatch.setattr(profiler_cost, "measure", lambda device: measured)
    monkeypatch.chdir(tmp_path)
    shown = invoke("run", "--calibrate-profiler", "--device", "cpu")
    assert shown.exit_code == 0, shown.output
    assert not (tmp_path / "pyproject.toml").exists() and "[tool.attntrace.profiler_cost]" in shown.output
    assert f"not written: add --write to put them into {tmp_path / 'pyproject.toml'}" in shown.output
    assert invoke("run", "--write").exit_code == 2  # --write alone is a usage error


def test_calibrate_profiler_on_a_machine_without_cuda_refuses_cuda(tmp_path, monkeypatch):
    # It measured the CPU instead and exited 0: costs without runtime calls, written as the GPU machine's.
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    project = tmp_path / "pyproject.toml"
    project.write_text('[project]\nname = "x"\n')
    monkeypatch.chdir(tmp_path)
    result = invoke("run", "--calibrate-profiler", "--device", "cuda")
    assert result.exit_code == 2
    assert "sees no CUDA device" in result.output and len(result.output.strip().splitlines()) == 1
    assert project.read_text() == '[project]\nname = "x"\n'


def test_the_costs_follow_the_hosts_launch_time():
    # The same program captured twice (bf16_causal_fwd vs _v2): v2's launch calls took ~2x as long, and so did
    # the profiler's cost; scaling by the trace's own launch time brings v2's replay near the timed 0.099 ms.
    v1 = load(sample("bf16_causal_fwd/sdpa")).replay
    v2 = load(sample("bf16_causal_fwd_v2/sdpa")).replay
    assert v1.host_factor == pytest.approx(1.2, abs=0.15) and v2.host_factor == pytest.approx(2.5, abs=0.3)
    est = float(v2.per_device()["est_step_us"].max())
    assert est == pytest.approx(99.3, rel=0.15)
    off = ProfilerCosts.from_table({"cpu_op_us": 2.0})  # a config without launch_call_us: no scaling
    assert off.scaled_for(12.0) == (off, 1.0)


@pytest.mark.parametrize("variant", ["naive", "naive_inplace", "sdpa_math", "sdpa_efficient", "sdpa_flash",
                                     "sdpa_cudnn", "sdpa", "compiled", "flex", "triton"])
def test_the_same_program_captured_twice_gets_the_same_verdicts(variant):
    from attntrace.report.engine import lint_trace

    def verdicts(directory: str) -> list[tuple[str, str]]:
        report = lint_trace(load(sample(f"{directory}/{variant}")))
        return sorted((f["rule"], f["severity"]) for f in report.findings if "cause" not in f)

    assert verdicts("bf16_causal_fwd") == verdicts("bf16_causal_fwd_v2")


# --- sample_traces/heldout: captured and timed like the calibration set, never used to fit the costs ---------
HELD_OUT = SAMPLES / "heldout"


def _held_out(name: str) -> tuple[str, float]:
    workload, setting = name.split(".")
    paired = orjson.loads((HELD_OUT / "timings.json").read_bytes())[workload]["settings"][setting]
    truth = (paired["unprofiled_before_ms"] + paired["unprofiled_after_ms"]) / 2 * 1e3
    return str(HELD_OUT / f"{name}.pt.trace.json.gz"), truth


@pytest.mark.parametrize("setting", ["plain", "shapes", "shapes_stack"])
def test_a_launch_bound_decode_loop_held_out_is_still_launch_bound(setting: str):
    # GPT-2 generate(), batch 4, 24 tokens: the GPU is busy 7% of the timed step.
    path, truth = _held_out(f"gpt2_generate.{setting}")
    report = orjson.loads(lint_api(path, select="AT402,AT501").to_json())
    (idle,) = report["findings"]
    assert idle["rule"] == "AT402" and idle["severity"] == "warning"
    assert [c["rule"] for c in idle["consequences"]] == ["AT501"]
    real_idle = truth - load(path).replay.per_device()["gpu_busy_us"].max()
    # Where idle dominates, issue 22 asks for 20% of the real idle: met with record_shapes (-2%), not yet plain
    # (-22%) nor with_stack (+32%). This holds what is met, and fails if any of them drifts further.
    assert abs(idle["impact"]["gpu_us_per_step"] / real_idle - 1) < (0.2 if setting == "shapes" else 0.35)


def test_held_out_replays_stay_near_the_timed_step():
    # Inference (ResNet-18 fp32) and training (ViT-S) with shapes: within 15% of the timed step.
    for name in ("resnet18_infer_fp32.plain", "resnet18_infer_fp32.shapes", "resnet18_infer_fp32.shapes_stack",
                 "vit_small_train.shapes"):
        path, truth = _held_out(name)
        est = load(path).replay.per_device()["est_step_us"].max()
        assert abs(est / truth - 1) <= 0.15, name


def test_compiled_code_under_with_stack_says_its_estimate_is_the_least_certain():
    # Under with_stack, compiled code's profiler cost can be several times the program (ResNet-50: 150 ms recorded,
    # 30 ms timed), so a small error in it is a large one in the step: AT402 says so where it judges compiled code
    # recorded with stacks, and nowhere else.
    def assumption(path: str) -> str:
        (finding,) = orjson.loads(lint_api(path, select="AT402").to_json())["findings"]
        return finding["impact"]["assumption"]

    assert "least certain" in assumption(calibration("llama_train_compiled.shapes_stack"))
    assert "least certain" not in assumption(calibration("llama_train_compiled.shapes"))
    assert "least certain" not in assumption(calibration("llama_train_sdpa.shapes_stack"))
