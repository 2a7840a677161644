"""`attntrace diff BASE NEW`: per-step time, kernel counts by class, copies, launches and findings of two
traces (or two directories of traces matched by name). A step-time change is judged on steady steps: their
medians, and a one-sided Welch test on log step times for the confidence that the new steps are slower
(stats.py), so that warm-up and step-to-step noise are not called a regression and a real one is. Findings
are matched by the identity the baseline uses (model/identity.py): a pair's two traces get one name.
The step compared is the program's, without the profiler (measured in the capturing run where the trace carries it,
else the replay's estimate): about 32 ms of profiler cost per step hid a training step going from 33 to 82.5 ms."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import polars as pl

from attntrace.checks.config import Settings
from attntrace.model import stats, untimed_host
from attntrace.model.identity import fold_name, trace_label
from attntrace.model.loading import InputError, display_path, guarded, load
from attntrace.model.replay import RECORDED_STEP
from attntrace.read import ReadOptions, discover
from attntrace.report.engine import TraceReport, lint_trace

CONFIDENCE = 0.95  # a change is called real at this confidence from the one-sided test
# The test's least: a spread of steady steps on each side (one step has no spread: its variance would be the floor
# the test assumes, and a whole-trace window against real steps read as a certain +257%).
MIN_STEADY_STEPS = 2

METRICS = ("step_us", "gpu_busy_us", "cpu_us", "kernels", "memcpy", "memset", "launches", "launch_cpu_us")


def pairs(base: str, new: str) -> tuple[list[tuple[str | None, str | None]], list[str]]:
    """(base, new) paths: the two files, or the traces of two directories matched by name; and what could not be
    searched (a directory with no trace files: a diff of it would pass any gate without comparing anything)."""
    if not (Path(base).is_dir() and Path(new).is_dir()):
        return [(base, new)], []
    problems: list[str] = []
    ambiguous: set[str] = set()

    def by_label(root: str) -> dict[str, str]:
        found = []
        for item in discover([root]):
            if isinstance(item, tuple):
                found.append(item[0])
            else:
                problems.append(f"{display_path(root)}: {item}")
        named: dict[str, list[str]] = {}
        for path in found:
            relative = Path(path).relative_to(root)
            named.setdefault(str(relative.parent / fold_name(relative.name)), []).append(path)
        # Two files of one name (x.pt.trace.json beside x.pt.trace.json.gz): pairing either would be a guess, and
        # the verdict depended on which (a REGRESSION from one, none from the other).
        for label, paths in named.items():
            if len(paths) > 1:
                problems.append(f"{display_path(root)}: {len(paths)} traces have one name ({label}: "
                                f"{', '.join(map(display_path, paths))}); rename all but one to compare them")
                ambiguous.add(label)
        return {label: paths[0] for label, paths in named.items()}

    left, right = by_label(base), by_label(new)
    labels = sorted((set(left) | set(right)) - ambiguous)  # the other side's trace of that name is not compared
    return [(left.get(k), right.get(k)) for k in labels], problems


def _classes(trace: Any, steps: int) -> dict[str, float]:
    gpu = trace.gpu_linked.filter(pl.col("step").is_not_null())
    counts = gpu.group_by("cls").len().sort("cls")
    return {cls: n / max(steps, 1) for cls, n in counts.iter_rows()}


def _analyse(path: str, label: str, options: ReadOptions | None, settings: Settings | None
             ) -> tuple[Any, TraceReport]:
    trace = load(path, options)
    trace.label = label  # both traces of a pair by one name: their findings' fingerprints then compare
    return trace, lint_trace(trace, settings)


def _gpu_names(trace: Any) -> list[str]:
    return sorted({name for device in trace.devices if (name := trace.device_name(device))})


def _per_step(trace: Any, column: str) -> list[float]:
    """One value per steady-state step: the largest over the step's devices (the step lasts as its slowest)."""
    table = trace.step_table.filter(~pl.col("capture"))
    return [float(v) for v in table.group_by("step").agg(pl.col(column).max()).sort("step")[column].to_list()]


