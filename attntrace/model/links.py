"""Links from GPU activity to the launch call that queued it (by correlation id, else by flow events, else a
graph replay by time), and from there to the launching op and its step.

Merged traces hold several processes whose correlation ids collide; a GPU event then goes to the launch whose
process drives its device (learned from the links that are unambiguous), else the nearest earlier launch."""

from __future__ import annotations

import polars as pl

from attntrace.model.plain import collect_plain
from attntrace.model.tables import GRAPH_LAUNCH_APIS


def correlation_from_flows(gpu: pl.DataFrame, flows: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """Older traces link launch and GPU event only by an s/f flow pair: recover the correlation."""
    if not gpu.height or gpu["correlation"].null_count() == 0 or not flows.height:
        return gpu
    flows = flows.filter(pl.col("cat") != "fwdbwd")
    starts = flows.filter(pl.col("ph") == "s").select("cat", "id", pl.col("ts").alias("s_ts"),
                                                       pl.col("tid").alias("s_tid"))
    finishes = flows.filter(pl.col("ph") == "f").select("cat", "id", pl.col("ts").alias("f_ts"),
                                                         pl.col("tid").alias("f_tid"))
    # Each finish pairs with one start of its flow: the last one before it, else (a GPU clock behind the host's)
    # the first one after it. Not every start of a reused id: merged traces reuse ids across processes, and a
    # hostile one may reuse one id throughout (3,000 flows of one id were 9M pairs).
    starts = starts.sort("s_ts", maintain_order=True)
    before = finishes.sort("f_ts", maintain_order=True).join_asof(
        starts, left_on="f_ts", right_on="s_ts", by=["cat", "id"], strategy="backward", check_sortedness=False)
    after = before.filter(pl.col("s_ts").is_null()).select(finishes.columns).join_asof(
        starts, left_on="f_ts", right_on="s_ts", by=["cat", "id"], strategy="forward", check_sortedness=False)
    pairs = pl.concat([before, after]).filter(pl.col("s_ts").is_not_null())
    # One launch per (time, thread), the first: launches that share a start time on a thread would otherwise
    # join every flow start there to every one of them (4,000 launches at one time: 16M rows, 2 GB).
    keyed = launches.select(pl.col("correlation").alias("flow_corr"), pl.col("ts").alias("s_ts"),
                            pl.col("tid").cast(pl.String).alias("s_tid")).unique(["s_ts", "s_tid"], keep="first",
                                                                                  maintain_order=True)
    pairs = pairs.join(keyed, on=["s_ts", "s_tid"], maintain_order="left").unique(["f_ts", "f_tid"], keep="first",
                                                                                  maintain_order=True)
    gpu = gpu.with_columns(pl.col("tid").cast(pl.String).alias("f_tid"), pl.col("ts").alias("f_ts"))
    gpu = gpu.join(pairs.select("f_ts", "f_tid", "flow_corr"), on=["f_ts", "f_tid"], how="left")
    return gpu.with_columns(pl.coalesce("correlation", "flow_corr").alias("correlation")).drop(
        "f_ts", "f_tid", "flow_corr").sort("idx")


def link_gpu(gpu: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """`gpu` with launch (index), op, launch_step, launch_api and launch_pid of its launch call (null if none).

    `launches` carries idx, pid, ts, correlation, op, step and name."""
    keyed = collect_plain(launches.lazy().filter(pl.col("correlation").is_not_null()).select(
        pl.col("idx").alias("launch"), "correlation", "op", pl.col("step").alias("launch_step"),
        pl.col("name").alias("launch_api"), pl.col("pid").cast(pl.String).alias("launch_pid"),
        pl.col("ts").alias("launch_ts")))
    cand = _candidates(gpu.select("idx", "correlation", "device", "ts"), keyed)
    fanout = cand.group_by("idx").len()
    if fanout.height and fanout["len"].max() > 1:  # type: ignore[operator]
        cand = _disambiguate(cand, fanout)
    linked = gpu.join(cand.drop("correlation", "device", "ts"), on="idx", how="left")
    return _graph_replays(linked, launches).sort("idx")


def _candidates(gpu: pl.DataFrame, keyed: pl.DataFrame) -> pl.DataFrame:
    """Each GPU event with the launches that share its correlation id: one per process, since ids are unique within
    one. Where a process reuses an id (a hostile or broken trace: 5,000 launches and kernels of one id were 25M
    pairs, 9.7 GB), only its launch nearest before the event is kept, else its nearest after, which is the one
    _disambiguate would pick among them."""
    reused = collect_plain(keyed.lazy().group_by("correlation", "launch_pid").len().filter(pl.col("len") > 1))
    if not reused.height:
        return gpu.join(keyed, on="correlation", how="inner")
    processes = keyed.select("correlation", "launch_pid").unique(maintain_order=True)
    left = gpu.join(processes, on="correlation", how="inner").sort("ts", maintain_order=True)
    right = keyed.sort("launch_ts", maintain_order=True)
    before = left.join_asof(right, left_on="ts", right_on="launch_ts", by=["correlation", "launch_pid"],
                            strategy="backward", check_sortedness=False)
    after = before.filter(pl.col("launch").is_null()).select(left.columns).join_asof(
        right, left_on="ts", right_on="launch_ts", by=["correlation", "launch_pid"], strategy="forward",
        check_sortedness=False)
    return (pl.concat([before, after]).filter(pl.col("launch").is_not_null())
            .select(*gpu.columns, *[c for c in keyed.columns if c != "correlation"]).sort("idx", maintain_order=True))


def _disambiguate(cand: pl.DataFrame, fanout: pl.DataFrame) -> pl.DataFrame:
    cand = cand.join(fanout, on="idx")
    votes = (cand.filter(pl.col("len") == 1).group_by("launch_pid", "device").agg(pl.len().alias("votes")))
    # With no unambiguous link at all (a trace duplicated as a second rank), pair the k-th process with the
    # k-th device.
    pid_order = cand.select("launch_pid").unique().sort("launch_pid").with_row_index("pid_rank")
    dev_order = cand.select("device").unique().sort("device", nulls_last=True).with_row_index("dev_rank")
    scored = (cand.join(votes, on=["launch_pid", "device"], how="left", nulls_equal=True)
              .join(pid_order, on="launch_pid").join(dev_order, on="device", nulls_equal=True)
              .with_columns(pl.col("votes").fill_null(0),
                            (pl.col("pid_rank") == pl.col("dev_rank")).alias("paired"),
                            (pl.col("ts") >= pl.col("launch_ts")).alias("after"),
                            (pl.col("ts") - pl.col("launch_ts")).abs().alias("lag")))
    return (scored.sort(["idx", "votes", "paired", "after", "lag"], descending=[False, True, True, True, False])
            .unique("idx", keep="first").select(cand.columns).drop("len"))


def _graph_replays(linked: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """Kernels replayed from a CUDA/HIP graph that carry no correlation go to the graph launch that precedes
    them. A kernel whose correlation names a launch outside the trace (queued before profiling) stays unlinked."""
    graphs = launches.filter(pl.col("name").is_in(GRAPH_LAUNCH_APIS))
    orphans = linked.filter(pl.col("launch").is_null() & (pl.col("correlation").is_null()
                                                          | (pl.col("correlation") == 0)))
    if not graphs.height or not orphans.height:
        return linked
    right = graphs.select(pl.col("idx").alias("g_launch"), pl.col("op").alias("g_op"),
                          pl.col("step").alias("g_step"), pl.col("name").alias("g_api"),
                          pl.col("pid").cast(pl.String).alias("g_pid"), pl.col("ts").alias("g_ts")).sort("g_ts")
    found = orphans.select("idx", "ts").sort("ts").join_asof(right, left_on="ts", right_on="g_ts",
                                                             strategy="backward", check_sortedness=False)
    found = found.filter(pl.col("g_launch").is_not_null()).drop("ts", "g_ts")
    return (linked.join(found, on="idx", how="left")
            .with_columns(pl.coalesce("launch", "g_launch").alias("launch"), pl.coalesce("op", "g_op").alias("op"),
                          pl.coalesce("launch_step", "g_step").alias("launch_step"),
                          pl.coalesce("launch_api", "g_api").alias("launch_api"),
                          pl.coalesce("launch_pid", "g_pid").alias("launch_pid"))
            .drop("g_launch", "g_op", "g_step", "g_api", "g_pid"))


def gpu_step_windows(gpu: pl.DataFrame, gpu_annotations: pl.DataFrame) -> pl.DataFrame:
    """idx -> step of GPU events by the GPU-side ProfilerStep window on their device that they start in."""
    # Two plain queries (collect_plain), not eight: this runs for every trace with steps.
    marks = collect_plain(
        gpu_annotations.lazy()
        .with_columns(pl.col("name").str.extract(r"^ProfilerStep#(\d+)$").cast(pl.Int64, strict=False)
                      .alias("time_step"),
                      pl.col("pid").cast(pl.Int64, strict=False).alias("device"))
        .filter(pl.col("time_step").is_not_null())
        .select("device", "time_step", pl.col("ts").alias("w_ts"), pl.col("end").alias("w_end")).sort("w_ts"))
    if not marks.height or not gpu.height:
        return gpu.select("idx", pl.lit(None, dtype=pl.Int64).alias("time_step"))
    left = gpu.lazy().select("idx", "ts", pl.col("device").cast(pl.Int64)).sort("ts")
    joined = left.join_asof(marks.lazy(), left_on="ts", right_on="w_ts", by="device", strategy="backward",
                            check_sortedness=False)
    return collect_plain(joined.select("idx", pl.when(pl.col("ts") <= pl.col("w_end")).then(pl.col("time_step"))
                                       .alias("time_step")))
