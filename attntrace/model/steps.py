"""Step windows: ProfilerStep markers in any Kineto generation, else iterations inferred from markers that
recur (optimizer steps, data-loader batches, a top-level annotation), else the whole trace as one window.

Windows belong to the process that marked them. A window that holds a CUDA/HIP graph capture is marked as
such: it records kernels for later replay, it is not a steady-state step."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import polars as pl

from attntrace.model.plain import collect_plain

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
# Markers that recur once per training iteration, and whether they open or close it.
ITERATION_MARKERS = (
    (r"^Optimizer\.step#.+\.step$", "end"),
    (r"^Optimizer\.zero_grad#.+\.zero_grad$", "end"),
    (r"^enumerate\(DataLoader\)#.+\.__next__$", "start"),
)
MIN_INFERRED_STEPS = 2
# 28 hours: longer than any profiled span. A larger duration, or a start this far from the trace's others, is a
# broken writer's (1e300 in a hand-edited trace), not a time.
MAX_SPAN_US = 1e11
MIN_STEP_SHARE = 0.5  # of its thread's top-level time that a recurring annotation must span to be its steps
WARMUP_FACTOR = 3.0  # a first window this many times the median of the rest is warm-up (lazy init, autotune)
CAPTURE_BEGIN = r"^(cuda|hip)StreamBeginCapture"
CAPTURE_END = r"^(cuda|hip)StreamEndCapture"
SCHEMA = {"pid": pl.String, "step": pl.Int64, "ts": pl.Float64, "end": pl.Float64, "capture": pl.Boolean}


@dataclass(frozen=True)
class Steps:
    windows: pl.DataFrame  # pid (String; null for the whole-trace window), step, ts, end, capture
    source: str  # "markers", "inferred" or "trace"
    label: str  # what the windows came from: "ProfilerStep#N", "Optimizer.step#AdamW.step", "whole trace"
    notes: list[str] = field(default_factory=list)

    @property
    def marked(self) -> bool:
        """Steps the trace shows (markers or a recurring iteration), not the whole trace as one window."""
        return self.source != "trace"


def find_steps(ops: pl.DataFrame, op_parent: list[int | None], launches: pl.DataFrame,
               gpu: pl.DataFrame) -> Steps:
    notes: list[str] = []
    steps = _from_markers(ops, notes) or _inferred(ops, op_parent, notes) or _whole_trace(ops, launches, gpu,
                                                                                          op_parent, notes)
    captures = capture_windows(launches)
    if captures.height and steps.windows.height:
        # A window overlaps a capture when some capture that starts before the window ends reaches past the
        # window's start: the furthest reach of the captures started so far, found by an as-of join (a cross
        # join of 20,000 steps with as many captures took 24 GB).
        reach = (captures.select("c_ts", "c_end").sort("c_ts", maintain_order=True)
                 .with_columns(pl.col("c_end").cum_max().alias("reach")))
        windows = steps.windows.with_row_index("w")
        hit = (windows.select("w", "ts", "end").sort("end", maintain_order=True)
               .join_asof(reach, left_on="end", right_on="c_ts", strategy="backward", allow_exact_matches=False,
                          check_sortedness=False)
               .filter(pl.col("reach") > pl.col("ts"))["w"])
        windows = windows.with_columns(pl.col("w").is_in(hit.implode()).alias("capture")).drop("w")
        if windows["capture"].any():
            notes.append(f"{int(windows['capture'].sum())} step(s) record a CUDA/HIP graph capture: not judged "
                         "as steady-state steps")
        steps = Steps(windows, steps.source, steps.label, notes)
    return steps


def _frame(pids: list[str | None], steps: list[int], ts: list[float], end: list[float]) -> pl.DataFrame:
    return pl.DataFrame({"pid": pids, "step": steps, "ts": ts, "end": end, "capture": [False] * len(steps)},
                        schema=SCHEMA)


def _from_markers(ops: pl.DataFrame, notes: list[str]) -> Steps | None:
    # Three plain queries (collect_plain), not a dozen: this runs for every trace, and a query's fixed cost is most
    # of a small trace's time.
    numbered = collect_plain(ops.lazy().filter(pl.col("name").str.starts_with("ProfilerStep#")).select(
        "pid", "ts", "end",
        pl.col("name").str.extract(r"^ProfilerStep#(\d+)$").cast(pl.Int64, strict=False).alias("step")))
    if not numbered.height:
        return None
    # A marker far from every other op (a ts of 1e300) made a step of 1e300 us, and every share of it nothing.
    starts = ops["ts"]
    middle = starts.filter(starts.is_finite()).median()
    stray = numbered["ts"].is_finite().not_() | ((numbered["ts"] - (middle or 0.0)).abs() > MAX_SPAN_US)
    if stray.any():
        notes.append(f"{int(stray.sum())} ProfilerStep marker(s) more than {MAX_SPAN_US:.0e} us from the trace's ops "
                     "ignored")
        numbered = numbered.filter(~stray)
    unreadable = numbered["step"].null_count()
    if unreadable:
        notes.append(f"{unreadable} ProfilerStep marker(s) with a step number that is not a 64-bit integer ignored")
    readable = numbered.height - unreadable
    if not readable:
        return None
    windows = collect_plain(numbered.lazy().filter(pl.col("step").is_not_null())
                            .select(pl.col("pid").cast(pl.String), "step", "ts", "end")
                            .sort(["pid", "step", "ts"]).unique(["pid", "step"], keep="first", maintain_order=True)
                            .with_columns(pl.lit(False).alias("capture")).sort(["pid", "ts", "step"]).cast(SCHEMA))
    repeated = readable - windows.height
    if repeated:  # said, not silent: every marker named ProfilerStep#2 read as one step holding all the work
        notes.append(f"{repeated} ProfilerStep marker(s) repeating a step number of their process ignored (the "
                     "first of each number kept)")
    # A marker inside another one of its process (a nested ProfilerStep) is not a step of its own.
    nested = windows.select((pl.col("end") <= pl.col("end").cum_max().shift(1).over("pid")).fill_null(False))
    inner = int(nested.to_series().sum())
    if inner:
        notes.append(f"{inner} ProfilerStep marker(s) nested in another one ignored")
        windows = windows.filter(~nested.to_series())
    return Steps(windows, "markers", "ProfilerStep#N", notes)


def _inferred(ops: pl.DataFrame, op_parent: list[int | None], notes: list[str]) -> Steps | None:
    for pattern, edge in ITERATION_MARKERS:
        marks = ops.filter(pl.col("name").str.contains(pattern))
        if marks.height <= MIN_INFERRED_STEPS:
            continue
        # The thread that recurs most is the training loop's.
        pid, tid, _ = (marks.group_by("pid", "tid").len().sort(["len", "pid", "tid"], descending=[True, False, False])
                       .row(0))
        marks = marks.filter((pl.col("pid") == pid) & (pl.col("tid") == tid)).sort("ts")
        bounds = marks["end" if edge == "end" else "ts"].to_list()
        name = marks["name"][0]
        starts, ends = bounds[:-1], bounds[1:]
        return _finish(str(pid), starts, ends, f"{name} ({'end' if edge == 'end' else 'start'} of each iteration)",
                       notes)
    annotations = ops.with_columns(pl.Series("parent", op_parent, dtype=pl.Int64)).filter(
        (pl.col("cat") == "user_annotation") & pl.col("parent").is_null()
        & ~pl.col("name").str.starts_with("ProfilerStep#"))
    # A step holds most of its thread's work: an annotation that recurs around a small part of it (FSDP's
    # pre_forward hook of one layer, in an Nsight Systems export with no step range) is no iteration.
    top_level = (ops.with_columns(pl.Series("parent", op_parent, dtype=pl.Int64)).filter(pl.col("parent").is_null())
                 .group_by("pid", "tid").agg(pl.col("dur").sum().alias("top_dur")))
    recurring = (annotations.group_by("pid", "tid", "name").agg(pl.len().alias("n"), pl.col("dur").sum())
                 .filter(pl.col("n") >= MIN_INFERRED_STEPS)
                 .join(top_level, on=["pid", "tid"], how="left", nulls_equal=True)
                 .filter(pl.col("dur") >= MIN_STEP_SHARE * pl.col("top_dur")).drop("top_dur")
                 .sort(["dur", "name", "pid", "tid"], descending=[True, False, False, False]))
    if not recurring.height:
        return None
    pid, tid, name = recurring.row(0)[:3]
    spans = annotations.filter((pl.col("pid") == pid) & (pl.col("tid") == tid) & (pl.col("name") == name)).sort("ts")
    return _finish(str(pid), spans["ts"].to_list(), spans["end"].to_list(), f"{name} (a recurring top-level "
                   "annotation)", notes)


def _finish(pid: str, starts: list[float], ends: list[float], label: str, notes: list[str]) -> Steps | None:
    if len(starts) < MIN_INFERRED_STEPS:
        return None
    numbers = list(range(1, len(starts) + 1))
    durations = [e - s for s, e in zip(starts, ends, strict=True)]
    rest = sorted(durations[1:])
    if len(starts) > MIN_INFERRED_STEPS and durations[0] > WARMUP_FACTOR * rest[len(rest) // 2]:
        notes.append("the first inferred step is left out as warm-up: it took "
                     f"{durations[0] / rest[len(rest) // 2]:.1f}x the median step")
        starts, ends, numbers = starts[1:], ends[1:], numbers[1:]
    notes.append(f"no ProfilerStep markers: {len(starts)} steps inferred from {label}")
    return Steps(_frame([pid] * len(starts), numbers, starts, ends), "inferred", label, notes)


def _whole_trace(ops: pl.DataFrame, launches: pl.DataFrame, gpu: pl.DataFrame, op_parent: list[int | None],
                 notes: list[str]) -> Steps:
    frames = [f for f in (ops, launches, gpu) if f.height]
    if not frames:
        return Steps(_frame([], [], [], []), "trace", "whole trace", notes)
    start = min(f["ts"].min() for f in frames)  # type: ignore[type-var]
    end = max(f["end"].max() for f in frames)  # type: ignore[type-var]
    warm_ends = [t for t in (_first_call_end(ops, op_parent), _warmup_annotation_end(ops)) if t is not None]
    warm_end = max(warm_ends) if warm_ends else None
    if warm_end is not None and warm_end < end:
        notes.append("no step markers: the trace is one window, after the first call (warm-up) ends")
        start = warm_end
    return Steps(_frame([None], [-1], [float(start)], [float(end)]), "trace", "whole trace", notes)


WARMUP_NAME = r"(?i)warm[-_ ]?up"


def _warmup_annotation_end(ops: pl.DataFrame) -> float | None:
    """The end of the last annotation that calls itself warm-up (benchmark harnesses label their warm-up)."""
    marked = ops.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.contains(WARMUP_NAME))
    return float(marked["end"].max()) if marked.height else None  # type: ignore[arg-type]


def _first_call_end(ops: pl.DataFrame, op_parent: list[int | None]) -> float | None:
    """Where the second call begins on the busiest thread, when the sequence of top-level ops starts over (a
    benchmark or inference loop whose first call carries the lazy initialisation and autotuning). A level that
    holds a single op (a wrapping annotation) is looked into."""
    if not ops.height:
        return None
    tree = ops.select("idx", "name", "pid", "tid", "ts", "end").with_columns(
        pl.Series("parent", op_parent, dtype=pl.Int64))
    top = tree.filter(pl.col("parent").is_null())
    if not top.height:
        return None
    pid, tid, _ = top.group_by("pid", "tid").len().sort(["len", "pid", "tid"], descending=[True, False, False]).row(0)
    level = top.filter((pl.col("pid") == pid) & (pl.col("tid") == tid)).sort("ts")
    for _ in range(8):
        if level.height != 1:
            break
        level = tree.filter(pl.col("parent") == level["idx"][0]).sort("ts")
    if level.height < 2:
        return None
    again = level.slice(1).filter(pl.col("name") == level["name"][0])
    return float(again["ts"][0]) if again.height else None


def capture_windows(launches: pl.DataFrame) -> pl.DataFrame:
    """Graph-capture intervals (c_ts, c_end) from Begin/EndCapture calls on each thread."""
    calls = launches.filter(pl.col("name").str.contains(CAPTURE_BEGIN) | pl.col("name").str.contains(CAPTURE_END))
    empty = pl.DataFrame(schema={"c_ts": pl.Float64, "c_end": pl.Float64})
    if not calls.height:
        return empty
    out: list[tuple[float, float]] = []
    began: dict[tuple[object, object], float] = {}
    for pid, tid, name, ts, end in calls.sort("ts").select("pid", "tid", "name", "ts", "end").iter_rows():
        if re.match(CAPTURE_BEGIN, name):
            began[(pid, tid)] = ts
        elif (pid, tid) in began:
            out.append((began.pop((pid, tid)), end))
    if not out:
        return empty
    return pl.DataFrame(out, schema=empty.schema, orient="row")


def assign(frame: pl.DataFrame, windows: pl.DataFrame, by_process: bool = True) -> pl.DataFrame:
    """`frame` with the step whose window holds each row's start, on the row's own process (null outside)."""
    if not windows.height or not frame.height:
        return frame.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    whole = windows["pid"].null_count() == windows.height
    by = [] if whole or not by_process else ["w_pid"]
    right = windows.lazy().select(pl.col("pid").alias("w_pid"), "step", pl.col("ts").alias("w_ts"),
                                  pl.col("end").alias("w_end")).sort("w_ts")
    # Only the columns the join needs are sorted and joined; the step comes back in row order and is added to
    # `frame`, whose columns are then shared, not copied (a million ops would otherwise be held twice). One query:
    # its fixed cost is most of a small trace's time, and this runs for each table.
    left = frame.lazy().select(pl.int_range(pl.len()).alias("row"), "ts",
                               pl.col("pid").cast(pl.String).alias("w_pid")).sort("ts")
    if not by:
        right = right.drop("w_pid")
    joined = left.join_asof(right, left_on="ts", right_on="w_ts", by=by or None, strategy="backward",
                            check_sortedness=False)
    step = joined.sort("row").select(pl.when(pl.col("ts") <= pl.col("w_end")).then(pl.col("step")).alias("step"))
    stepped = collect_plain(step).to_series()
    out = frame.with_columns(stepped) if "step" in frame.columns else frame.hstack([stepped])
    return out if out["idx"].is_sorted() else out.sort("idx")