def _steady_count(trace: Any, steps: list[float]) -> int:
    """The steps at the trace's steady pace (stats.STEADY_RATIO x its shortest); none when the trace marks no
    steps and none could be inferred (its one window is the whole trace, not a step)."""
    positive = [s for s in steps if s > 0]
    if trace.step_info.source == "trace" or not positive:
        return 0
    return sum(s <= stats.STEADY_RATIO * min(positive) for s in positive)


def _too_few_steps(counts: dict[str, int], traces: dict[str, Any], steps: dict[str, list[float]]) -> str | None:
    """Why the step times cannot be compared, and what would let them be; None when they can."""
    short = [side for side in ("base", "new") if counts[side] < MIN_STEADY_STEPS]
    if not short:
        return None
    said = []
    # Steps that hold no time (all 0 us): more steps would not help, the trace's times are missing.
    untimed = [side for side in short if steps[side] and not any(s > 0 for s in steps[side])]
    for side in short:
        if traces[side].step_info.source == "trace":
            said.append(f"the {side} trace marks no steps (its one window is the whole trace)")
        elif side in untimed:
            said.append(f"the {side} trace's {len(steps[side])} step(s) last 0 us")
        else:
            said.append(f"the {side} trace has {counts[side]} steady step{'s' if counts[side] != 1 else ''}")
    unmarked = any(traces[side].step_info.source == "trace" for side in short)
    if untimed and len(untimed) == len(short):
        fix = "capture it again: its events carry no durations"
    else:
        fix = ("call prof.step() once per iteration so that steps are marked, and " if unmarked else "") + \
            ("capture at least 3 steps (torch.profiler.schedule(active=3) or more: the first often runs slow)")
    return (f"not compared: {' and '.join(said)}, and the test needs {MIN_STEADY_STEPS} steady steps on each side; "
            f"to compare, {fix}")


def _different_bases(base: str, new: str) -> str | None:
    """Why steps known on different bases get no verdict: one side without the profiler (estimated or measured),
    the other only as recorded with it (a CPU-only trace, or steps the replay could not run). A GPU trace against
    the same program's CPU-only one was called a REGRESSION of +83%: its estimate against the other's recording."""
    if base == new or "recorded" not in (base, new):
        return None
    known, recorded = ("base", "new") if new == "recorded" else ("new", "base")
    return (f"not compared: the {known} trace's steps are {base if known == 'base' else new} without the profiler, "
            f"the {recorded} trace's only as recorded with it (a CPU-only trace, or steps that could not be "
            "replayed); to compare, capture both the same way (both with CUDA activities, or both measured with "
            "attntrace.profile)")


def _untimed_cpu(traces: dict[str, Any]) -> str | None:
    """Why a side whose CPU ops or runtime calls all last 0 us gets no verdict: the step without the profiler is
    replayed from them. Runtime calls of 0 us made one program's trace +7.8% slower than itself, a REGRESSION."""
    for side, trace in traces.items():
        lost = untimed_host(trace.ops, trace.launches)
        if lost:
            return f"not compared: the {side} trace's {lost}; to compare, capture it again"
    return None


def _untimed_gpu(traces: dict[str, Any]) -> str | None:
    """Why a side whose GPU events all lack a duration (absurd or negative ones are read as 0) gets no verdict: its
    steps hold no GPU work to compare. A trace whose kernels all lasted 1e15 us was a REGRESSION of +620% against
    the same trace intact: 142 us of CPU against 1,026 us with the GPU's work."""
    for side, trace in traces.items():
        if trace.has_gpu and not trace.gpu["dur"].fill_null(0.0).sum() > 0:
            return (f"not compared: the {side} trace's {trace.gpu.height} GPU event(s) have no duration (read as 0: "
                    "its notes say why), so its steps hold no GPU work; to compare, capture it again")
    return None


# A step is compared by what its markers and its GPU work hold (step_table's step_us). Where the time from one step's
# start to the next is this many times longer, most of each iteration is in no step (a loop that marks part of its
# body, or a trace whose kernels lost their durations), and what the steps hold says nothing of the program's pace.
UNMARKED_RATIO = 2.0


