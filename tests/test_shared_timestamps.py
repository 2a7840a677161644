"""Traces whose events share timestamps stay within memory (issue 26: a 121 MB one had peaked at 18 GB).

Two paths grew with the square of the events that share a time:
- CPU ops of one thread that start at one time nest by containment into one chain as long as the thread, and
  every op's ancestor chain was kept whole (AT101 asks for a copy's chain);
- the flow fallback for GPU work without a correlation joined every flow start to every launch that starts at its
  time on its thread.
Each test builds such a trace from a real sample and lints it in a child process that reports its own peak
memory. Before the fixes these peaked at about 1 GB and 2 GB."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import sample

from attntrace.model import _engulfing_ops
from attntrace.model.loading import load
from attntrace.model.trace import MAX_OP_DEPTH

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_traces/workloads/gpt2_eager_train.pt.trace.json.gz"
NAIVE = sample("bf16_causal_fwd/naive")
T0 = 1_000_000.0
# A child that lints a small trace holds about 130 MB (the interpreter, polars, the tables); the traces below made
# the old code take 1-2 GB.
PEAK_LIMIT_MB = 450
# The child's own peak: VmHWM of its address space. (ru_maxrss is not: Linux carries the parent's peak into a
# child across fork and exec, so a child of a test process that had imported torch started at 470 MB.)
PEAK = """
import re, sys
from pathlib import Path
from attntrace.report.engine import lint_trace
from attntrace.model.loading import load
from attntrace.model.summary import summarize
trace = load(sys.argv[1])
summarize(trace)
report = lint_trace(trace)
peak_kb = int(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1))
print(peak_kb // 1024, len(report.findings))
"""


def _stopped_clock(copies: int) -> dict[str, Any]:
    """The GPT-2 training sample `copies` times over, every event at one time (ids shifted so links stay
    unique)."""
    document = json.loads(gzip.decompress(SAMPLE.read_bytes()))
    events = []
    for copy in range(copies):
        shift = copy * 1_000_000
        for event in document["traceEvents"]:
            event = dict(event)
            if "ts" in event:
                event["ts"] = T0
            if event.get("ph") in ("s", "f") and isinstance(event.get("id"), int):
                event["id"] += shift
            if isinstance(event.get("args"), dict):
                event["args"] = {k: v + shift if k in ("correlation", "External id") and isinstance(v, int) else v
                                 for k, v in event["args"].items()}
            if event.get("name", "").startswith("ProfilerStep#"):
                event["name"] = f"ProfilerStep#{int(event['name'].split('#')[1]) + copy * 10}"
            events.append(event)
    return {**document, "traceEvents": events}


def _launches_at_one_time(launches: int, flow_id: int | None = None, launch_step_us: float = 0.0,
                          correlated: bool = True) -> dict[str, Any]:
    """A modern trace whose launches all start at one time on one thread (or `launch_step_us` apart), linked to
    their kernels by correlation (unless not `correlated`), except one memset that only an ac2g flow links (the flow
    fallback then runs); every flow has its own id, or `flow_id`."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": T0 - 1,
         "dur": 30.0 * launches + 10}]
    for i in range(launches):
        kernel_ts = T0 + 20 + 30 * i
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::fill_", "pid": 1, "tid": 1, "ts": T0 + 30 * i,
                       "dur": 25.0, "args": {"External id": i}})
        launch_ts = T0 + launch_step_us * i
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": launch_ts, "dur": 5.0, "args": {"External id": i, "correlation": i}})
        if i == 0:
            gpu = {"cat": "gpu_memset", "name": "Memset (Device)", "args": {"device": 0, "stream": 7, "bytes": 4}}
        else:
            gpu = {"cat": "kernel", "name": "void fill_kernel(float*)",
                   "args": {"device": 0, "stream": 7, "External id": i, "grid": [132, 1, 1], "block": [128, 1, 1],
                            **({"correlation": i} if correlated else {})}}
        events.append({"ph": "X", "pid": 0, "tid": 7, "ts": kernel_ts, "dur": 8.0, **gpu})
        flow = i if flow_id is None else flow_id
        events.append({"ph": "s", "id": flow, "pid": 1, "tid": 1, "ts": launch_ts, "cat": "ac2g", "name": "ac2g"})
        events.append({"ph": "f", "id": flow, "pid": 0, "tid": 7, "ts": kernel_ts, "cat": "ac2g", "name": "ac2g",
                       "bp": "e"})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "numSms": 132}],
            "traceEvents": events}


