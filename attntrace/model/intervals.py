"""Busy time as the union of [ts, end) intervals on one device: overlapping streams count once, and
devices are never added together."""

from __future__ import annotations

import polars as pl


def merged_runs(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """The intervals of each `keys` group merged where they overlap: keys, ts, end."""
    return (frame.select([*keys, "ts", "end"]).sort([*keys, "ts"])
            .with_columns(pl.col("end").cum_max().shift(1).over(keys).alias("prev_end"))
            .with_columns((pl.col("prev_end").is_null() | (pl.col("ts") > pl.col("prev_end")))
                          .cast(pl.Int64).cum_sum().over(keys).alias("run"))
            .group_by([*keys, "run"]).agg(pl.col("ts").min(), pl.col("end").max())
            .drop("run"))


def busy_us(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Busy microseconds per `by` group and device (the union of that device's streams). With `by` empty, one
    row per device; `busy_us` of a whole trace is the largest of them, never their sum."""
    keys = [*by, "device"]
    if not frame.height:
        return pl.DataFrame(schema={**{k: frame.schema.get(k, pl.Int64) for k in keys}, "busy_us": pl.Float64})
    runs = merged_runs(frame, keys).with_columns((pl.col("end") - pl.col("ts")).alias("busy_us"))
    return runs.group_by(keys).agg(pl.col("busy_us").sum()).sort(keys, nulls_last=True)

