"""Run the enabled rules over traces and assemble the report (schema_version 1, DESIGN.md)."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

from attntrace import __version__
from attntrace.checks import CHECKS, Context, Skip
from attntrace.checks.catalog import Rule, load_rules
from attntrace.checks.config import Settings
from attntrace.model import Trace, roofline
from attntrace.model.loading import SKIPPED, InputError, Runner, load, map_inputs
from attntrace.model.replay import ProfilerCosts
from attntrace.model.summary import summarize
from attntrace.model.tables import gc_paused
from attntrace.read import ReadOptions, input_roots
from attntrace.report import (
    SEVERITY_RANK,
    TraceReport,
    promises_nothing,
    ranks,
    severity_counts,
    sort_key,
    total_impact,
)

SCHEMA_VERSION = 1


def default_settings(rules: dict[str, Rule]) -> Settings:
    return Settings(tuple(sorted(rules)), {rid: {p.name: p.default for p in r.parameters.values()}
                                           for rid, r in rules.items()})


def _missing(trace: Trace, need: str) -> str | None:
    if need == "gpu" and not trace.has_gpu:
        return "no GPU events (kernels, memcpy, memset) in the trace"
    if need == "ops" and not (trace.ops["cat"] == "cpu_op").any():
        return ("no CPU ops in the trace (an Nsight Systems export has them only from "
                "torch.autograd.profiler.emit_nvtx() ranges): this rule judges the op that caused the kernels")
    if need == "shapes" and not trace.has_shapes:
        return "no input shapes: capture with record_shapes=True"
    return None


def lint_trace(trace: Trace, settings: Settings | None = None) -> TraceReport:
    """One trace's report: its summary and the findings of every enabled rule."""
    with gc_paused():
        return _lint_trace(trace, settings)


def summarize_trace(trace: Trace, settings: Settings, with_path: bool = False) -> dict[str, Any]:
    """`attntrace summary` of one trace, its profiler estimate made with the config's costs (`run
    --calibrate-profiler`) as lint's is: summary and lint give a trace the same step without the profiler."""
    if settings.profiler_cost:
        costs = ProfilerCosts.from_table(settings.profiler_cost, ProfilerCosts.default())
        # Costs measured on a CPU alone (`run --calibrate-profiler --device cpu`) timed no launch and no GPU
        # runtime call, on another machine than the GPU host: a GPU trace keeps the defaults (one such config
        # made a GPU trace's 42% idle read 55%).
        if trace.has_gpu and str(costs.measured_on.get("device", "")).lower() == "cpu":
            trace.shared["profiler_costs_refused"] = "measured on a CPU, not applied to a GPU trace"
        else:
            trace.shared["profiler_costs"] = costs
    return summarize(trace, with_path)


def _lint_trace(trace: Trace, settings: Settings | None) -> TraceReport:
    rules = load_rules()
    settings = settings or default_settings(rules)
    summary = summarize_trace(trace, settings)
    info = {"path": trace.path, "label": trace.label, "device": summary["device"], "steps": summary["steps"],
            "events": trace.ops.height + trace.launches.height + trace.gpu.height, "summary": summary,
            "incomplete": trace.meta.incomplete, "error": None}
    info["roofline"] = roofline.analyse(trace)
    report = TraceReport(trace.path, info, job=ranks.identity(trace))
    for rule_id in settings.enabled:
        rule = rules[rule_id]
        reason = next((r for r in map(partial(_missing, trace), rule.needs) if r), None)
        if reason is None:
            ctx = Context(trace, rule, settings.params[rule_id], settings.severity.get(rule_id, rule.severity))
            try:
                report.findings.extend(map(_json_safe, CHECKS[rule_id](ctx)))
            except Skip as skip:
                reason = str(skip)
        if reason:
            report.skipped.append({"trace": trace.path, "rule": rule_id, "reason": reason})
    mark_subsumed(report.findings)
    info["impact_gpu_us_per_step"] = total_impact(report.findings)
    return report


def _json_safe(value: Any) -> Any:
    """A finding with its integers past 64 bits as floats: a size multiplied out of a hostile trace's shapes
    can pass them, and no JSON writer takes such an integer (the report of every trace in the run was lost)."""
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_json_safe(item) for item in value)
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return float(value)
    return value


SDPA_MATH = "aten::_scaled_dot_product_attention_math"
IDLE_RULES = ("AT302", "AT501")  # GPU idle time that AT402 measures in full