def _steps_outside_markers(traces: dict[str, Any]) -> str | None:
    """Why a side whose steps spend most of their time outside the step markers and the GPU's work gets no verdict.
    A trace whose kernels all lasted 0 us (the step's 6.4 ms between markers still there) was a REGRESSION of
    +4377% against the same trace intact: 142.5 us held by the markers against 6,382 us of GPU work."""
    for side, trace in traces.items():
        estimate = trace.estimate
        if estimate.reason or not estimate.table.height:
            continue
        held = _per_step(trace, "step_us")
        spans = (estimate.table.group_by("step").agg(RECORDED_STEP.max().alias("span_us"))["span_us"]
                 .drop_nulls().to_list())
        if not held or not spans:
            continue
        held_us, span_us = statistics.median(held), statistics.median(spans)
        if span_us > UNMARKED_RATIO * held_us:
            return (f"not compared: the {side} trace's steps are {span_us:.1f} us from one start to the next, but "
                    f"its step markers and GPU work hold {held_us:.1f} us of that (medians): the rest is in no step "
                    "(a loop that marks part of its body, or GPU events without their durations); to compare, mark "
                    "each whole iteration as the step (prof.step() once per iteration)")
    return None


def _incomplete(traces: dict[str, Any]) -> str | None:
    """Why a pair with a cut-off side (read with --salvage) gets no verdict: its last steps are missing, and the
    steps it has may be cut short (a `diff full cut --salvage` said AT101 was fixed)."""
    cut = [side for side in ("base", "new") if traces[side].meta.incomplete]
    if not cut:
        return None
    return (f"not compared: the {' and the '.join(cut)} trace{'s are' if len(cut) > 1 else ' is'} incomplete (cut "
            "off, read with --salvage): its last steps and their findings are missing; to compare, capture it again "
            "and let the profiler finish writing")


def _different_profilers(base: Any, new: Any) -> str | None:
    """Why traces of different tools get no verdict: each tool costs the program differently (nsys's own overhead
    is not torch.profiler's), and an Nsight Systems export holds no Python or op details."""
    tools = {"base": base.meta.profiler, "new": new.meta.profiler}
    if tools["base"] == tools["new"]:
        return None
    return (f"not compared: the traces come from different profilers ({tools['base']} -> {tools['new']}), whose own "
            "costs differ; to compare, capture both with the same one")


def _different_gpus(base: Any, new: Any) -> str | None:
    """Why steps on different GPUs get no verdict: the change is the hardware's as much as the code's (a trace
    relabelled from an H200 to an A100 was a REGRESSION, exit 1, under --fail-over). GPUs that name no model are not
    told apart."""
    names = {"base": _gpu_names(base), "new": _gpu_names(new)}
    counts = {"base": len(base.devices), "new": len(new.devices)}
    if names["base"] and names["new"] and names["base"] != names["new"]:
        what = f"the GPUs differ ({', '.join(names['base'])} -> {', '.join(names['new'])})"
    elif counts["base"] and counts["new"] and counts["base"] != counts["new"]:
        what = f"the number of GPUs differs ({counts['base']} -> {counts['new']})"
    else:
        return None
    return f"not compared: {what}; to judge the code, capture both on the same GPUs"


def unprofiled_steps(trace: Any) -> tuple[list[float], str]:
    """The program's steps without the profiler, and how they are known: "measured" in the capturing run where the
    trace carries them (attntrace.profile), else "estimated" by the replay (each step, its slowest device), else
    "recorded" (no replay: a CPU-only trace, no steps)."""
    measured = trace.meta.measured
    if measured is not None and measured.unprofiled_us:
        return list(measured.unprofiled_us), "measured"
    estimate = trace.estimate
    if not estimate.reason and estimate.table.height:
        # Each step's estimate, no longer than the step as recorded: taking the profiler's cost away never lengthens
        # a step, and a chained window that holds the step before's tail read a re-capture of one program as +16%.
        recorded = (trace.step_table.filter(~pl.col("capture")).group_by("step")
                    .agg(pl.col("step_us").max().alias("recorded_us")))
        per_step = (estimate.working.group_by("step").agg(pl.col("est_step_us").max())
                    .join(recorded, on="step", how="left").sort("step")
                    .select(pl.min_horizontal("est_step_us", pl.col("recorded_us").fill_null(float("inf")))))
        return [float(v) for v in per_step["est_step_us"].to_list()], "estimated"
    return _per_step(trace, "step_us"), "recorded"


