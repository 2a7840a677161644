"""AT402 gpu-idle: the GPU idle for a large share of a step while it waits for the CPU."""

from __future__ import annotations

import re
from typing import Any

import polars as pl

from attntrace.checks.base import IDLE_REMOVED, Context, Skip, fmt_ms
from attntrace.model.critical_path import summarize
from attntrace.model.intervals import merged_runs
from attntrace.model.measured import Spread, measured_pace
from attntrace.model.replay import INDUCTOR_KERNEL_OP, Change
from attntrace.model.whatif import describe, loader_waits

TOP_GAPS = 3
# CPU ops that block the host until other ranks arrive: an idle gap under one is waiting on communication.
BLOCKING_COLLECTIVE = re.compile(r"c10d::|nccl:|record_param_comms|all_reduce|allreduce|all_gather|barrier|"
                                 r"reduce_scatter|alltoall|broadcast", re.IGNORECASE)
KEYS = ["step", "device"]

# The largest gap waits for another rank: this rank's CPU and launches are not what holds the GPU back.
COLLECTIVE_FIX = ("The largest gaps are this rank waiting in a collective for a slower rank: lint all ranks together "
                  "(`attntrace lint RANK_TRACES --group ranks` shows the step-time spread) and fix the slowest one "
                  "(uneven batches or sequence lengths, data loading, stragglers), or overlap the communication "
                  "with compute (DDP `bucket_cap_mb`, FSDP prefetching).")

def _windows(ctx: Context) -> pl.DataFrame:
    """Each (step, device) as recorded, in the replay's chain: from the previous step's end to the later of the next
    step's start and the end of this step's own GPU work. Leading and trailing idle time (data loading, the
    optimizer's CPU work) is inside it. Chained, the windows do not overlap: with the GPU a step behind the CPU, a
    window from the step's start to its GPU work's end held the previous step's tail too (377 ms windows for
    216 ms steps, their idle counted twice)."""
    return ctx.trace.replay.table.select(*KEYS, pl.col("window_ts").alias("w_ts"), pl.col("window_end").alias("w_end")
                                         ).filter(pl.col("w_end") > pl.col("w_ts"))