def _peak_mb(path: Path) -> int:
    if not Path("/proc/self/status").exists():
        pytest.skip("needs Linux's /proc to read a process's peak memory")
    done = subprocess.run([sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True, timeout=600,
                          check=True)
    return int(done.stdout.split()[0])


@pytest.mark.slow
def test_ops_at_one_time_keep_memory_bounded(tmp_path: Path) -> None:
    path = tmp_path / "stopped_clock.json"
    path.write_bytes(json.dumps(_stopped_clock(3)).encode())
    assert _peak_mb(path) < PEAK_LIMIT_MB
    trace = load(str(path))
    deepest = max(range(trace.ops.height), key=lambda op: len(trace.op_ancestors(op)))
    assert len(trace.op_ancestors(deepest)) == MAX_OP_DEPTH  # the chain is as long as the thread: cut


@pytest.mark.slow
def test_launches_at_one_time_keep_memory_bounded(tmp_path: Path) -> None:
    path = tmp_path / "launches_at_one_time.json"
    path.write_bytes(json.dumps(_launches_at_one_time(3000)).encode())
    assert _peak_mb(path) < PEAK_LIMIT_MB
    # Every kernel still goes to its own launch, and the memset to the first launch at that time on the thread.
    linked = load(str(path)).gpu_linked.sort("ts")
    assert linked["launch"].null_count() == 0
    assert linked["correlation"].to_list() == list(range(3000))


@pytest.mark.slow
def test_reused_flow_ids_keep_memory_bounded(tmp_path: Path) -> None:
    """Kernels without correlations, linked by flows that all reuse one id: each finish takes the last start of
    that id before it, its own launch here (every flow start was joined to every finish before: 9M pairs)."""
    path = tmp_path / "one_flow_id.json"
    path.write_bytes(json.dumps(_launches_at_one_time(3000, flow_id=7, launch_step_us=30.0,
                                                      correlated=False)).encode())
    assert _peak_mb(path) < PEAK_LIMIT_MB
    linked = load(str(path)).gpu_linked.sort("ts")
    assert linked["correlation"].to_list() == list(range(3000))


def test_op_chains_of_real_traces_are_whole() -> None:
    """The cut never touches a real op stack (the deepest in the sample traces is far below it)."""
    for path in sorted((ROOT / "sample_traces/workloads").glob("*.pt.trace.json.gz")):
        trace = load(str(path))
        assert max(len(trace.op_ancestors(op)) for op in range(trace.ops.height)) < MAX_OP_DEPTH // 4


def _frozen_ops(count: int) -> pl.DataFrame:
    """The aten ops of the naive sample's thread, and `count` more at one start with one duration around them all
    (a clock that stopped: every one of them spans the whole thread, and each holds all the others)."""
    ops = load(NAIVE).ops.select("idx", "name", "pid", "tid", "ts", "dur", "end")
    pid, tid = ops.row(0, named=True)["pid"], ops.row(0, named=True)["tid"]
    first, last = ops["ts"].min(), ops["end"].max()
    frozen = pl.DataFrame({"idx": range(ops.height, ops.height + count), "name": ["aten::empty"] * count,
                           "pid": [pid] * count, "tid": [tid] * count, "ts": [first - 1.0] * count,
                           "dur": [last - first + 2.0] * count, "end": [last + 1.0] * count}, schema=ops.schema)
    return pl.concat([ops, frozen])


def test_ops_with_one_window_are_one_note_counted_without_a_pass_per_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 43: the note on ops that span their whole thread counted the ops inside each such op with a filter of
    its thread; when a thread's ops share one time and duration, every op is such an op (20k at one ts: 13 s of
    CPU). The passes over the table no longer grow with the ops that tie, and ops of one name and window are one
    note whose count is the one each of them had alone."""
    filters: list[int] = []
    real_filter = pl.DataFrame.filter
    monkeypatch.setattr(pl.DataFrame, "filter", lambda self, *a, **k: filters.append(1) or real_filter(self, *a, **k))
    passes, notes = {}, {}
    for count in (3, 300):
        ops = _frozen_ops(count)
        filters.clear()
        notes[count] = _engulfing_ops(ops)
        passes[count] = len(filters)
    assert passes[300] == passes[3]
    for count in (3, 300):
        aten = _frozen_ops(count).filter(pl.col("name").str.starts_with("aten::")).height
        assert notes[count] == [f"{count} aten::empty ops span the whole of its thread's recorded time with {aten - 1} "
                                "aten ops inside it (a broken duration?): ops inside an aten op are read as its "
                                "implementation"]


def test_ops_inside_wide_ops_are_counted_like_one_filter_each() -> None:
    """The counts from sorted starts and ends agree with the filter they replace, on wide ops that nest, tie and
    cross: ties in start, in end and in both."""
    ops = _frozen_ops(2)
    first, last = ops["ts"].min(), ops["end"].max()
    base = ops.height
    extra = [(first - 1.0, last + 1.0), (first - 2.0, last + 1.0), (first - 1.0, last + 3.0), (first - 3.0, last + 3.0),
             (first, last - 1.0), (first + 1.0, last + 2.0)]
    pid, tid = ops.row(0, named=True)["pid"], ops.row(0, named=True)["tid"]
    ops = pl.concat([ops, pl.DataFrame(
        {"idx": range(base, base + len(extra)), "name": [f"aten::wide{i}" for i in range(len(extra))],
         "pid": [pid] * len(extra), "tid": [tid] * len(extra), "ts": [s for s, _ in extra],
         "dur": [e - s for s, e in extra], "end": [e for _, e in extra]}, schema=ops.schema)])
    aten = ops.filter(pl.col("name").str.starts_with("aten::") & (pl.col("pid") == pid) & (pl.col("tid") == tid))
    expected = []
    for idx, name, ts, end in aten.filter(pl.col("idx") >= base).select("idx", "name", "ts", "end").iter_rows():
        inside = aten.filter((pl.col("ts") >= ts) & (pl.col("end") <= end) & (pl.col("idx") != idx)).height
        expected.append(f"{name} spans the whole of its thread's recorded time with {inside} aten ops inside it")
    notes = [note.split(" (a broken")[0] for note in _engulfing_ops(ops)]
    assert notes[1:] == expected and notes[0].startswith("2 aten::empty ops span")


def _innermost_by_scan(calls: pl.DataFrame, ops: pl.DataFrame, parent: list[int | None]) -> list[int | None]:
    """The innermost op containing each call, the slow way: the latest-starting op at or before it on its thread
    (of ops that start together, the last in the file, as the as-of join takes it), climbed one parent at a time
    until one has not ended."""
    rows = ops.rows(named=True)
    found: list[int | None] = []
    for call in calls.rows(named=True):
        before = [r for r in rows if r["pid"] == call["pid"] and r["tid"] == call["tid"] and r["ts"] <= call["ts"]]
        op = max(before, key=lambda r: (r["ts"], r["idx"]))["idx"] if before else None
        while op is not None and rows[op]["end"] < call["ts"]:
            op = parent[op]
        found.append(op)
    return found


@pytest.mark.parametrize("seed", range(6))
def test_innermost_ops_with_shared_starts_match_a_plain_scan(seed: int):
    # The climb jumps past ops an earlier call climbed past (ops that share one start, a chain as deep as their
    # number, cost each call a climb of the whole chain: 113k ops at one ts took 273 s against 4.8 s; that case is
    # in bench/bench_shared_ts.py --clocks ops). The jumps must find what a climb of one parent at a time finds.
    import random

    from attntrace.model.optree import innermost_ops, op_parents

    rng = random.Random(seed)
    starts = [100.0] * 30 + [rng.choice([100.0, 150.0, 200.0]) for _ in range(30)]
    ops = pl.DataFrame({"idx": list(range(60)), "pid": [1] * 60, "tid": [rng.choice([1, 2]) for _ in range(60)],
                        "ts": starts, "end": [ts + rng.choice([1.0, 5.0, 40.0, 120.0, 300.0]) for ts in starts]})
    parent = op_parents(ops)
    call_ts = [rng.uniform(99.0, 420.0) for _ in range(80)] + [100.0, 101.0, 105.0, 140.0]
    rng.shuffle(call_ts)
    calls = pl.DataFrame({"idx": list(range(len(call_ts))), "pid": [1] * len(call_ts),
                          "tid": [rng.choice([1, 2]) for _ in call_ts], "ts": call_ts})
    assert innermost_ops(calls, ops, parent) == _innermost_by_scan(calls, ops, parent)