def mark_subsumed(findings: list[dict[str, Any]]) -> None:
    """A finding whose fix another finding's fix includes is a consequence of that cause: it says which rule
    (`subsumed_by`) and which finding (`cause`, its fingerprint), and its impact is not counted again. Leaving
    the SDPA math backend (AT202) removes what runs inside it (its FP32 GEMMs, copies, low-occupancy kernels and
    per-call mask); fusing an unfused attention chain (AT102) removes the copies its ops make (AT101) and its
    matmuls far from their roofline (AT601); and the
    idle time after host syncs (AT302) and of launch-bound steps (AT501) is part of the idle time AT402 reports
    for the same device, whose fix names both (unless that AT402 found only the profiler's cost). (AT401 leaves
    out the kernels AT201 and AT202 own itself.)"""
    rules = {f["rule"] for f in findings}
    # An AT402 that finds the idle under its threshold without the profiler (info), or cannot tell (info), is not a
    # cause a sync or a launch loop can be part of: nested under it, a real sync's warning would leave the verdict
    # and the exit code.
    idle_devices = {f["where"].get("device") for f in findings if f["rule"] == "AT402" and not promises_nothing(f)}
    for f in findings:
        chain = f["where"].get("op_chain") or ""
        if "AT202" in rules and f["rule"] != "AT202" and (
                SDPA_MATH in chain
                or (f["rule"] == "AT201" and str(f["evidence"].get("cause", "")).startswith("sdpa-math-upcast"))
                or (f["rule"] == "AT301" and f["evidence"].get("sdpa_math_backend"))):
            f["subsumed_by"] = "AT202"
        elif f["rule"] in ("AT101", "AT601") and "AT102" in rules and f["evidence"].get("in_unfused_attention"):
            f["subsumed_by"] = "AT102"
        elif f["rule"] in IDLE_RULES and idle_devices and (
                f["where"].get("device") in idle_devices or f["where"].get("device") is None):
            f["subsumed_by"] = "AT402"
    for f in findings:
        if "subsumed_by" in f:
            f["cause"] = _cause_of(f, [c for c in findings if c["rule"] == f["subsumed_by"]])["fingerprint"]


def _cause_of(consequence: dict[str, Any], candidates: list[dict[str, Any]]) -> dict[str, Any]:
    """The finding of the including rule this one follows from: on the same device, sharing the longest start
    of its op chain (the SDPA call it ran inside), then the largest impact; the fingerprint breaks ties."""
    device = consequence["where"].get("device")
    chain = consequence["where"].get("op_chain") or ""

    def closeness(c: dict[str, Any]) -> tuple[Any, ...]:
        theirs = c["where"].get("op_chain") or ""
        shared = len(theirs) if theirs and chain.startswith(theirs) else 0
        same_device = device is None or c["where"].get("device") in (device, None)
        return (same_device, shared, c["impact"]["gpu_us_per_step"], c["fingerprint"])

    return max(candidates, key=closeness)


def nest_consequences(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The causes, each holding its consequences (`consequences`, sorted like causes, a consequence of a
    consequence under the root cause): one finding per cause a user can fix with one change, in every format."""
    by_fingerprint = {f["fingerprint"]: f for f in findings}
    nested: dict[str, list[dict[str, Any]]] = {}
    for f in sorted((f for f in findings if "cause" in f), key=sort_key):
        root = by_fingerprint[f["cause"]]
        while "cause" in root:
            root = by_fingerprint[root["cause"]]
        nested.setdefault(root["fingerprint"], []).append(f)
    # New dicts: a trace's own findings stay flat, so assembling them twice nests nothing twice.
    return [{**f, "consequences": nested[f["fingerprint"]]} if f["fingerprint"] in nested else f
            for f in findings if "cause" not in f]


def lint_path(path: str, settings: Settings, options: ReadOptions) -> TraceReport:
    return lint_trace(load(path, options), settings)


def run(paths: list[str], settings: Settings, jobs: int = 1,
        options: ReadOptions = ReadOptions(), runner: Runner | None = None,  # noqa: B008
        group: str = "none") -> dict[str, Any]:
    """Lint every trace under `paths` (`jobs` at a time, or on a cluster through `runner`); `group` "ranks" or
    "auto" merges one job's ranks (ranks.group)."""
    options = options if options.roots else dataclasses.replace(options, roots=input_roots(paths))
    results = list(map_inputs(paths, partial(lint_path, settings=settings, options=options), jobs, runner))
    return ranks.group(assemble(results), results, group)



def assemble(results: list[TraceReport | InputError]) -> dict[str, Any]:
    traces, findings, skipped = [], [], []
    for result in results:
        if isinstance(result, InputError) and result.kind == SKIPPED:
            continue
        if isinstance(result, InputError):
            traces.append({"path": result.path, "device": None, "steps": 0, "events": 0, "summary": None,
                           "incomplete": False, "error": {"kind": result.kind, "message": result.message}})
            continue
        traces.append(result.info)
        findings.extend(nest_consequences(result.findings))
        skipped.extend(result.skipped)
    findings.sort(key=sort_key)
    counts = severity_counts(findings)
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "attntrace", "version": __version__},
        "traces": traces,
        "findings": findings,
        "skipped": skipped,
        # `findings` counts causes; `consequences` the findings nested in them.
        "summary": {"traces": len(traces), "errors": sum(1 for t in traces if t["error"]), "findings": counts,
                    "consequences": sum(len(f.get("consequences", ())) for f in findings)},
    }


def exit_code(report: dict[str, Any], fail_on: str) -> int:
    """2 for an unreadable input or an annotated copy that could not be written; 1 for a finding at or above
    fail_on (only new ones against a baseline)."""
    if report["summary"]["errors"] or any(t.get("annotate_error") for t in report["traces"]):
        return 2
    if fail_on == "never":
        return 0
    if fail_on not in SEVERITY_RANK:
        raise ValueError(f"fail_on must be one of {', '.join([*SEVERITY_RANK, 'never'])}, not {fail_on!r}")
    limit = SEVERITY_RANK[fail_on]
    counted = [f for f in report["findings"] if f.get("baseline", "new") == "new"]
    return 1 if any(SEVERITY_RANK[f["severity"]] <= limit for f in counted) else 0
