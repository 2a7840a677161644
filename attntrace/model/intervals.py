"""Busy time as the union of [ts, end) intervals on one device: overlapping streams count once, and
devices are never added together."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.model.plain import collect_plain

# Up to this many intervals are merged in Python: polars' window and grouping queries cost milliseconds each
# whatever the rows (4 ms for four intervals on a 2-core host), and a small trace asks for a dozen merges.
SMALL_FRAME_ROWS = 2000


def merged_runs(frame: pl.DataFrame, keys: list[str], gap: str | None = None) -> pl.DataFrame:
    """The intervals of each `keys` group merged where they overlap (or, with `gap`, where the space between
    them is shorter than that column): keys, ts, end, in (keys, ts) order. The order is kept on purpose:
    busy_us sums the runs, and a float sum in another order differs in its last bits (polars' hash grouping
    gives its groups in a different order at every run on large frames)."""
    if _small(frame, gap):
        schema = {k: frame.schema[k] for k in [*keys, "ts", "end"]}
        return pl.DataFrame(_merged_rows(frame, keys, gap), schema=schema, orient="row")
    return collect_plain(_merged_runs(frame.lazy(), keys, gap))  # in memory: 8 ms against 19 ms for 42k kernels


def _small(frame: pl.DataFrame, gap: str | None) -> bool:
    """Whether the Python merge takes this frame: few rows, and no null or NaN time (polars orders those)."""
    return frame.height <= SMALL_FRAME_ROWS and all(
        frame[c].null_count() == 0 and not any(v != v for v in frame[c].to_list() if isinstance(v, float))
        for c in ["ts", "end", *([gap] if gap else [])])


def _merged_rows(frame: pl.DataFrame, keys: list[str], gap: str | None) -> list[tuple[Any, ...]]:
    """merged_runs in Python, row for row the same: (keys, ts) order with null keys first, as polars sorts."""
    width = len(keys)
    # Column by column: a select then rows() is two polars calls of ~0.1 ms each, to_list a few microseconds.
    rows = list(zip(*(frame[c].to_list() for c in [*keys, "ts", "end", *([gap] if gap else [])]), strict=True))
    rows.sort(key=lambda row: (*((value is not None, value) for value in row[:width]), *row[width:]))
    merged: list[tuple[Any, ...]] = []
    group: tuple[Any, ...] | None = None
    reach = start = end = 0.0
    for row in rows:
        key, ts, stop = row[:width], row[width], row[width + 1]
        if key != group or ts > reach + (row[width + 2] if gap else 0):
            if group is not None:
                merged.append((*group, start, end))
            group, start, end, reach = key, ts, stop, stop
        else:
            end = max(end, stop)
            reach = max(reach, stop)
    if group is not None:
        merged.append((*group, start, end))
    return merged


def _merged_runs(frame: pl.LazyFrame, keys: list[str], gap: str | None = None) -> pl.LazyFrame:
    reach = pl.col("reach") + pl.col(gap) if gap else pl.col("reach")
    # With a gap, rows at one time merge or split by the order they come in: end and gap settle it, so that the
    # runs are the same at every run (an unstable sort on keys and time alone gave either).
    order = [*keys, "ts", *(["end", gap] if gap else [])]
    return (frame.select([*keys, "ts", "end", *([gap] if gap else [])]).sort(order)
            .with_columns(pl.col("end").cum_max().shift(1).over(keys).alias("reach"))
            .with_columns((pl.col("reach").is_null() | (pl.col("ts") > reach)).cast(pl.Int64).cum_sum().over(keys)
                          .alias("run"))
            .group_by([*keys, "run"], maintain_order=True).agg(pl.col("ts").min(), pl.col("end").max())
            .drop("run"))


def busy_us(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Busy microseconds per `by` group and device (the union of that device's streams). With `by` empty, one
    row per device; `busy_us` of a whole trace is the largest of them, never their sum. Two queries, not four:
    it runs for every step table, replay and idle rule of every trace, and a query's fixed cost is most of a small
    trace's."""
    keys = [*by, "device"]
    if not frame.height:
        return pl.DataFrame(schema={**{k: frame.schema.get(k, pl.Int64) for k in keys}, "busy_us": pl.Float64})
    # The runs are collected before they are summed: in one query with the merge, the optimiser summed them in
    # another order (tests/test_model.py's busy-time test saw the last bits change).
    # A running sum in (keys, ts) order, its last value per group: a grouped sum may add partial sums in any order
    # (the last bits changed with the rows' order).
    if _small(frame, None):
        return _busy_small(frame, keys)
    runs = merged_runs(frame, keys).lazy().with_columns((pl.col("end") - pl.col("ts")).cum_sum().over(keys)
                                                        .alias("busy_us"))
    return collect_plain(runs.group_by(keys, maintain_order=True).agg(pl.col("busy_us").last())
                         .sort(keys, nulls_last=True))


def _busy_small(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """busy_us in Python for a small frame: each group's runs summed in (keys, ts) order, as the running sum is."""
    width = len(keys)
    totals: dict[tuple[Any, ...], float] = {}
    for row in _merged_rows(frame, keys, None):
        key = row[:width]
        totals[key] = totals.get(key, 0.0) + (row[width + 1] - row[width])
    ordered = sorted(totals.items(), key=lambda item: tuple((value is None, value) for value in item[0]))
    schema = {**{k: frame.schema[k] for k in keys}, "busy_us": pl.Float64}
    return pl.DataFrame([(*key, busy) for key, busy in ordered], schema=schema, orient="row")
