"""The op tree, which the trace does not write: CPU ops nest by time containment on their (pid, tid)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import polars as pl


def op_parents(ops: pl.DataFrame) -> list[int | None]:
    """Parent op index of every op."""
    parent: list[int | None] = [None] * ops.height
    ordered = ops.select("idx", "pid", "tid", "ts", "end").sort(
        ["pid", "tid", "ts", "end"], descending=[False, False, False, True])
    thread_start = (pl.struct("pid", "tid") != pl.struct("pid", "tid").shift(1)).fill_null(True)
    new_thread = ordered.select(thread_start)[:, 0].to_list()
    ends: list[float] = []  # the open ops of the current thread, innermost last: their ends and indices
    owners: list[int] = []
    # The loop runs once per op (a million in a large trace): its list methods are looked up once.
    end_open, own, close_end, disown = ends.append, owners.append, ends.pop, owners.pop
    for idx, ts, end, fresh in zip(ordered["idx"].to_list(), ordered["ts"].to_list(), ordered["end"].to_list(),
                                   new_thread, strict=True):
        if fresh:
            ends.clear()
            owners.clear()
        while ends and ends[-1] < ts:
            close_end()
            disown()
        # An op that starts inside its parent but overruns it (clock rounding) still nests.
        if owners:
            parent[idx] = owners[-1]
        end_open(end)
        own(idx)
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
    cand = keyed.sort("call_ts").join_asof(
        keyed_ops.sort("ts"), left_on="call_ts", right_on="ts", by=["pid", "tid"], strategy="backward",
        check_sortedness=False)
    ends = ops["end"].to_list()
    result: dict[int, int | None] = {}
    for call, call_ts, op in cand.select("call", "call_ts", "idx").iter_rows():
        while op is not None and ends[op] < call_ts:
            op = parent[op]
        result[call] = op
    return [result.get(i) for i in calls["idx"].to_list()]