def _host_or_program(metrics: dict[str, Any]) -> str | None:
    """Why the step changed, where the traces can say: the GPU's work, the CPU's work (more ops or launches per
    step), or only the speed of the host (the same CPU work, each runtime call slower by about as much)."""
    gpu = metrics["gpu_busy_us"]["change_pct"] or 0.0
    launches = metrics["launches"]
    same_work = all(abs(metrics[m]["new"] - metrics[m]["base"]) <= 0.01 * max(metrics[m]["base"], 1.0)
                    for m in ("kernels", "launches"))
    if abs(gpu) >= 5.0:
        return f"the GPU's work changed ({gpu:+.0f}% busy per step)"
    if not same_work:
        return (f"the CPU's work changed ({metrics['launches']['base']:g} -> {metrics['launches']['new']:g} "
                f"launches, {metrics['kernels']['base']:g} -> {metrics['kernels']['new']:g} kernels per step)")
    if launches["base"] and launches["new"] and metrics["launch_cpu_us"]["base"]:
        per_launch = (metrics["launch_cpu_us"]["new"] / launches["new"]) / (
            metrics["launch_cpu_us"]["base"] / launches["base"])
        if per_launch >= 1.3:
            return (f"the same GPU and CPU work, each launch call {per_launch:.1f}x slower: the host ran slower "
                    "(another machine, CPU frequency, load, or the profiler's settings), not the program's work")
    return None