def _idle(ctx: Context, windows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per window: busy time of all the device's activity (communication included) clipped to it, and its
    idle gaps (step, device, start, end), edges included."""
    gpu = ctx.trace.gpu_linked.select(pl.col("device").cast(pl.Int64), "ts", "end")
    # A range join per device (polars' IEJoin), not every window against every kernel: that product held
    # 30 million rows (600 MB) on a 200 MB trace of 160 steps.
    per_device = [windows.filter(pl.col("device") == device).join_where(
                      gpu.filter(pl.col("device") == device).drop("device"),
                      pl.col("ts") < pl.col("w_end"), pl.col("end") > pl.col("w_ts"))
                  for device in windows["device"].drop_nulls().unique().sort().to_list()]
    clipped = (pl.concat(per_device) if per_device else windows.join(gpu, on="device").clear()).with_columns(
        pl.max_horizontal("ts", "w_ts").alias("ts"), pl.min_horizontal("end", "w_end").alias("end"))
    runs = merged_runs(clipped, KEYS).join(windows, on=KEYS).sort([*KEYS, "ts"])
    inner = (runs.with_columns(pl.col("end").shift(1).over(KEYS).alias("start"))
             .filter(pl.col("start").is_not_null() & (pl.col("ts") > pl.col("start")))
             .select(*KEYS, "start", pl.col("ts").alias("end")))
    edges = runs.group_by(KEYS).agg(pl.col("ts").min().alias("first"), pl.col("end").max().alias("last")).join(
        windows, on=KEYS)
    lead = edges.filter(pl.col("first") > pl.col("w_ts")).select(*KEYS, pl.col("w_ts").alias("start"),
                                                                  pl.col("first").alias("end"))
    tail = edges.filter(pl.col("w_end") > pl.col("last")).select(*KEYS, pl.col("last").alias("start"),
                                                                 pl.col("w_end").alias("end"))
    gaps = pl.concat([inner, lead, tail]).with_columns((pl.col("end") - pl.col("start")).alias("us"))
    per_window = windows.with_columns((pl.col("w_end") - pl.col("w_ts")).alias("span")).join(
        gaps.group_by(KEYS).agg(pl.col("us").sum().alias("idle"), pl.len().alias("gaps")), on=KEYS, how="left")
    return per_window.with_columns(pl.col("idle").fill_null(0.0), pl.col("gaps").fill_null(0)), gaps


def _cpu_ops_during(ctx: Context, start: float, end: float) -> list[str]:
    ops = ctx.trace.ops.filter((pl.col("ts") < end) & (pl.col("end") > start)
                               & ~pl.col("name").str.starts_with("ProfilerStep#"))
    ops = ops.filter((pl.col("cat") == "cpu_op") | pl.col("name").str.contains(BLOCKING_COLLECTIVE.pattern))
    counts = ops.group_by("name").agg(pl.len().alias("n"), pl.col("dur").sum()).sort(
        ["dur", "name"], descending=[True, False]).head(4)
    return counts["name"].to_list()


def check(ctx: Context) -> list[dict[str, Any]]:
    if not ctx.trace.has_step_markers:
        raise Skip("no steps (no ProfilerStep markers and no recurring iteration to infer them from): gaps "
                   "between the phases of a whole trace are not a step's idle time")
    if not ctx.gpu.height:
        return []
    replayed = ctx.trace.replay
    if replayed.reason:
        raise Skip(f"the step cannot be estimated without the profiler's own cost ({replayed.reason})")
    per_window, gaps = _idle(ctx, _windows(ctx))
    # How sure the estimate is, from the calibration's spread for traces recorded like this one; a measured step
    # leaves no doubt about the profiler's cost (the replay is fitted to it), and has no spread.
    spread = ctx.trace.estimate_spread
    findings = []
    # Medians of the steady steps (Replay.per_device): the condition holds in most of them, so two captures of one
    # program agree; the same step as summary's and AT302's.
    for pace in replayed.per_device().iter_rows(named=True):
        device = pace["device"]
        # A measured step the replay could not be fitted to is the step judged (model/measured.py).
        pace["est_step_us"], pace["est_idle_us"] = measured_pace(ctx.trace.calibration, device, pace["est_step_us"],
                                                                 pace["est_idle_us"], pace["gpu_busy_us"])
        steps = replayed.steady.filter(pl.col("device") == device)
        recorded = per_window.filter((pl.col("device") == device)
                                     & pl.col("step").is_in(steps["step"].to_list()))
        est_idle, est_step = pace["est_idle_us"], pace["est_step_us"]
        rec_idle = float(recorded["idle"].median()) if recorded.height else 0.0
        rec_span = float(recorded["span"].median()) if recorded.height else 0.0
        low, high = _idle_share_range(est_idle, est_step, pace["profiler_cpu_us"], spread)
        threshold = ctx.params["min_idle_share"]
        # A warning whose range's lower end is under the threshold is info, and says so; an idle under it at the
        # estimate is the profiler's (info, with its range).
        if low < threshold and _idle_enough(ctx, est_idle, est_step):
            findings.append(_finding(ctx, pace, steps, recorded, gaps, profiler_only=False, share_range=(low, high)))
        elif _idle_enough(ctx, est_idle, est_step):
            findings.append(_finding(ctx, pace, steps, recorded, gaps, profiler_only=False))
        elif _idle_enough(ctx, rec_idle, rec_span) and est_idle < threshold * est_step:
            findings.append(_finding(ctx, pace, steps, recorded, gaps, profiler_only=True))
    return findings


def _idle_share_range(est_idle: float, est_step: float, profiler_us: float,
                      spread: Spread | None) -> tuple[float, float]:
    """The idle share of the step without the profiler if the profiler's real cost was what the calibration's spread
    allows (model/measured.py: more cost leaves a shorter step, never shorter than its GPU work, less cost a longer
    one); the estimate's own share at both ends where the step was measured."""
    if not est_step:
        return 0.0, 0.0
    busy = est_step - est_idle
    if spread is None:
        return est_idle / est_step, est_idle / est_step
    shortest, longest = spread.step_range(est_step, profiler_us, busy)
    return (shortest - busy) / shortest if shortest else 0.0, (longest - busy) / longest


# Measured on six compiled models on an H200 (docs/profiler_cost.md, "Compiled models no cost has seen"): under
# with_stack the profiler's cost was 1.6x to 4x the program itself (it grows with the square of Inductor's wrapper
# length), so an error of a tenth in it moves the estimated step by up to 40%.
COMPILED_WITH_STACK = ("; compiled code recorded with with_stack is the least certain estimate (the profiler cost "
                       "several times the step there): capture without with_stack to confirm")
UNDETERMINED_FIX = ("Capture this program again with `attntrace.profile(...)` (torch.profiler.profile's arguments, and "
                    "a schedule with wait >= 1): it times the step without the profiler and keeps it in the trace, "
                    "which lint then judges; or capture it without with_stack (record_shapes alone costs a fraction "
                    "of it), whose estimate is closer.")


def share_range_of(ctx: Context, pace: dict[str, Any], high: bool = False) -> float:
    """One end of the idle share's range for a device's pace (Replay.per_device's row), from the estimate's spread."""
    found = _idle_share_range(pace["est_idle_us"], pace["est_step_us"], pace["profiler_cpu_us"],
                              ctx.trace.estimate_spread)
    return found[1] if high else found[0]


def _compiled_with_stack(ctx: Context) -> bool:
    return bool(ctx.trace.replay.settings.get("with_stack")) and bool(
        ctx.trace.ops.height and ctx.trace.ops["name"].str.starts_with(INDUCTOR_KERNEL_OP).any())


def _idle_enough(ctx: Context, idle_us: float, step_us: float) -> bool:
    return step_us > 0 and idle_us >= ctx.params["min_idle_share"] * step_us and idle_us >= ctx.params["min_idle_us"]


def _settings_text(settings: dict[str, Any]) -> str:
    on = [name for name in ("record_shapes", "with_stack", "profile_memory") if settings.get(name)]
    return " and ".join(on) if on else "recording"


def _inside_markers(ctx: Context, device: int, gaps: pl.DataFrame) -> pl.DataFrame:
    """The gaps cut to the device's process's ProfilerStep markers. The time between two markers is the profiler's
    own `prof.step()` (the loop's next batch is inside the next marker): it counts in the step's idle as recorded,
    but naming it in the largest gaps points the user at nothing of theirs. (Between two steps inferred from a
    recurring annotation runs the program's own loop: those gaps stay whole.)"""
    pid = ctx.trace.device_process.get(device)
    markers = ctx.trace.steps.filter(~pl.col("capture") & (pl.col("pid").cast(pl.String) == str(pid)))
    if ctx.trace.step_info.source != "markers" or not markers.height:
        return gaps
    return (gaps.join_where(markers.select(pl.col("ts").alias("m_ts"), pl.col("end").alias("m_end")),
                            pl.col("start") < pl.col("m_end"), pl.col("end") > pl.col("m_ts"))
            .with_columns(pl.max_horizontal("start", "m_ts").alias("start"), pl.min_horizontal("end", "m_end")
                          .alias("end"))
            .with_columns((pl.col("end") - pl.col("start")).alias("us")).select(gaps.columns))


def _finding(ctx: Context, pace: dict[str, Any], steps: pl.DataFrame, recorded: pl.DataFrame, gaps: pl.DataFrame,
             profiler_only: bool, share_range: tuple[float, float] | None = None) -> dict[str, Any]:
    """AT402's finding for one device (pace: its Replay.per_device row; steps: its steady steps): the idle the
    replay leaves (a warning when it is large), the profiler's own (info, profiler_only), or, with `share_range`,
    an idle share the trace cannot tell from the threshold (info, undetermined: compiled code under with_stack,
    whose profiler cost dwarfs the step)."""
    device = pace["device"]
    est_step, est_idle, profiler_us = pace["est_step_us"], pace["est_idle_us"], pace["profiler_cpu_us"]
    rec_idle = float(recorded["idle"].median()) if recorded.height else 0.0
    rec_span = float(recorded["span"].median()) if recorded.height else 0.0
    # The gaps of the steps judged: a slow first step left out of the medians is left out here too (its 543 us
    # gap was quoted as the largest of steps whose windows were 396 us).
    judged = gaps.filter((pl.col("device") == device) & pl.col("step").is_in(steps["step"].implode()))
    top = (_inside_markers(ctx, device, judged)
           .sort(["us", "start", *KEYS], descending=[True, False, False, False]).head(TOP_GAPS))
    largest = []
    for s, e, us in top.select("start", "end", "us").iter_rows():
        ops = _cpu_ops_during(ctx, s, e)
        collective = next((op for op in ops if BLOCKING_COLLECTIVE.search(op)), None)
        largest.append({"idle_us": us, "cpu_ops": ops, "blocking_collective": collective})
    first = largest[0] if largest else {"idle_us": 0.0, "cpu_ops": [], "blocking_collective": None}
    if first["blocking_collective"]:
        waits = f"waits in a blocking collective ({first['blocking_collective']}): another rank is late"
    else:
        waits = f"waits on {', '.join(first['cpu_ops'][:3]) or 'no CPU op (the CPU was outside the profiled ops)'}"
    settings = ctx.trace.replay.settings
    path: dict[str, Any] | None = None
    wall_us: float | None = None
    whatif: str | None = None
    measured = ctx.trace.step_basis == "measured"
    # Where nothing was measured, how sure the estimate is: the idle share if the profiler's real cost was within the
    # calibration's spread for traces recorded like this one.
    likely = (f"; likely {100 * share_range_of(ctx, pace):.0f}% to {100 * share_range_of(ctx, pace, high=True):.0f}%"
              if ctx.trace.estimate_spread is not None else "")
    # How the step without the profiler is known, in every message that gives one.
    fitted = measured and ctx.trace.calibration is not None and ctx.trace.calibration.reached
    basis = "measured step, idle replayed to it" if fitted else "measured step" if measured else "estimated"
    est_share = est_idle / est_step if est_step else 0.0
    rec_share = rec_idle / rec_span if rec_span else 0.0
    # The events of the process that drives this device (a merged trace of two ranks quoted their mean).
    events = ctx.trace.replay.events_by_device.get(device, {})
    cost = (f"{_settings_text(settings)} cost ~{fmt_ms(profiler_us)} of CPU per step "
            f"({events.get('cpu_ops', 0):.0f} ops, {events.get('runtime_calls', 0):.0f} runtime calls per step "
            "recorded)")
    if share_range is not None:
        spread = ctx.trace.estimate_spread
        kind = spread.label if spread is not None else ""
        known = (f"on calibration captures recorded like this one ({kind}) the profiler's real cost was "
                 f"{spread.cost_ratio_low:.2f}x to {spread.cost_ratio_high:.2f}x the estimate's"
                 if spread is not None else "")
        message = (f"cannot tell how idle the GPU is without the profiler: ~{100 * share_range[0]:.0f}% to "
                   f"~{100 * share_range[1]:.0f}% of the step (estimated ~{100 * est_share:.0f}%: {fmt_ms(est_idle)} "
                   f"of {fmt_ms(est_step)}), {100 * rec_share:.0f}% as recorded ({fmt_ms(rec_idle)} of "
                   f"{fmt_ms(rec_span)}): {cost}, {profiler_us / est_step if est_step else 0.0:.1f}x the step, "
                   f"and {known}; the range's lower end is under the {100 * ctx.params['min_idle_share']:.0f}% this "
                   "rule warns at, so this is info, not a warning")
        fix = UNDETERMINED_FIX
    elif profiler_only:
        threshold = ctx.params["min_idle_share"]
        # 29.6% is not "30%, under the 30%".
        left = f"{100 * est_share:.0f}" if round(100 * est_share) < round(100 * threshold) else f"{100 * est_share:.1f}"
        message = (f"the GPU looks idle {100 * rec_share:.0f}% of the step as recorded ({fmt_ms(rec_idle)} of "
                   f"{fmt_ms(rec_span)}), ~{left}% without the profiler ({basis}: "
                   f"{fmt_ms(est_idle)} of {fmt_ms(est_step)}{likely}), under the {100 * threshold:.0f}% this rule "
                   f"warns at: {cost}. The profiler's own cost is what lifts the recorded idle over that line")
        fix = (f"Nothing to fix: the step was timed without the profiler in the capturing run, and in it the "
               f"GPU is idle ~{left}%, under the threshold." if measured else
               f"Time the step without the profiler to confirm (capture with `attntrace.profile`, which does): the "
               f"estimate leaves ~{left}% idle, "
               "under the threshold, in the gaps named in the evidence. To see the program's own idle in a trace, "
               "record with fewer settings (record_shapes and with_stack cost the most); lint with your "
               "machine's costs (`attntrace run --calibrate-profiler`).")
    else:
        path = waits_on(ctx, device, steps)
        message = (f"the GPU is idle ~{100 * est_share:.0f}% of the step without the profiler ({basis}: "
                   f"{fmt_ms(est_idle)} of {fmt_ms(est_step)}{likely}), {100 * rec_share:.0f}% as recorded "
                   f"({fmt_ms(rec_idle)} of {fmt_ms(rec_span)}): {cost}; "
                   + (f"the step's critical path waits on {path['text']}" if path and not first["blocking_collective"]
                      else f"the largest recorded gap ({fmt_ms(first['idle_us'])}) {waits}"))
        fix = (COLLECTIVE_FIX if first["blocking_collective"] else
               PATH_FIXES.get(path["cause"], ctx.rule.docs["fix"]) if path else ctx.rule.docs["fix"])
        if path and path["change"] is not None:
            wall_us, whatif = ctx.wall_saving(path["change"], [device]), describe(path["change"])
            if wall_us is not None:
                message += f"; with {whatif}, the step would take ~{fmt_ms(wall_us)} less (wall time, replayed)"
    # The costs the replay used: a config's (run --calibrate-profiler) or the defaults.
    refused = ctx.trace.shared.get("profiler_costs_refused")
    costs_file = ("the config's [tool.attntrace.profiler_cost]" if ctx.trace.profiler_costs_from == "config"
                  else "attntrace/profiler_cost.toml" + (f"; the config's were {refused}" if refused else ""))
    calibration = ctx.trace.calibration
    if calibration is not None and calibration.reached:
        costs_file += (f", scaled x{calibration.scale:.2f} so that the replayed step matches the "
                       f"{fmt_ms(calibration.measured_us)} measured without the profiler")
    elif calibration is not None:
        costs_file += (f"; no scale brings the replay to the {fmt_ms(calibration.measured_us)} measured without the "
                       f"profiler (it came to {fmt_ms(calibration.calibrated_us)}): the measured step is judged, "
                       "what it holds beyond the GPU's work as idle")
    return ctx.finding(
        key=f"gpu-idle|{device}",
        # The device index is where a rank's GPU sits in its host (rank 1 on cuda:1): not part of what the finding
        # is, unless this one process drives several devices. (The fingerprint keeps it, so baselines still match.)
        identity_key=f"gpu-idle|{device}" if len(ctx.trace.devices) > 1 else "gpu-idle",
        device=device,
        severity="info" if profiler_only or share_range is not None else None,
        message=message,
        where={"op_chain": None, "kernel": None, "steps": sorted(int(s) for s in steps["step"].to_list())},
        evidence={"est_idle_us_per_step": est_idle, "est_step_us": est_step, "est_idle_share": est_share,
                  "critical_path": path["parts"] if path else None,
                  "recorded_idle_us_per_step": rec_idle, "recorded_window_us_per_step": rec_span,
                  "recorded_idle_share": rec_share, "profiler_cpu_us_per_step": profiler_us,
                  "profiler_settings": settings, "largest_recorded_gaps": largest,
                  "profiler_only": profiler_only, "undetermined": share_range is not None,
                  "step_basis": ctx.trace.step_basis,
                  "measured_step_us": calibration.measured_us if calibration is not None else None,
                  "est_idle_share_range": list(share_range) if share_range is not None else
                  [share_range_of(ctx, pace), share_range_of(ctx, pace, high=True)]
                  if ctx.trace.estimate_spread is not None else None},
        # Under the threshold without the profiler, the idle it leaves is in the message and the evidence, not a
        # saving in the headline; one the trace cannot tell keeps its central estimate, beside the range in the
        # message, as info. Neither counts in the trace's total (report.promises_nothing).
        gpu_us_per_step=0.0 if profiler_only else est_idle,
        saving=IDLE_REMOVED,
        assumption=(f"{'replayed' if measured else 'estimated'} without the profiler's cost ({costs_file}); the idle "
                    "goes if the CPU keeps the GPU fed"
                    + (COMPILED_WITH_STACK if _compiled_with_stack(ctx) and share_range is None else "")),
        step_us=est_step,
        fix=fix,
        # Where the idle is the profiler's own, a framework's switch would fix nothing either.
        framework_fix=not profiler_only and share_range is None,
        wall_us_per_step=wall_us,
        whatif=whatif,
    )


# What the step waits on, by the CPU-side category that holds most of its critical path, and the change that
# takes it off (None: no replayable change; Python's own time is the program's to restructure).
PATH_CAUSES: dict[str, tuple[str, Change | None]] = {
    "cpu: host waits": ("syncs", Change(drop_syncs=None, pin_copies=None)),
    "copies": ("copies", Change(drop_syncs=None, pin_copies=None)),
    "cpu: launches": ("launch-bound CPU", Change(graph=True)),
    "cpu: framework ops": ("launch-bound CPU", Change(graph=True)),
    "launch latency": ("launch-bound CPU", Change(graph=True)),
    "cpu: optimizer": ("the optimizer", Change(graph=True)),
    "cpu: data loading": ("the data loader", None),
    "cpu: python": ("Python", None),
}
PATH_FIXES = {
    "syncs": "Remove the host syncs on the path (AT302 names each): keep values on the GPU, pin host memory and "
             "copy with `non_blocking=True`.",
    "copies": "Pin the host memory (`.pin_memory()`, `DataLoader(pin_memory=True)`) and copy with "
              "`.to(device, non_blocking=True)`, or build the tensor on the device.",
    "launch-bound CPU": "The CPU cannot launch kernels as fast as the GPU runs them: capture the step in a CUDA graph "
                        "(`torch.compile(mode=\"reduce-overhead\")`, `torch.cuda.graphs`), fuse small ops "
                        "(`torch.compile`), or give the GPU more work per launch (a larger batch).",
    "the optimizer": "Use the fused optimizer (`fused=True` for Adam/AdamW/SGD) or `foreach=True`, or capture it in "
                     "the step's CUDA graph.",
    "the data loader": "Move data loading off the main thread: `DataLoader(num_workers=N, pin_memory=True, "
                       "persistent_workers=True)`, and copy with `non_blocking=True`.",
    "Python": "The step's own Python holds the GPU back: move per-step Python work out of the loop, or compile the "
              "step (`torch.compile`) so it runs without the interpreter.",
}


def waits_on(ctx: Context, device: int, steps: pl.DataFrame) -> dict[str, Any] | None:
    """The steady steps' critical path on `device` (model/critical_path.py): what it spends its time on, the
    CPU-side cause that holds most of it, and that cause's replayable change."""
    paths = [p for p in ctx.trace.critical_path.paths
             if p["device"] == device and p["step"] in set(steps["step"].to_list())]
    if not paths:
        return None
    summary = summarize(paths)[0]
    parts = summary["parts"]
    host = [p for p in parts if p["on"] in PATH_CAUSES]
    if not host:
        return None
    # Categories that share a cause add up (launches and the framework ops that make them).
    by_cause: dict[str, float] = {}
    for p in host:
        by_cause[PATH_CAUSES[p["on"]][0]] = by_cause.get(PATH_CAUSES[p["on"]][0], 0.0) + p["share"]
    cause = max(sorted(by_cause), key=lambda c: by_cause[c])
    change = next(change for on, (name, change) in PATH_CAUSES.items() if name == cause)
    if cause == "the data loader":
        change = Change(cpu_removed=loader_waits(ctx.trace))
    shares = ", ".join(f"{p['on']} {100 * p['share']:.0f}%" for p in parts[:5])
    return {"cause": cause, "change": change, "parts": parts,
            "text": f"{cause} ({100 * by_cause[cause]:.0f}% of it; {shares})"}
