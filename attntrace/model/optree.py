"""The op tree, which the trace does not write: CPU ops nest by time containment on their (pid, tid)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import polars as pl


def op_parents(ops: pl.DataFrame) -> list[int | None]:
    """Parent op index of every op: on its thread, the latest op before it (by start, longer first) that has
    not ended when it starts. An op that starts inside its parent but overruns it (clock rounding) still nests.

    That op is the previous one when it is still open (a first child: found for all ops at once); else it is
    the first of the previous op's ancestors still open, climbed to in file order, since every op between an
    op and its parent ended before it."""
    # Stable: ops with one span keep their file order, the same at every run (polars' default sort may not).
    ordered = ops.select("idx", "pid", "tid", "ts", "end").sort(
        ["pid", "tid", "ts", "end"], descending=[False, False, False, True], maintain_order=True)
    same_thread = (pl.struct("pid", "tid") == pl.struct("pid", "tid").shift(1)).fill_null(False)
    # An op that starts where the previous one ended follows it (whole-microsecond clocks make that common: an
    # `aten::copy_` right after its sibling `aten::empty_strided`, nested under it, was a second finding of one
    # cause); only an op of no length there fits inside it.
    ordered = ordered.with_columns(pl.col("idx").shift(1).alias("previous"),
                                   (same_thread & ((pl.col("end").shift(1) > pl.col("ts"))
                                                   | ((pl.col("end").shift(1) == pl.col("ts"))
                                                      & (pl.col("end") == pl.col("ts"))))).alias("inside"),
                                   same_thread.alias("same_thread"))
    parent: list[int | None] = (ordered.select(pl.col("idx"), pl.when("inside").then("previous").alias("parent"))
                                .sort("idx")["parent"].to_list())
    climbing = ordered.filter(pl.col("same_thread") & ~pl.col("inside"))
    ends = ops["end"].to_list()
    for idx, previous, ts, end in zip(climbing["idx"].to_list(), climbing["previous"].to_list(),
                                      climbing["ts"].to_list(), climbing["end"].to_list(), strict=True):
        up = parent[previous]
        while up is not None and (ends[up] < ts or (ends[up] == ts and end > ts)):
            up = parent[up]
        parent[idx] = up
    return parent


class Children(Mapping[int | None, list[int]]):
    """Child ops of each op, in start order (None holds the top-level ops): slices of one list of op indices
    sorted by (parent, start), taken when asked for. (A list per op for a million ops took 0.4 s, for rules
    that walk down from a few.)"""

    def __init__(self, order: list[int], first: dict[int | None, int], count: dict[int | None, int]) -> None:
        self._order, self._first, self._count = order, first, count

    def __getitem__(self, op: int | None) -> list[int]:
        at = self._first[op]
        return self._order[at:at + self._count[op]]

    def __iter__(self) -> Iterator[int | None]:
        return iter(self._first)

    def __len__(self) -> int:
        return len(self._first)


def op_children(ops: pl.DataFrame, parent: list[int | None]) -> Children:
    by_parent = (ops.select("idx", "ts").with_columns(pl.Series("parent", parent, dtype=pl.Int64))
                 .sort(["parent", "ts"], maintain_order=True).with_row_index("at"))
    runs = by_parent.group_by("parent", maintain_order=True).agg(pl.col("at").first(), pl.len())
    parents = runs["parent"].to_list()
    return Children(by_parent["idx"].to_list(), dict(zip(parents, runs["at"].to_list(), strict=True)),
                    dict(zip(parents, runs["len"].to_list(), strict=True)))


def innermost_ops(calls: pl.DataFrame, ops: pl.DataFrame, parent: list[int | None]) -> list[int | None]:
    """For each call (in `calls` order), the innermost op containing it on the same thread."""
    if not calls.height or not ops.height:
        return [None] * calls.height
    keyed_ops = ops.select("idx", pl.col("pid").cast(pl.String), pl.col("tid").cast(pl.String), "ts")
    keyed = calls.select(pl.col("idx").alias("call"), pl.col("pid").cast(pl.String),
                         pl.col("tid").cast(pl.String), pl.col("ts").alias("call_ts"))
    # The latest-starting op at or before the call on its thread is the innermost candidate; if it ended
    # before the call, climb its parents until one contains the call.
    cand = keyed.sort("call_ts", maintain_order=True).join_asof(
        keyed_ops.sort("ts", maintain_order=True), left_on="call_ts", right_on="ts", by=["pid", "tid"],
        strategy="backward", check_sortedness=False)
    ends = ops["end"].to_list()
    result: dict[int, int | None] = {}
    # The calls come in time order, so an op that ended before one call ended before every later one: each op
    # climbed past keeps a pointer to where that climb stopped, and later climbs jump there. Without it, ops
    # that share one start nest in a chain as deep as their number, and every call climbed it (113k ops at one
    # ts took 273 s against 4.8 s distinct).
    above = list(parent)
    # Columns as lists rather than iter_rows: a tuple per row cost more than the climb.
    for call, call_ts, op in zip(cand["call"].to_list(), cand["call_ts"].to_list(), cand["idx"].to_list(),
                                 strict=True):
        passed = []
        while op is not None and ends[op] < call_ts:
            passed.append(op)
            op = above[op]
        for ended in passed:
            above[ended] = op
        result[call] = op
    return [result.get(i) for i in calls["idx"].to_list()]
