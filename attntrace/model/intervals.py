"""Busy time as the union of [ts, end) intervals on one device: overlapping streams count once, and
devices are never added together."""

from __future__ import annotations

import polars as pl


def merged_runs(frame: pl.DataFrame, keys: list[str], gap: str | None = None) -> pl.DataFrame:
    """The intervals of each `keys` group merged where they overlap (or, with `gap`, where the space between
    them is shorter than that column): keys, ts, end, in (keys, ts) order. The order is kept on purpose:
    busy_us sums the runs, and a float sum in another order differs in its last bits (polars' hash grouping
    gives its groups in a different order at every run on large frames)."""
    return _merged_runs(frame.lazy(), keys, gap).collect()


def _merged_runs(frame: pl.LazyFrame, keys: list[str], gap: str | None = None) -> pl.LazyFrame:
    reach = pl.col("reach") + pl.col(gap) if gap else pl.col("reach")
    return (frame.select([*keys, "ts", "end", *([gap] if gap else [])]).sort([*keys, "ts"])
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
    runs = merged_runs(frame, keys).lazy().with_columns((pl.col("end") - pl.col("ts")).cum_sum().over(keys)
                                                        .alias("busy_us"))
    return (runs.group_by(keys, maintain_order=True).agg(pl.col("busy_us").last()).sort(keys, nulls_last=True)
            .collect())