def compare_pair(base: str, new: str, fail_over: float | None, label: str | None = None,
                 options: ReadOptions | None = None, settings: Settings | None = None) -> dict[str, Any]:
    """One pair compared; settings: lint's (the config's profiler costs make the step without the profiler that
    lint and summary report, and its rules the findings)."""
    # The pair by one name: the new trace's, as a baseline of it would have.
    name = label or trace_label(display_path(new))
    results = [guarded(p, lambda path: _analyse(path, name, options, settings)) for p in (base, new)]
    errors = [r for r in results if isinstance(r, InputError)]
    if errors:
        return {"base": base, "new": new, "errors": [f"{e.path}: {e.message}" for e in errors],
                "not_traces": all(e.kind == "not-a-trace" for e in errors)}
    (bt, br), (nt, nr) = results  # type: ignore[misc]
    bs, ns = bt.step_table, nt.step_table
    metrics = {}
    for m in METRICS:
        b, n = bs[m], ns[m]
        b_mean, n_mean = float(b.mean() or 0.0), float(n.mean() or 0.0)
        metrics[m] = {
            "base": b_mean, "new": n_mean,
            "base_range": [float(b.min() or 0.0), float(b.max() or 0.0)],
            "new_range": [float(n.min() or 0.0), float(n.max() or 0.0)],
            "change_pct": 100.0 * (n_mean - b_mean) / b_mean if b_mean else None,
        }
    # The programs are compared, not the profiles: the step without the profiler (measured, else estimated), whose
    # change the profiler's own cost cannot hide; the step as recorded beside it.
    (base_steps, base_basis), (new_steps, new_basis) = unprofiled_steps(bt), unprofiled_steps(nt)
    change = stats.compare(base_steps, new_steps)
    base_recorded, new_recorded = _per_step(bt, "step_us"), _per_step(nt, "step_us")
    recorded = stats.compare(base_recorded, new_recorded)
    busy = stats.compare(_per_step(bt, "gpu_busy_us"), _per_step(nt, "gpu_busy_us"))
    metrics["gpu_busy_us"]["change_pct"] = busy.change_pct
    # Too few steady steps on a side: the figures are shown, with no verdict and no gate (not_compared says why).
    not_compared = _incomplete({"base": bt, "new": nt}) or _different_profilers(bt, nt) or _too_few_steps(
        {"base": _steady_count(bt, base_steps), "new": _steady_count(nt, new_steps)}, {"base": bt, "new": nt},
        {"base": base_steps, "new": new_steps}) \
        or _different_bases(base_basis, new_basis) or _untimed_gpu({"base": bt, "new": nt}) \
        or _untimed_cpu({"base": bt, "new": nt}) \
        or _steps_outside_markers({"base": bt, "new": nt}) or _different_gpus(bt, nt)
    step = {**_step_change(change), "basis": {"base": base_basis, "new": new_basis},
            "recorded": _step_change(recorded), "not_compared": not_compared}
    if not_compared:
        step["confidence_slower"] = None
    outside_noise = not not_compared and (change.confidence >= CONFIDENCE or change.confidence <= 1 - CONFIDENCE)
    regression = bool(fail_over is not None and not not_compared and change.confidence >= CONFIDENCE
                      and change.change_pct is not None and change.change_pct > fail_over)
    # Every finding, consequences too, by fingerprint: what a baseline of the base trace holds.
    before = {f["fingerprint"]: f for f in br.findings}
    after = {f["fingerprint"]: f for f in nr.findings}
    changed = []
    # A cut-off side's impacts are of part of the run: a change between them is the cut's (AT102 1959.7 -> 251.3).
    cut = bt.meta.incomplete or nt.meta.incomplete
    for key in sorted(set(before) & set(after)) if not cut else ():
        b_us, n_us = before[key]["impact"]["gpu_us_per_step"], after[key]["impact"]["gpu_us_per_step"]
        if abs(n_us - b_us) > 0.1 * max(b_us, 1.0):
            changed.append({"rule": after[key]["rule"], "message": after[key]["message"],
                            "base_gpu_us_per_step": b_us, "new_gpu_us_per_step": n_us})
    # A rule the new trace could not be judged by (a CPU-only trace has no GPU events) fixed nothing: its findings
    # are not judged, not fixed.
    skipped_new = {entry["rule"]: entry["reason"] for entry in nr.skipped}
    if nt.meta.incomplete:  # a finding of the missing part is not fixed: every rule is judged on part of the run
        skipped_new.update(dict.fromkeys((f["rule"] for f in br.findings),
                                         "the new trace is incomplete (cut off): its last steps are missing"))
    gone = [before[k] for k in sorted(set(before) - set(after))]
    appeared = [after[k] for k in sorted(set(after) - set(before))]
    # A cut-off base may have held a finding of the new trace in its missing steps: not known to be new.
    unknown_in_base = "the base trace is incomplete (cut off): its last steps are missing" if bt.meta.incomplete \
        else None
    return {
        "base": base, "new": new, "errors": [],
        "steps": {"base": bs.height, "new": ns.height},
        "metrics": metrics,
        "step": step,
        "why": _host_or_program(metrics) if outside_noise else None,
        # A change of GPU is part of any change seen: said beside the figures, so it is never taken for the code's.
        "devices": {"base": _gpu_names(bt), "new": _gpu_names(nt)},
        "kernel_classes": {"base": _classes(bt, bs.height), "new": _classes(nt, ns.height)},
        "roofline": {"base": _roofline_brief(br), "new": _roofline_brief(nr)},
        "findings": {
            "new": [_brief(f) for f in appeared] if unknown_in_base is None else [],
            "fixed": [_brief(f) for f in gone if f["rule"] not in skipped_new],
            "changed": changed,
            "not_judged": [{**_brief(f), "reason": skipped_new[f["rule"]], "side": "new"} for f in gone
                           if f["rule"] in skipped_new]
            + ([{**_brief(f), "reason": unknown_in_base, "side": "base"} for f in appeared] if unknown_in_base
               else []),
        },
        "outside_noise": outside_noise,
        "regression": regression,
        "incomplete": {"base": bt.meta.incomplete, "new": nt.meta.incomplete},
        "profilers": {"base": bt.meta.profiler, "new": nt.meta.profiler},
    }


def _roofline_brief(report: TraceReport) -> dict[str, Any] | None:
    """MFU, coverage and each op class's achieved rate (TFLOP/s for classes with FLOPs, else TB/s)."""
    found = report.info.get("roofline")
    if not found:
        return None
    return {"mfu": found["mfu"], "hfu": found["hfu"], "coverage": found["coverage"],
            "classes": {c["class"]: {"tflops": c.get("tflops"), "tbs": c.get("tbs"),
                                     "share_of_bound": c.get("share_of_bound")} for c in found["classes"]}}


