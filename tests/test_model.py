"""The model's numbers on a real H200 trace, checked against values computed straight from the raw JSON."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from conftest import sample

from attntrace.model.loading import load

NAIVE = sample("bf16_causal_fwd/naive")


@pytest.fixture(scope="module")
def raw() -> list[dict]:
    with gzip.open(NAIVE, "rt") as fh:
        return json.load(fh)["traceEvents"]


@pytest.fixture(scope="module")
def trace():
    return load(NAIVE)


def _steps(raw: list[dict]) -> dict[int, tuple[float, float]]:
    return {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in raw
            if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")}


def _gpu_by_step(raw: list[dict]) -> dict[int, list[dict]]:
    """GPU events grouped by the step of the launch call that shares their correlation id."""
    steps = _steps(raw)
    launch_step = {}
    for e in raw:
        if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver":
            for step, (start, end) in steps.items():
                if start <= e["ts"] <= end:
                    launch_step[e["args"]["correlation"]] = step
    out: dict[int, list[dict]] = {s: [] for s in steps}
    for e in raw:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            step = launch_step.get(e["args"]["correlation"])
            if step is not None:
                out[step].append(e)
    return out


def _union(intervals: list[tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    return total + (cur_end - cur_start if cur_end is not None else 0.0)


def test_steps(trace, raw):
    assert trace.steps["step"].to_list() == sorted(_steps(raw)) == [1, 2, 3]


def test_kernels_copies_and_busy_per_step(trace, raw):
    table = trace.step_table
    expected = _gpu_by_step(raw)
    for row in table.iter_rows(named=True):
        events = expected[row["step"]]
        assert row["kernels"] == sum(e["cat"] == "kernel" for e in events) == 5
        assert row["memcpy"] == sum(e["cat"] == "gpu_memcpy" for e in events) == 1
        busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in events])
        assert row["gpu_busy_us"] == pytest.approx(busy, abs=1e-3)
        assert busy <= sum(e["dur"] for e in events) + 1e-3


def test_warmup_leftovers_stay_out_of_steps(trace, raw):
    # Kernels queued by the profiler's warm-up step have no launch in the trace and belong to no step.
    unlinked = trace.gpu_linked.filter(pl.col("launch").is_null())
    linked_corr = {e["args"]["correlation"] for e in raw if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    raw_unlinked = [e for e in raw if e.get("cat") == "kernel" and e["args"]["correlation"] not in linked_corr]
    assert unlinked.height == len(raw_unlinked) > 0
    assert unlinked["step"].null_count() == unlinked.height


def test_launch_kernel_links(trace, raw):
    gpu = trace.gpu_linked.filter(pl.col("step").is_not_null())
    launches = {e["args"]["correlation"]: e["name"] for e in raw if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    for corr, api in gpu.select("correlation", "launch_api").iter_rows():
        assert launches[corr] == api
    assert set(gpu.filter(pl.col("kind") == "kernel")["launch_api"]) <= {"cudaLaunchKernel", "cuLaunchKernelEx"}


def test_masked_fill_copy_chain(trace):
    copy = trace.gpu_linked.filter((pl.col("kind") == "memcpy") & pl.col("step").is_not_null())
    assert copy.height == 3
    for op, nbytes in copy.select("op", "bytes").iter_rows():
        assert trace.op_chain(op) == ["aten::masked_fill", "aten::clone", "aten::copy_"]
        assert nbytes == 4 * 16 * 2048 * 2048 * 2


def test_device_and_flags(trace):
    assert trace.meta.device(0)["name"] == "NVIDIA H200"
    assert trace.meta.flags["record_shapes"] is True
    dims, types, _ = trace.op_input(trace.op_names.index("aten::masked_fill"))
    assert dims[0] == [4, 16, 2048, 2048] and types[0] == "c10::BFloat16"


@pytest.mark.parametrize(("name", "kernels"), [
    ("bf16_causal_fwd/naive_inplace", 5), ("bf16_causal_fwd/sdpa_math", 20), ("bf16_causal_fwd/sdpa_flash", 1),
    ("bf16_causal_fwd/sdpa_efficient", 1), ("bf16_causal_fwd/sdpa_cudnn", 1), ("bf16_causal_fwd/compiled", 3),
])
def test_kernels_per_forward(name, kernels):
    assert set(load(sample(name)).step_table["kernels"].to_list()) == {kernels}


def test_op_tree_lookups_match_a_walk_of_the_parents():
    # Ancestors are kept per op and children are slices of one sorted list: both must say what a plain walk of
    # the parent pointers says, on a real training trace (deep autograd nesting, many threads).
    gpt2 = load(sample("workloads/gpt2_eager_train"))
    parent, names = gpt2.op_parent, gpt2.op_names
    assert names == gpt2.ops["name"].to_list() and gpt2.op_cats == gpt2.ops["cat"].to_list()
    for op in reversed(range(len(parent))):  # children first: their chains are kept before the parents are asked
        walked = []
        up = op
        while up is not None and not names[up].startswith("ProfilerStep#"):
            walked.append(up)
            up = parent[up]
        assert gpt2.op_ancestors(op) == walked[::-1]
    starts = gpt2.ops["ts"].to_list()
    expected: dict[int | None, list[int]] = {}
    for op in sorted(range(len(parent)), key=lambda i: starts[i]):
        expected.setdefault(parent[op], []).append(op)
    assert dict(gpt2.op_children) == expected


def _parents_by_stack(ops: pl.DataFrame) -> list[int | None]:
    """The op tree the plain way: per thread, by start (longer first), a stack of the ops still open."""
    parent: list[int | None] = [None] * ops.height
    stacks: dict[tuple[object, object], list[tuple[float, int]]] = {}
    for idx, pid, tid, ts, end in ops.sort(["pid", "tid", "ts", "end"], descending=[False, False, False, True]
                                           ).select("idx", "pid", "tid", "ts", "end").iter_rows():
        stack = stacks.setdefault((pid, tid), [])
        # An op that starts where an open one ends follows it; only one of no length fits inside it.
        while stack and (stack[-1][0] < ts or (stack[-1][0] == ts and end > ts)):
            stack.pop()
        parent[idx] = stack[-1][1] if stack else None
        stack.append((end, idx))
    return parent


def test_op_parents_match_a_stack_of_open_ops():
    from attntrace.model import optree

    # A real trace, and ops that overrun their parent (clock rounding), start together or sit on other threads.
    assert optree.op_parents(load(sample("workloads/gpt2_eager_train")).ops) == _parents_by_stack(
        load(sample("workloads/gpt2_eager_train")).ops)
    ops = pl.DataFrame({"idx": range(8), "pid": [1, 1, 1, 1, 1, 1, 2, 1], "tid": [1, 1, 1, 1, 1, 1, 1, 2],
                        "ts": [0.0, 1.0, 2.0, 9.0, 11.0, 11.0, 1.0, 1.5],
                        "end": [10.0, 5.0, 3.0, 12.0, 11.5, 20.0, 4.0, 2.0]},
                       schema_overrides={"idx": pl.UInt32})
    assert optree.op_parents(ops) == _parents_by_stack(ops) == [None, 0, 1, 0, 5, 3, None, None]


def test_an_op_starting_where_its_sibling_ended_is_its_sibling():
    from attntrace.model import optree

    # Whole-microsecond clocks (HTA's V100 trace): `aten::clone` [0, 10] runs `aten::empty_strided` [2, 5] and then
    # `aten::copy_` [5, 8]; the copy was nested under empty_strided, a chain of its own and a second AT101 finding
    # for one cause. A mark of no length at 8 still sits inside the copy.
    ops = pl.DataFrame({"idx": range(4), "pid": [1] * 4, "tid": [1] * 4, "ts": [0.0, 2.0, 5.0, 8.0],
                        "end": [10.0, 5.0, 8.0, 8.0]}, schema_overrides={"idx": pl.UInt32})
    assert optree.op_parents(ops) == _parents_by_stack(ops) == [None, 0, 0, 2]
    trace = load(str(Path(__file__).parent / "data" / "hta_trace_diff_v100.json.gz"))
    from attntrace.report.engine import lint_trace

    clones = [f for f in lint_trace(trace).findings if f["rule"] == "AT101"
              and f["where"]["op_chain"].startswith("CompiledFunction > aten::clone")]
    (clone,) = clones
    assert clone["where"]["op_chain"] == "CompiledFunction > aten::clone > aten::copy_"
    assert clone["impact"]["gpu_us_per_step"] == pytest.approx(5139, abs=2)  # 3679 + 1461 us, one cause


@pytest.mark.parametrize("collecting", [True, False])
def test_reading_and_linting_leave_the_garbage_collector_as_they_found_it(collecting: bool):
    # Both pause cyclic GC while they work (gc_paused); a library caller's setting must come back either way.
    import gc

    from attntrace.report.engine import lint_trace

    was = gc.isenabled()
    try:
        gc.enable() if collecting else gc.disable()
        lint_trace(load(sample("workloads/gpt2_eager_train")))
        assert gc.isenabled() is collecting
    finally:
        gc.enable() if was else gc.disable()


def test_busy_time_sums_its_runs_in_time_order() -> None:
    """busy_us is the same float at every run: the merged runs come in (keys, time) order and are summed in it
    (polars' hash grouping gave them in another order each time, and the sum's last bits changed with it)."""
    from random import Random

    from attntrace.model.intervals import busy_us, merged_runs

    rng = Random(1)
    starts = sorted(rng.random() * 1e8 for _ in range(50_000))
    steps = [rng.randrange(20) for _ in starts]
    ends = [t + rng.random() * 60_000 for t in starts]
    frame = pl.DataFrame({"step": steps, "device": [0] * len(starts), "ts": starts, "end": ends})
    runs = merged_runs(frame, ["step", "device"])
    assert runs.height < frame.height // 2
    assert runs.equals(runs.sort(["step", "device", "ts"]))
    expected = []
    for step in range(20):  # the union's runs, each added as it closes, in time order
        total, run = 0.0, None
        for ts, end, s in zip(starts, ends, steps, strict=True):
            if s != step:
                continue
            if run is None or ts > run[1]:
                total += run[1] - run[0] if run else 0.0
                run = [ts, end]
            else:
                run[1] = max(run[1], end)
        assert run is not None
        expected.append(total + (run[1] - run[0]))
    busy = busy_us(frame, ["step"])["busy_us"].to_list()
    assert busy == pytest.approx(expected, rel=1e-12)
    shuffled = frame.sample(fraction=1.0, shuffle=True, seed=2)
    assert busy_us(shuffled, ["step"])["busy_us"].to_list() == busy  # the same bits whatever the rows' order


@pytest.mark.parametrize("seed", range(6))
def test_small_frames_merge_in_python_as_polars_does(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames of a few rows are merged in Python (polars' window queries cost milliseconds each whatever the
    rows): the same runs, the same busy floats, null keys first, gaps and touching intervals included."""
    from random import Random

    from attntrace.model import intervals

    rng = Random(seed)
    n = rng.randrange(1, 60)
    starts = [float(rng.randrange(0, 400)) + rng.choice([0.0, 0.5, 0.25]) for _ in range(n)]
    frame = pl.DataFrame({
        "step": [rng.choice([None, 1, 2, 3]) for _ in range(n)],
        "group": [rng.choice([None, "gemm", "copy"]) for _ in range(n)],
        "device": [rng.choice([0, 1]) for _ in range(n)],
        "ts": starts, "end": [t + rng.choice([0.0, 1.0, 5.0, 40.0]) for t in starts],
        "gap": [rng.choice([0.0, 2.0, 10.0]) for _ in range(n)]})
    cases = [(["step", "device"], None), (["step", "group"], "gap"), (["device"], None), (["step"], "gap")]
    small = [intervals.merged_runs(frame, keys, gap) for keys, gap in cases]
    small_busy = [intervals.busy_us(frame, by) for by in (["step"], [], ["group"])]
    monkeypatch.setattr(intervals, "SMALL_FRAME_ROWS", -1)  # polars for every frame
    for a, b in zip(small, [intervals.merged_runs(frame, k, g) for k, g in cases], strict=True):
        assert a.schema == b.schema and a.rows() == b.rows()
    for a, b in zip(small_busy, [intervals.busy_us(frame, by) for by in (["step"], [], ["group"])], strict=True):
        assert a.schema == b.schema and a.rows() == b.rows()


