"""The critical path of a replayed step: the chain of CPU work, launches, waits, copies and GPU work that sets its
length, and the step's time by what that chain spends it on.

The replay (model/replay.py) places every kernel and copy without the profiler's cost and keeps, for each, when
its launch reached the GPU, and for each blocking call when it returned and what it waited for. The path is walked
back from the step's end: from GPU work to what let it start (its launch, the work before it on its stream, or
another stream's work it waited for), and from the CPU to the sync it last waited in (then to the GPU work that
sync waited for) or to the step's start. Time on the GPU counts by kernel group (rules/taxonomy.toml's `group`),
copies as copies, the time from a launch call to its work as launch; time on the CPU is shared out by what the
process's CPU was doing over the recorded stretch: runtime calls (launches), blocking calls (host waits), the
optimizer's ops, the data loader's, other framework ops, and Python outside any op.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Any

import polars as pl

# Categories of CPU time, by the top-level op the CPU was in.
OPTIMIZER = re.compile(r"Optimizer\.step|Optimizer\.zero_grad|optimizer|_foreach_|fused_adam|_fused_sgd")
DATA_LOADING = re.compile(r"DataLoader|dataloader|_MultiProcessingDataLoaderIter|__next__")
LAUNCH_LATENCY = "launch latency"
COPIES = "copies"
# Work that ran before the step's own (queued by the step before) and holds it back.
QUEUED = "gpu: queued before the step"
# Two placed moments this close are one: the replay's arithmetic leaves fractions of a microsecond.
EPS_US = 0.5


@dataclass
class Placement:
    """What the replay decided for one device's process, as the path walk needs it."""
    start: dict[int, float]
    end: dict[int, float]
    launched: dict[int, float]  # GPU work idx -> replayed time its launch call was made
    latency: float
    stream: dict[int, int]
    group: dict[int, str]  # GPU work idx -> its category on the path
    # Blocking calls that waited for GPU work: (replayed return, replayed call start, GPU work idx it waited for).
    waits: list[tuple[float, float, int]] = field(default_factory=list)
    # Recorded CPU times and the replayed times they map to, in recorded order (launch calls, sync returns).
    anchors: list[tuple[float, float]] = field(default_factory=list)
    # Every blocking call as replayed: (call start, return).
    blocking: list[tuple[float, float]] = field(default_factory=list)
    # GPU work idx -> its recorded (start, end): where the path is drawn on the trace's own timeline.
    recorded: dict[int, tuple[float, float]] = field(default_factory=dict)


class CpuTimeline:
    """What the CPU of one process did over any recorded stretch: the union of each category's intervals, with
    running lengths so that an overlap is two searches."""

    def __init__(self, intervals: dict[str, list[tuple[float, float]]]) -> None:
        self.unions: dict[str, tuple[list[float], list[float], list[float]]] = {}
        for name, spans in intervals.items():
            starts: list[float] = []
            ends: list[float] = []
            for s, e in sorted(spans):
                if ends and s <= ends[-1]:
                    ends[-1] = max(ends[-1], e)
                    continue
                starts.append(s)
                ends.append(e)
            running, total = [], 0.0  # running[i]: covered length before interval i
            for s, e in zip(starts, ends, strict=True):
                running.append(total)
                total += e - s
            self.unions[name] = (starts, ends, running)

    def covered(self, name: str, a: float, b: float) -> float:
        """Length of [a, b] that `name`'s intervals cover."""
        if name not in self.unions or b <= a:
            return 0.0
        starts, ends, running = self.unions[name]
        if not starts:
            return 0.0

        def upto(t: float) -> float:
            i = bisect.bisect_right(starts, t) - 1
            if i < 0:
                return 0.0
            return running[i] + min(t, ends[i]) - starts[i]

        return max(0.0, upto(b) - upto(a))