def _roofline_line(base: dict[str, Any] | None, new: dict[str, Any] | None) -> str | None:
    if not base or not new:
        return None

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    rates = []
    for kind in [k for k in base["classes"] if k in new["classes"]]:
        b, n = base["classes"][kind], new["classes"][kind]
        unit = "tflops" if b.get("tflops") or n.get("tflops") else "tbs"
        if b.get(unit) is None and n.get(unit) is None:
            continue
        shown = ["-" if v is None else f"{v:.3g}" for v in (b.get(unit), n.get(unit))]
        rates.append(f"{kind} {shown[0]} -> {shown[1]} {'TFLOP/s' if unit == 'tflops' else 'TB/s'}")
    return (f"  MFU {pct(base['mfu'])} -> {pct(new['mfu'])}, coverage {pct(base['coverage'])} -> "
            f"{pct(new['coverage'])}" + (f"; achieved: {', '.join(rates)}" if rates else ""))


def _step_change(change: stats.Change) -> dict[str, Any]:
    return {"base_median": round(change.base_median, 3), "new_median": round(change.new_median, 3),
            "change_pct": None if change.change_pct is None else round(change.change_pct, 3),
            "confidence_slower": round(change.confidence, 4),
            "steady_steps": {"base": change.base_steps, "new": change.new_steps}}


def _basis_text(basis: dict[str, str]) -> str:
    if basis["base"] == basis["new"]:
        return {"recorded": "as recorded (no step without the profiler)"}.get(basis["base"], basis["base"])
    return f"{basis['base']} -> {basis['new']}"


def _brief(f: dict[str, Any]) -> dict[str, Any]:
    return {"rule": f["rule"], "severity": f["severity"], "message": f["message"],
            "gpu_us_per_step": f["impact"]["gpu_us_per_step"]}


def _one_sided(base: str | None, new: str | None) -> dict[str, Any] | None:
    """A trace found on one side only is still read: a broken one must fail the run as it would in a pair, not
    pass as "only in base". Other JSON there (a run.json) is left out, as it is from the pairs."""
    path = base or new or ""
    checked = guarded(path, load)
    if isinstance(checked, InputError):
        if checked.kind == "not-a-trace":
            return None
        return {"base": base, "new": new, "error": f"{checked.path}: {checked.message}"}
    return {"base": base, "new": new, "error": None}


def compare(base: str, new: str, fail_over: float | None, options: ReadOptions | None = None,
            settings: Settings | None = None) -> dict[str, Any]:
    comparisons, unmatched = [], []
    matched, problems = pairs(base, new)
    for b, n in matched:
        if b is None or n is None:
            entry = _one_sided(b, n)
            if entry is not None:
                unmatched.append(entry)
            continue
        result = compare_pair(b, n, fail_over, trace_label(display_path(n), (display_path(new),)), options,
                              settings)
        if len(matched) > 1 and result.pop("not_traces", False):
            continue  # other JSON beside the traces of a directory (run.json)
        result.pop("not_traces", None)
        comparisons.append(result)
    return {"comparisons": comparisons, "unmatched": unmatched, "search_errors": problems, "fail_over_pct": fail_over,
            "regressions": sum(c.get("regression", False) for c in comparisons),
            "errors": sum(bool(c["errors"]) for c in comparisons) + sum(bool(u["error"]) for u in unmatched)
            + len(problems)}


