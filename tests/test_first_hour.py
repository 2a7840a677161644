"""Small things a new user met in the first hour: one step time in `diff`, plurals, an eager trace's attention
line beside its unfused-attention finding, and no far-fetched option suggestion."""

from __future__ import annotations

from click.testing import CliRunner
from conftest import sample

from attntrace.cli import main


def _text(*args: str) -> str:
    return CliRunner().invoke(main, list(args)).output


def test_diff_shows_one_step_time():
    """The table's step_us was the mean of all steps (-94.7%) under the line of the steady steps' medians (-95.7%)
    that diff judges: two step times for one change."""
    out = _text("diff", sample("bf16_causal_fwd/naive"), sample("bf16_causal_fwd/sdpa"))
    assert "step_us" not in out and out.count("step time") == 1
    assert "gpu_busy_us" in out  # the rest of the table stays


def test_counts_of_one_are_singular():
    one_step = _text("lint", "--fail-on", "never", sample("from_trace/llama_generate_sdpa"))
    assert "(NVIDIA H200, 1 step," in one_step and "1 steps" not in one_step
    one_consequence = _text("lint", "--fail-on", "never", sample("workloads/launch_bound_tiny_ops"))
    assert one_consequence.rstrip().endswith("(1 consequence inside them)")
    several = _text("lint", "--fail-on", "never", sample("bf16_causal_fwd/sdpa_math"))
    assert "(NVIDIA H200, 3 steps," in several and "consequences inside them)" in several


def test_an_unfused_attention_is_not_none_found():
    out = _text("lint", "--fail-on", "never", sample("bf16_causal_fwd/naive"))
    assert "attention: unfused (AT102)" in out and "none found" not in out
    tiny_ops = _text("lint", "--fail-on", "never", sample("workloads/launch_bound_tiny_ops"))
    assert "attention: no SDPA op or fused kernel" in tiny_ops


def test_an_unknown_option_gets_only_a_close_suggestion():
    bogus = CliRunner().invoke(main, ["lint", "--bogus", "x"])
    assert bogus.exit_code == 2 and "No such option '--bogus'" in bogus.output and "--jobs" not in bogus.output
    typo = CliRunner().invoke(main, ["lint", "--selct", "AT1", "x"])
    assert "'--select'" in typo.output


def test_every_error_line_starts_with_one_prefix(tmp_path):
    # A missing file in diff (a click error) read "Error:", lint's and summary's "error:": a CI step grepped one.
    missing = str(tmp_path / "missing.json")
    for args in (["diff", missing, sample("bf16_causal_fwd/naive")], ["lint", missing], ["summary", missing],
                 ["lint", "--bogus"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and result.stderr.startswith("error: "), (args, result.stderr)


def test_summary_folds_its_sentences_and_keeps_each_critical_path_part_whole():
    # Summary lines ran to 371 columns; folded at spaces, "gpu: copy 0.053 (8%)" came out as "gpu:" / "copy ...".
    out = CliRunner().invoke(main, ["summary", sample("bf16_causal_fwd/naive")], env={"COLUMNS": "60"}).stdout
    prose = out.split("\n  step ")[0].splitlines()[1:]  # the lines above the per-step table
    assert len(prose) > 8 and all(len(line) <= 100 for line in prose)
    assert not any(line.rstrip().endswith("gpu:") for line in prose)
    path = " ".join(" ".join(line.split()) for line in prose if "critical path" in line or line.startswith("    gpu"))
    assert "gpu: elementwise 0.969 (42%)" in path and "gpu: reduction 0.740 (32%)" in path