def test_kernel_classes_remembered_across_traces_match_a_fresh_match(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-process memory of kernel classes gives what polars' match gives, for names seen before, new
    names, nulls, a memory that fills up, and a trace with more names than are remembered."""
    import polars as pl

    from attntrace.model import taxonomy as tx

    fresh = tx.Taxonomy(tx.load().classes)
    names = ["ampere_sgemm_128x64_nn", "void at::native::elementwise_kernel<128, 4>", None,
             "flash_fwd_kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "my_own_kernel", "Memcpy HtoD"]
    expected = fresh._matched(pl.Series(names, dtype=pl.String)).to_list()
    assert fresh.classify_all(pl.Series(names[:3], dtype=pl.String)).to_list() == expected[:3]
    assert fresh.classify_all(pl.Series(names[::-1], dtype=pl.String)).to_list() == expected[::-1]
    assert fresh.known == dict(zip(names, expected, strict=True))
    monkeypatch.setattr(tx, "KNOWN_NAMES_KEPT", 4)
    fresh.known.clear()
    assert fresh.classify_all(pl.Series(names[:3], dtype=pl.String)).to_list() == expected[:3]
    # Three remembered, four new: the memory is emptied first, and both old and new names are answered.
    assert fresh.classify_all(pl.Series(names[::-1], dtype=pl.String)).to_list() == expected[::-1]
    assert fresh.known == dict(zip(names[3:], expected[3:], strict=True))
    monkeypatch.setattr(tx, "REMEMBERED_UP_TO", 2)
    fresh.known.clear()
    assert fresh.classify_all(pl.Series(names, dtype=pl.String)).to_list() == expected
    assert not fresh.known