def render(result: dict[str, Any]) -> str:
    from tabulate import tabulate

    out = []
    for c in result["comparisons"]:
        out.append(f"{c['base']}  ->  {c['new']}")
        if c["errors"]:
            out += [f"  error: {e}" for e in c["errors"]]
            out.append("")
            continue
        rows = []
        for name, m in c["metrics"].items():
            if name == "step_us":  # the step time is the line below: the steady steps' medians, which diff judges
                continue
            pct = "-" if m["change_pct"] is None else f"{m['change_pct']:+.1f}%"
            rows.append([name, f"{m['base']:.1f}", f"{m['new']:.1f}", pct,
                         f"{m['base_range'][0]:.1f}..{m['base_range'][1]:.1f}",
                         f"{m['new_range'][0]:.1f}..{m['new_range'][1]:.1f}"])
        table = tabulate(rows, headers=["per step", "base", "new", "change", "base range", "new range"],
                         tablefmt="simple", disable_numparse=True)
        out.append("  " + table.replace("\n", "\n  "))
        classes = sorted(set(c["kernel_classes"]["base"]) | set(c["kernel_classes"]["new"]))
        moved = [(k, c["kernel_classes"]["base"].get(k, 0.0), c["kernel_classes"]["new"].get(k, 0.0)) for k in classes]
        moved = [m for m in moved if m[1] != m[2]]
        if moved:
            out.append("  kernels per step by class: " + ", ".join(f"{k} {b:g} -> {n:g}" for k, b, n in moved))
        roof = _roofline_line(c["roofline"]["base"], c["roofline"]["new"])
        if roof:
            out.append(roof)
        for label in ("new", "fixed"):
            out += [f"  {label}: {f['rule']} {f['message']}" for f in c["findings"][label]]
        out += [f"  changed: {f['rule']} {f['base_gpu_us_per_step']:.1f} -> {f['new_gpu_us_per_step']:.1f} us/step"
                for f in c["findings"]["changed"]]
        out += [f"  not judged in the {f.get('side', 'new')} trace ({f['reason']}): {f['rule']} {f['message']}"
                for f in c["findings"]["not_judged"]]
        step = c["step"]
        pct = "" if step["change_pct"] is None else f" ({step['change_pct']:+.1f}%)"
        verdict = ("REGRESSION" if c["regression"] else
                   "a real change, under --fail-over" if c["outside_noise"] and result["fail_over_pct"] is not None
                   else "a real change" if c["outside_noise"] else "within noise")
        basis = step.get("basis", {"base": "recorded", "new": "recorded"})
        without = "" if basis["base"] == basis["new"] == "recorded" else " without the profiler"
        head = (f"  step time{without} ({_basis_text(basis)}) {step['base_median']:.1f} -> "
                f"{step['new_median']:.1f} us{pct}, medians of {step['steady_steps']['base']} and "
                f"{step['steady_steps']['new']}")
        if step.get("not_compared"):
            out.append(f"{head} steps: {step['not_compared']}")
        else:
            out.append(f"{head} steady steps, {100 * step['confidence_slower']:.0f}% confident the new one is "
                       f"slower: {verdict}")
        if without and step.get("recorded"):
            rec = step["recorded"]
            rec_pct = "" if rec["change_pct"] is None else f" ({rec['change_pct']:+.1f}%)"
            gate = " (--fail-over judges the step without the profiler)" if result["fail_over_pct"] is not None else ""
            out.append(f"  as recorded, with the profiler: {rec['base_median']:.1f} -> {rec['new_median']:.1f} us"
                       f"{rec_pct}{gate}")
        if c.get("why"):
            out.append(f"  why: {c['why']}")
        devices = c.get("devices") or {}
        if devices.get("base") and devices.get("new") and devices["base"] != devices["new"] \
                and "GPUs differ" not in (step.get("not_compared") or ""):
            out.append(f"  the GPUs differ: {', '.join(devices['base'])} -> {', '.join(devices['new'])} (the change "
                       "includes the hardware's; compare on one GPU model to judge the code alone)")
        out.append("")
    out += [f"only in {'base' if u['base'] else 'new'}: {u['base'] or u['new']}"
            + ("  (unreadable)" if u["error"] else "") for u in result["unmatched"]]
    if len(result["comparisons"]) + len(result["unmatched"]) > 1:
        out.append(overall_line(result))
    return "\n".join(out) + "\n"


def overall_line(result: dict[str, Any]) -> str:
    """One verdict over every pair of two folders: a reader of 40 comparisons should not have to add them up."""
    counts = {"regression(s)": 0, "slower": 0, "faster": 0, "within noise": 0, "not compared": 0, "unreadable": 0}
    for c in result["comparisons"]:
        step = c.get("step") or {}
        if c["errors"]:
            counts["unreadable"] += 1
        elif c["regression"]:
            counts["regression(s)"] += 1
        elif step.get("not_compared"):
            counts["not compared"] += 1
        elif c["outside_noise"]:
            counts["slower" if (step.get("change_pct") or 0.0) > 0 else "faster"] += 1
        else:
            counts["within noise"] += 1
    said = ", ".join(f"{n} {label}" for label, n in counts.items() if n)
    one_side = f"; {len(result['unmatched'])} on one side only" if result["unmatched"] else ""
    return f"overall: {len(result['comparisons'])} pair(s): {said or 'none'}{one_side}"
