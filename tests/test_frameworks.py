"""Fixes in a framework's own terms (rules/frameworks.toml), on H200 traces captured with with_stack=True."""

from __future__ import annotations

from typing import Any

from conftest import sample

from attntrace.model.loading import load
from attntrace.report.engine import lint_trace


def _at402_over_75() -> Any:
    """Settings with AT402's threshold at 75%: inside the range (72% to 81%) of compiled ViT-S's idle."""
    from attntrace.checks.catalog import load_rules
    from attntrace.report.engine import default_settings

    settings = default_settings(load_rules())
    settings.params["AT402"]["min_idle_share"] = 0.75
    return settings


def _ranged(name: str) -> dict[str, Any]:
    """The AT402 finding of a trace linted with the threshold at 75%."""
    report = lint_trace(load(sample(name)), _at402_over_75())
    return next(f for f in report.findings if f["rule"] == "AT402")


def _by_rule(name: str) -> dict[str, dict[str, Any]]:
    return {f["rule"]: f for f in lint_trace(load(sample(name))).findings}


def test_generate_gets_the_static_cache_and_compile_switch():
    found = _by_rule("calibration/llama_generate.shapes_stack")
    assert found["AT501"]["where"]["framework"] == "transformers generate()"
    assert found["AT402"]["fix"].startswith("For `generate()`")
    assert found["AT501"]["fix"].startswith("For `generate()`, compile the decode step with a static cache")
    assert "In plain PyTorch:" in found["AT501"]["fix"]


def test_eager_attention_in_transformers_gets_attn_implementation():
    found = _by_rule("calibration/llama_train_eager.shapes_stack")
    assert 'attn_implementation="sdpa"' in found["AT102"]["fix"]
    # Eager training passes through torch._dynamo's decorators (the optimizer), but is not compiled code.
    assert found["AT402"]["where"].get("framework") != "torch.compile"


def test_compiled_code_is_not_told_to_compile():
    found = _by_rule("calibration/llama_train_compiled.shapes_stack")
    assert found["AT402"]["where"]["framework"] == "torch.compile"
    assert found["AT402"]["fix"].startswith("This code is compiled already")


def test_plain_pytorch_and_traces_without_stacks_keep_the_plain_fix():
    item = _by_rule("calibration/gpt2_train_item.shapes_stack")["AT302"]
    assert "framework" not in item["where"] and item["fix"].startswith("Keep the value on the GPU")
    assert all("framework" not in f["where"] for f in _by_rule("calibration/llama_generate.shapes").values())


def test_compiled_code_recorded_without_stacks_is_known_by_its_ops():
    # Inductor records a `triton_*` op per kernel in every setting: a plain capture of a compiled GPT-2 step was
    # told to "Fuse small ops (`torch.compile`)".
    found = _by_rule("compiled/gpt2_train_compiled_b16.plain")
    assert found["AT402"]["where"]["framework"] == "torch.compile"
    assert found["AT402"]["fix"].startswith("This code is compiled already")
    assert all(f["where"].get("framework") != "torch.compile"
               for f in _by_rule("calibration/llama_train_eager.plain").values())


def test_an_idle_of_the_profilers_own_cost_gets_no_framework_switch():
    # "This code is compiled already: `mode="reduce-overhead"` removes the launch gaps... In plain PyTorch:
    # Nothing to fix" recommended a change and then said there was nothing to fix.
    idle = _by_rule("from_trace/llama_generate_eager")["AT402"]
    assert idle["evidence"]["profiler_only"]
    assert "framework" not in idle["where"] and idle["fix"].startswith("Time the step without the profiler")
    # Nor one whose idle is under its threshold at the estimate (compiled code under with_stack, GPU busy 85% of the
    # un-profiled step), nor one that cannot tell (its range straddles the threshold): their fix is a capture it can
    # judge.
    idle = _by_rule("gpu_bound/llama_train_b8_compiled.shapes_stack")["AT402"]
    assert idle["evidence"]["profiler_only"] and idle["severity"] == "info"
    assert "framework" not in idle["where"] and idle["fix"].startswith("Time the step without the profiler")
    idle = _ranged("compiled/vit_small_train_compiled.shapes_stack")
    assert idle["evidence"]["undetermined"] and idle["severity"] == "info"
    assert "framework" not in idle["where"] and idle["fix"].startswith("Capture this program again with")


def test_an_idle_under_the_threshold_without_the_profiler_says_what_is_left():
    # Llama generate(): 43% idle as recorded, ~28% estimated without the profiler. The finding said the recorded
    # idle was "mostly the profiler's own cost" (the profiler was 48% of it) and that nothing was to fix, while
    # 149 ms of idle per step were left. It says what is left, and promises no saving.
    trace = lint_trace(load(sample("from_trace/llama_generate_eager")))
    (idle,) = [f for f in trace.findings if f["rule"] == "AT402"]
    assert idle["severity"] == "info" and idle["evidence"]["profiler_only"]
    assert idle["impact"]["gpu_us_per_step"] == 0 and idle["evidence"]["est_idle_us_per_step"] > 100_000
    assert "under the 30% this rule warns at" in idle["message"] and "mostly" not in idle["message"]
    assert "~28% without the profiler" in idle["message"] and idle["fix"].count("~28% idle") == 1
    # Nor does an AT402 that cannot tell, whose impact is its central estimate: the trace's total leaves it out
    # (compiled ViT-S under with_stack, judged at a threshold inside its range: 16 ms of estimated idle).
    undetermined = lint_trace(load(sample("compiled/vit_small_train_compiled.shapes_stack")), _at402_over_75())
    (idle,) = [f for f in undetermined.findings if f["rule"] == "AT402"]
    assert idle["evidence"]["undetermined"] and idle["impact"]["gpu_us_per_step"] > 10_000
    assert "lower end is under the 75% this rule warns at, so this is info, not a warning" in idle["message"]
    assert undetermined.info["impact_gpu_us_per_step"] == sum(
        f["impact"]["gpu_us_per_step"] for f in undetermined.findings if f["rule"] != "AT402")


def test_a_transformers_model_outside_generate_and_the_trainer_is_not_told_to_use_them():
    # A no_grad BERT forward and a hand-written Llama training loop: AT402's fix told them to compile generate()'s
    # decode step with a static cache and to pass arguments to a Trainer they do not use.
    for name in ("calibration/bert_infer_fp16.shapes_stack", "calibration/llama_train_eager.shapes_stack"):
        idle = _by_rule(name)["AT402"]
        assert "generate()" not in idle["fix"] and "Trainer(" not in idle["fix"]
        assert idle["where"].get("framework") is None