def cpu_timeline(ops: pl.DataFrame, roots: pl.Series, calls: pl.DataFrame, blocking: set[int]) -> CpuTimeline:
    """The process's CPU categories (ops: its ops in the window with `roots` marking those no other op holds;
    calls: its runtime calls, idx/ts/end; blocking: the calls that block)."""
    top = ops.filter(roots).select("name", "ts", "end")
    names = top["name"].to_list()
    spans = list(zip(top["ts"].to_list(), top["end"].to_list(), strict=True))
    kinds: dict[str, list[tuple[float, float]]] = {"cpu: optimizer": [], "cpu: data loading": [],
                                                    "cpu: framework ops": []}
    for name, span in zip(names, spans, strict=True):
        kind = ("cpu: optimizer" if OPTIMIZER.search(name) else "cpu: data loading" if DATA_LOADING.search(name)
                else "cpu: framework ops")
        kinds[kind].append(span)
    launch_spans, wait_spans = [], []
    for idx, ts, end in calls.select("idx", "ts", "end").iter_rows():
        (wait_spans if idx in blocking else launch_spans).append((ts, end))
    return CpuTimeline({**kinds, "cpu: launches": launch_spans, "cpu: host waits": wait_spans})


def _share_cpu(timeline: CpuTimeline, a: float, b: float, length: float, into: dict[str, float],
               waits: float = 0.0) -> None:
    """Add `length` us of replayed CPU time to `into`, `waits` of it in blocking calls (as replayed: a sync's
    recorded wait may be gone) and the rest shared out as the CPU spent the recorded stretch [a, b] outside them."""
    waits = min(waits, length)
    if waits > 0:
        into["cpu: host waits"] = into.get("cpu: host waits", 0.0) + waits
    length -= waits
    if length <= 0:
        return
    span = b - a
    if span <= 0:
        into["cpu: python"] = into.get("cpu: python", 0.0) + length
        return
    calls = {"cpu: launches": timeline.covered("cpu: launches", a, b)}
    recorded_waits = min(span, timeline.covered("cpu: host waits", a, b))
    span -= recorded_waits
    ops = {k: timeline.covered(k, a, b) for k in ("cpu: optimizer", "cpu: data loading", "cpu: framework ops")}
    in_ops = sum(ops.values())
    # Runtime calls and blocking calls sit inside ops: an op's share is its time less the calls in it (spread over
    # the op kinds).
    inner = min(in_ops, calls["cpu: launches"] + recorded_waits)
    scale = (in_ops - inner) / in_ops if in_ops else 0.0
    parts = {**calls, **{k: v * scale for k, v in ops.items()}}
    parts["cpu: python"] = max(0.0, span - sum(parts.values()))
    total = sum(parts.values())
    if total <= 0:
        into["cpu: python"] = into.get("cpu: python", 0.0) + length
        return
    for k, v in parts.items():
        if v > 0:
            into[k] = into.get(k, 0.0) + length * v / total


