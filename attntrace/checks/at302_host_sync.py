"""AT302 host-sync: the CPU waits for the GPU inside a step."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.checks.base import IDLE_REMOVED, Context, fmt_us
from attntrace.model.intervals import merged_runs
from attntrace.model.measured import measured_pace
from attntrace.model.replay import BLOCKING_CALLS, SYNC_FLOOR_US, Change, Replay
from attntrace.model.whatif import describe

BLOCKING = sorted(BLOCKING_CALLS)


def _held(ctx: Context, syncs: pl.DataFrame, replayed: Replay) -> pl.DataFrame:
    """How long each sync held the CPU (blocked_us): the op it ran in, whole (a `.item()` is
    `_local_scalar_dense`: a blocking copy, a synchronize, the op's own work), or the call alone outside any op;
    and the same without the profiler (held_est_us): less the costs the replay charges for that op and its
    runtime calls, no less than SYNC_FLOOR_US. Removing the sync saves the CPU that time, and the GPU no more of
    its idle after the sync: the CPU work before the next launch stays."""
    # Ops, not annotations: a torch.cuda.synchronize() called in a `record_function` block (a benchmark's
    # "[param|...|forward]", DistributedDataParallel.forward) has the block as its innermost event, and the
    # block's 100 ms are no time the sync held.
    # PyTorch 1.8-1.10 write those blocks as "Operator" too: an op has a namespace (aten::, c10d::, fbgemm::).
    ops = (ctx.trace.ops.filter((pl.col("cat") == "cpu_op") & pl.col("name").str.contains("::", literal=True))
           .select(pl.col("idx").cast(pl.Int64).alias("op"), pl.col("dur").alias("op_us")))
    calls = ctx.trace.launches_linked.filter(pl.col("op").is_not_null()).group_by("op").len("op_calls")
    # The profiler's cost per op and per runtime call charged to each device's process (its host's scale).
    fallback = replayed.costs
    charged = replayed.charged().rename({"op_us": "op_cost", "call_us": "call_cost"})
    op_cost = pl.col("op_cost").fill_null(fallback.op_cost(replayed.settings) if fallback is not None else 0.0)
    call_cost = pl.col("call_cost").fill_null(fallback.runtime_call_us if fallback is not None else 0.0)
    return (syncs.join(ops, on="op", how="left").join(calls, on="op", how="left")
            .join(charged, left_on=pl.col("device").cast(pl.Int64), right_on="device", how="left")
            .with_columns(pl.coalesce("op_us", "dur").alias("blocked_us"))
            .with_columns(pl.max_horizontal(
                pl.lit(SYNC_FLOOR_US), pl.col("blocked_us") - pl.when(pl.col("op_us").is_not_null()).then(
                    op_cost + call_cost * pl.col("op_calls").fill_null(0)).otherwise(call_cost)).alias("held_est_us"))
            .drop("op_us", "op_calls", "op_cost", "call_cost"))


def _idle_after(ctx: Context, syncs: pl.DataFrame) -> list[float | None]:
    """Idle time of the device that synced that the sync caused, as recorded: from the end of the device's busy
    run at or before its return (streams merged) to the start of its next one, by the end of the next step's
    window at the latest (a sync at a step's end idles the GPU while the next step's first launches are
    queued), and no more than the syncs before that run held the CPU (a sync that found the GPU done causes
    none of the CPU work after it); None when the device does not run again by then. Syncs in a row with no
    GPU work between them share one gap and their waits: it counts for the first of them, the others add 0,
    so syncs never idle the GPU longer than the time between its runs."""
    gpu = ctx.trace.gpu_linked.select("ts", "end", pl.col("device").cast(pl.Int64))
    if not gpu.height:
        return [None] * syncs.height
    # Each step's window end, and the next step's (the latest a sync's idle may run to).
    windows = (ctx.trace.steps.group_by("step").agg(pl.col("end").max().alias("w_end")).sort("step")
               .with_columns(pl.col("w_end").shift(-1).fill_null(pl.col("w_end")).alias("w_next")))
    keyed = (syncs.select(pl.col("end").alias("t"), pl.col("device").cast(pl.Int64), "step", "blocked_us")
             .with_row_index("row").join(windows, on="step", how="left"))
    by = "device" if keyed["device"].null_count() == 0 else None
    runs = merged_runs(gpu if by else gpu.with_columns(pl.lit(None, dtype=pl.Int64).alias("device")), ["device"])
    runs = runs.with_columns(pl.col("ts").shift(-1).over("device").alias("next"))
    joined = keyed.sort("t").join_asof(runs.select("device", "ts", pl.col("end").alias("prev"), "next"),
                                       left_on="t", right_on="ts", by=by, strategy="backward",
                                       check_sortedness=False)
    # Without step markers, the wait for work that only starts after the window (set-up, the next phase of a
    # script) is not this workload's idle time.
    bounded = not ctx.trace.has_step_markers
    idle: list[float | None] = [None] * syncs.height
    first_of_gap: dict[tuple[Any, ...], int] = {}
    waited: dict[tuple[Any, ...], float] = {}
    for row, device, begin, end, w_end, w_next, blocked in joined.sort("t", "row").select(
            "row", "device", "prev", "next", "w_end", "w_next", "blocked_us").iter_rows():
        if begin is None:  # nothing ran before it: the sync waited for nothing
            idle[row] = 0.0
            continue
        if end is None or (bounded and w_end is not None and end > w_end):
            continue
        if w_next is not None:
            end = min(end, max(w_next, begin))
        gap = (device, begin)
        waited[gap] = waited.get(gap, 0.0) + float(blocked or 0.0)
        if gap in first_of_gap:
            idle[row] = 0.0
        else:
            first_of_gap[gap] = row
            idle[row] = max(0.0, end - begin)
    for gap, row in first_of_gap.items():
        idle[row] = min(idle[row] or 0.0, waited[gap])
    return idle


# Each kind of sync has its own change that removes it.
ITEM_FIX = ("Keep the value on the GPU until it is needed: accumulate `running += loss.detach()` and call `.item()` "
            "once per logging interval; replace Python `if tensor:`/`int(tensor)` on CUDA tensors with tensor ops "
            "(`torch.where`, masks).")
COPY_FIX = ("Make the host<->device copy asynchronous: allocate the host tensor in pinned memory "
            "(`.pin_memory()`, `DataLoader(pin_memory=True)`) and copy with `.to(device, non_blocking=True)`; or "
            "build the tensor on the device directly (`torch.arange(..., device=\"cuda\")`) instead of on the CPU "
            "and moving it.")
SYNC_FIX = ("Remove the explicit `torch.cuda.synchronize()` / `event.synchronize()` inside the step: the next "
            "op waits for its inputs anyway. Synchronize only where the host must read a result, or to time the "
            "step outside the profiled region.")


def _cause(chain: str) -> tuple[str, str]:
    """(what made the sync, the change that removes it), from the op chain that ran it."""
    if "aten::item" in chain or "_local_scalar_dense" in chain:
        return "a .item() (or a Python bool/int/float) of a CUDA tensor", ITEM_FIX
    if any(op in chain for op in ("aten::to", "aten::_to_copy", "aten::copy_")):
        return "a blocking copy between host and device (.to()/.cpu()/.cuda() with pageable memory)", COPY_FIX
    if chain.startswith("(no op"):
        return "a synchronize call outside any op (torch.cuda.synchronize() or an event wait)", SYNC_FIX
    innermost = chain.split(" > ")[-1]
    if not innermost.startswith("aten::"):
        return f"a synchronize call (torch.cuda.synchronize() or an event wait) inside {innermost}", SYNC_FIX
    return f"{innermost} waiting for the GPU", ITEM_FIX


def check(ctx: Context) -> list[dict[str, Any]]:
    syncs = ctx.trace.launches_on_devices.filter(pl.col("step").is_in(ctx.trace.steady_steps)
                                                 & pl.col("name").is_in(list(BLOCKING)))
    if not syncs.height:
        return []
    replayed = ctx.trace.replay
    syncs = _held(ctx, syncs, replayed)
    recorded_idle = _idle_after(ctx, syncs)
    # The GPU's wait after each sync as the program runs without the profiler (the replay), where it can say, no
    # longer than the sync held the CPU without the profiler.
    by_replay = replayed.idle_after_sync if not replayed.reason else {}
    idle = [min(by_replay.get(idx, rec), held) if rec is not None else None
            for idx, rec, held in zip(syncs["idx"].to_list(), recorded_idle, syncs["held_est_us"].to_list(),
                                      strict=True)]
    # Summed per op chain: the replay gives a gap to the last sync of a run, the recording to the first, and
    # without the profiler's cost the CPU reaches the next launch no later than it did, so a chain's idle without
    # the profiler is at most its idle as recorded.
    syncs = syncs.with_columns(pl.Series("idle_us", idle, dtype=pl.Float64),
                               pl.Series("recorded_idle_us", recorded_idle, dtype=pl.Float64))
    steady = replayed.per_device()
    est_step = {d: measured_pace(ctx.trace.calibration, d, s, i, b)[0]
                for d, s, i, b in steady.select("device", "est_step_us", "est_idle_us", "gpu_busy_us").iter_rows()}
    # Per op chain and device: in a merged trace of two ranks, one rank's sync per step and the other's four were
    # one finding ("23 host syncs in 8 steps"), nested under the first rank's idle.
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in syncs.iter_rows(named=True):
        chain = " > ".join(ctx.trace.op_chain(row["op"])) or "(no op: a direct runtime call)"
        groups.setdefault((chain, row["device"] if row["device"] is not None else -1), []).append(row)
    several_devices = len({device for _, device in groups}) > 1
    findings = []
    for (chain, device), rows in sorted(groups.items()):
        steps = ctx.steps_in(r["pid"] for r in rows)
        per_step = len(rows) / steps
        recorded_per_step = sum(r["recorded_idle_us"] or 0.0 for r in rows) / steps
        idle_per_step = min(sum(r["idle_us"] or 0.0 for r in rows) / steps, recorded_per_step)
        cause, fix = _cause(chain)
        wall, change = _wall_saving(ctx, rows, fix is COPY_FIX)
        # A sync that idles the GPU little can still hold the step back (a pageable copy the CPU waits through).
        if idle_per_step < ctx.params["min_idle_us"] and (wall is None or wall < ctx.params["min_idle_us"]):
            continue
        step_us = est_step.get(rows[0]["device"]) or ctx.step_us
        # The idle a sync causes lies inside its step: where the replayed step comes out shorter (a device whose
        # steps the replay could not bound), the step as recorded is the denominator, and the idle stays within it.
        if idle_per_step > step_us:
            step_us = max(step_us, ctx.step_us)
            idle_per_step = min(idle_per_step, step_us)
        share = idle_per_step / step_us if step_us else 0.0
        apis = sorted({r["name"] for r in rows})
        where_step = "step" if ctx.trace.has_step_markers else "trace"
        basis = ("replayed to the step measured without the profiler" if ctx.trace.step_basis == "measured"
                 else "estimated")
        measured = (f"~{fmt_us(idle_per_step)} per {where_step} without the profiler ({100 * share:.1f}% of it, "
                    f"{basis}; {fmt_us(recorded_per_step)} as recorded)" if by_replay else
                    f"{fmt_us(idle_per_step)} per {where_step} ({100 * share:.1f}% of it)")
        findings.append(ctx.finding(
            op=rows[0]["op"],
            key=f"{chain}|{device}" if several_devices else chain,
            device=rows[0]["device"],
            message=(f"{ctx.per_step(len(rows), 'host sync', steps=steps)} from {cause}, via {chain} "
                     f"({', '.join(apis)}); the "
                     f"GPU then idles {measured} waiting for the next launch"
                     + (f"; with {describe(change)}, the step would take ~{fmt_us(wall)} less (wall time, "
                        f"{100 * wall / step_us:.1f}% of the step, replayed)" if wall is not None and step_us
                        else "")),
            where={"op_chain": chain, "kernel": None, "steps": sorted({r["step"] for r in rows})},
            evidence={"syncs_per_step": per_step, "apis": apis, "cpu_wait_us_per_step":
                      sum(r["dur"] for r in rows) / steps, "gpu_idle_us_after_each":
                      [r["idle_us"] for r in sorted(rows, key=lambda r: r["ts"])],
                      "gpu_idle_us_per_step": idle_per_step, "recorded_gpu_idle_us_per_step": recorded_per_step,
                      "without_profiler": bool(by_replay), "step_basis": ctx.trace.step_basis},
            gpu_us_per_step=idle_per_step,
            saving=IDLE_REMOVED,
            assumption=("the GPU's wait after the sync, replayed without the profiler's cost; removing the sync "
                        "lets the CPU queue work ahead") if by_replay else None,
            step_us=step_us,
            fix=fix,
            wall_us_per_step=wall,
            whatif=describe(change) if wall is not None else None,
        ))
    return findings


def _wall_saving(ctx: Context, rows: list[dict[str, Any]], copy: bool) -> tuple[float | None, Change]:
    """What the step loses in wall time with these syncs gone (their ops' blocking calls no longer wait; a copy's
    made pinned and asynchronous), replayed; None where no replay can be made."""
    ops = {r["op"] for r in rows if r["op"] is not None}
    calls = {int(r["idx"]) for r in rows}
    if ops:
        launched = ctx.trace.launches_linked.filter(pl.col("op").is_in(list(ops)))
        calls |= set(launched["idx"].cast(pl.Int64).to_list())
    frozen = frozenset(calls)
    change = Change(drop_syncs=frozen, pin_copies=frozen if copy else frozenset())
    return ctx.wall_saving(change, [rows[0]["device"]]), change