def walk(placement: Placement, timeline: CpuTimeline, begin: float, finish: float, cpu_end: float,
         own: set[int], segments: list[tuple[float, float, str]] | None = None) -> dict[str, float]:
    """The step [begin, finish] (replayed) by what its critical path spends it on (own: the step's GPU work);
    `segments`, when given, receives the path on the recorded timeline, (start, end, what), latest first: GPU work
    at its recorded times, CPU stretches mapped back through the replay's anchors."""
    start, end, launched = placement.start, placement.end, placement.launched
    by_stream: dict[int, list[tuple[float, int]]] = {}
    for idx, s in start.items():
        by_stream.setdefault(placement.stream[idx], []).append((s, idx))
    for items in by_stream.values():
        items.sort()
    stream_starts = {k: [s for s, _ in v] for k, v in by_stream.items()}
    ends_sorted = sorted((e, idx) for idx, e in end.items())
    end_times = [e for e, _ in ends_sorted]
    waits = sorted(placement.waits)
    wait_returns = [w[0] for w in waits]
    anchors = sorted(placement.anchors)
    rec = [a for a, _ in anchors]
    rep: list[float] = []
    for _, r in anchors:  # replayed times never go back along the recorded order
        rep.append(max(r, rep[-1]) if rep else r)

    def recorded_at(t: float) -> float:
        i = bisect.bisect_right(rep, t) - 1
        if i < 0:
            return rec[0] - (rep[0] - t) if rec else t
        return rec[i] + (t - rep[i])

    spent: dict[str, float] = {}
    replayed_waits = CpuTimeline({"waits": placement.blocking})

    def share(a: float, b: float) -> None:
        before = dict(spent)
        _share_cpu(timeline, recorded_at(a), recorded_at(b), b - a, spent, replayed_waits.covered("waits", a, b))
        if segments is not None and b > a:
            grown = {k: v - before.get(k, 0.0) for k, v in spent.items()}
            segments.append((recorded_at(a), recorded_at(b), max(sorted(grown), key=lambda k: grown[k])))

    def add(name: str, us: float) -> None:
        if us > 0:
            spent[name] = spent.get(name, 0.0) + us

    # Where the step ends: its last GPU work, if that ends after the CPU reached the next step.
    last = max(((end[i], i) for i in own if i in end), default=None)
    on_gpu: int | None = last[1] if last and last[0] >= cpu_end - EPS_US else None
    t = finish if on_gpu is not None else min(cpu_end, finish)
    add("cpu: python", finish - t)  # the CPU reached the next step before the step's end (never negative)
    for _ in range(4 * len(start) + 2 * len(waits) + 10):
        if t <= begin + 1e-9:
            break
        if on_gpu is not None:
            j = on_gpu
            s = max(start[j], begin)
            add(placement.group.get(j, "gpu: other") if j in own else QUEUED, t - s)
            if segments is not None and j in placement.recorded and t > s:
                segments.append((*placement.recorded[j], placement.group.get(j, "gpu: other")))
            t = min(t, start[j])
            on_gpu = None
            if t <= begin:
                break
            launch = launched.get(j)
            if launch is not None and launch + placement.latency >= start[j] - EPS_US:
                add(LAUNCH_LATENCY, t - max(launch, begin))
                t = min(t, max(launch, begin))  # the path never runs forward
                continue
            stream = placement.stream[j]
            k = bisect.bisect_left(stream_starts[stream], start[j]) - 1
            if k >= 0 and end[by_stream[stream][k][1]] >= start[j] - 1.5:
                on_gpu = by_stream[stream][k][1]
                add(placement.group.get(j, "gpu: other"), t - min(t, end[on_gpu]))
                t = min(t, end[on_gpu])
                continue
            k = bisect.bisect_right(end_times, start[j] + 0.01) - 1
            if k >= 0 and end_times[k] >= start[j] - 3.0 and ends_sorted[k][1] != j:
                on_gpu = ends_sorted[k][1]
                t = min(t, end_times[k])
                continue
            # Nothing on the GPU explains its start: the CPU was late (work queued with no launch in the window).
            continue
        # On the CPU at t: back to the last sync that waited for the GPU, or to the step's start.
        k = bisect.bisect_right(wait_returns, t + 1e-6) - 1
        if k + 1 < len(waits) and waits[k + 1][1] < t - EPS_US and start.get(waits[k + 1][2], t) < t - EPS_US:
            # t is inside a sync's wait (another thread launched while this one waited): the path is the GPU work
            # that sync waited for.
            on_gpu = waits[k + 1][2]
            continue
        if k < 0 or wait_returns[k] <= begin:
            share(begin, t)
            t = begin
            break
        returns, _, waited = waits[k]
        share(returns, t)
        t = returns
        on_gpu = waited
    return spent


def summarize(paths: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device: the median steady step's path, category by category (each category's median over the steps,
    scaled so the shares add up to the median step)."""
    out = []
    for device in sorted({p["device"] for p in paths}):
        mine = [p for p in paths if p["device"] == device]
        steps = sorted(p["step_us"] for p in mine)
        step_us = steps[len(steps) // 2]
        names = sorted({k for p in mine for k in p["spent"]})
        medians = {}
        for name in names:
            values = sorted(p["spent"].get(name, 0.0) for p in mine)
            medians[name] = values[len(values) // 2]
        total = sum(medians.values())
        scale = step_us / total if total else 0.0
        parts = sorted(((k, v * scale) for k, v in medians.items() if v * scale > 0), key=lambda kv: (-kv[1], kv[0]))
        out.append({"device": device, "steps": len(mine), "step_us": step_us,
                    "parts": [{"on": k, "us": v, "share": v / step_us if step_us else 0.0} for k, v in parts]})
    return out
