"""`attntrace run --from-trace`: the attention a user's trace ran, at its own shapes, measured against every
alternative on this machine. The plan (sites, shapes, variants) needs no torch; the measurement imports the
capture package only when it runs. Also applies such a measurement to lint's findings (`lint --measured`)."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from attntrace.capture import options
from attntrace.checks import sites
from attntrace.model import Trace
from attntrace.read.buffers import read_small_file

PLAN_SCHEMA = 1
MEASURED_KIND = "attntrace-from-trace"
RUN_DTYPES = ("bf16", "fp16", "fp32")
# Which findings a measured site answers, and how each finding names its cause: AT102 by its chain, AT202 by
# its reason and chain, AT203 by any of its kernels (one finding holds the forward and backward kernels).
MEASURED_RULES = ("AT102", "AT202", "AT203")


class NoShapes(Exception):
    """The trace was captured without record_shapes: there are no shapes to measure at."""


def no_shapes_line(path: str) -> str:
    return (f"{path}: no input shapes in the trace, so its attention calls cannot be sized: capture it with "
            "torch.profiler.profile(record_shapes=True)")


def _finding_keys(finding: dict[str, Any]) -> set[tuple[str, str]]:
    """The keys a site that the finding is about holds (sites.py): AT203's one finding names every fp32 kernel."""
    where = finding["where"]
    if finding["rule"] == "AT202":
        return {("AT202", f"{finding['evidence'].get('reason')}|{where.get('op_chain')}")}
    if finding["rule"] == "AT203":
        return {("AT203", name) for name in finding["evidence"].get("kernels_us_per_step") or [where.get("kernel")]}
    return {(finding["rule"], str(where.get("op_chain")))}


def shape_of(site: dict[str, Any]) -> options.Shape:
    batch, heads, q_len, head_dim = site["q"]
    kv_len = site["kv_len"]
    return options.Shape(batch, heads, kv_len, head_dim, site["kv_heads"] if site["kv_heads"] != heads else None,
                         q_len if q_len != kv_len else None)


def _variants(site: dict[str, Any], spec: str) -> tuple[list[str], str | None]:
    """The variants a site gets (what it runs first, for a like-for-like row), or none and why."""
    if site["dtype"] not in RUN_DTYPES:
        return [], f"{site['dtype']} inputs: the variants run {', '.join(RUN_DTYPES)}"
    shape = shape_of(site)
    problem = options.check_shape(shape, site["causal"], site["backward"], 1, 0)
    if problem:
        return [], problem.replace("--", "")
    names = list(options.variant_names(spec, shape))
    current = site["current_variant"]
    if current in options.ALL_VARIANTS:
        names = [current, *(n for n in names if n != current)]
    return names, None


def plan(trace: Trace, variants: str = "all", causal: bool | None = None) -> dict[str, Any]:
    """The sites of a trace and the variants each gets (the `--plan` JSON contract, README). ValueError for an
    unknown variant name; NoShapes for a trace without recorded shapes."""
    if not trace.has_shapes:
        raise NoShapes(no_shapes_line(trace.path))
    from attntrace.report.engine import lint_trace

    found = sites.find(trace)
    findings = [f for f in lint_trace(trace).findings if f["rule"] in MEASURED_RULES]
    device = trace.device_name(trace.devices[0]) if trace.devices else None
    out = []
    for number, site in enumerate(found, 1):
        entry: dict[str, Any] = {"id": number, **site.as_dict()}
        if causal is not None and not entry["decode"]:
            entry["causal"], entry["causal_source"] = causal, "set by --causal/--no-causal"
        entry["device"] = device or "cpu"
        entry["variants"], entry["not_measured"] = _variants(entry, variants)
        keys = {k for call in site.calls for k in call.keys}
        entry["findings"] = [{"rule": f["rule"], "fingerprint": f["fingerprint"],
                              "share": _share(site, f)}
                             for f in findings if _finding_keys(f) & keys]
        out.append(entry)
    return {"schema_version": PLAN_SCHEMA, "trace": trace.path, "device": device or "cpu",
            "steps": trace.step_count, "has_shapes": True, "sites": out,
            "command": f"attntrace run --from-trace {shlex.quote(trace.path)}"}


def _share(site: sites.Site, finding: dict[str, Any]) -> float:
    """The part of a site's GPU time a finding is about: all of it for a chain or a math-backend call, the time
    of AT203's fp32 kernels (forward and backward) that ran in the site."""
    if finding["rule"] == "AT203" and site.gpu_us:
        kernels = finding["evidence"].get("kernels_us_per_step") or {}
        return round(sum(site.kernels.get(name, 0.0) for name in kernels) / site.gpu_us, 4)
    return 1.0


# --- text -----------------------------------------------------------------------------------------
def _ms(us: float) -> str:
    return f"{us / 1e3:.3f} ms"


def describe(site: dict[str, Any]) -> str:
    b, h, q, d = site["q"]
    heads = f"H={h}" + (f" KV heads={site['kv_heads']}" if site["kv_heads"] != h else "")
    if site["decode"]:
        lo, hi = site["kv_len_range"]
        seq = f"queries={q} KV len={lo}..{hi}" if lo != hi else f"queries={q} KV len={hi}"
    else:
        seq = f"S={q}"
    extra = [site["dtype"], "causal" if site["causal"] else "no causal mask"]
    if site["mask"]:
        extra.append(f"mask {site['mask']}")
    if site["repeat_kv"]:
        extra.append("repeat_kv copies")
    extra.append("fwd+bwd" if site["backward"] else "fwd")
    return f"B={b} {heads} {seq} D={d} | " + " | ".join(extra)


def render_plan(doc: dict[str, Any]) -> str:
    lines = [f"{doc['trace']}: {doc['device']}, {doc['steps']} step(s), {len(doc['sites'])} attention site(s)"]
    if not doc["sites"]:
        lines.append("no attention calls with recorded shapes found (SDPA, FlexAttention, FlashAttention/xFormers "
                     "ops, or an unfused matmul-softmax-matmul chain)")
    for site in doc["sites"]:
        time = (f"{_ms(site['gpu_us_per_step'])} GPU per step" if site["gpu_us_per_step"]
                else f"{_ms(site['cpu_us_per_step'])} CPU per step")
        lines.append(f"site {site['id']}: {site['implementation']}, {site['calls_per_step']:g} call(s) per step, "
                     f"{time}")
        lines.append(f"  {describe(site)}")
        lines.append(f"  causal: {site['causal_source']}")
        if site["variants"]:
            lines.append(f"  variants: {', '.join(site['variants'])} ({site['variants'][0]} runs what the trace ran)"
                         if site["variants"][0] == site["current_variant"] else
                         f"  variants: {', '.join(site['variants'])}")
        else:
            lines.append(f"  not measured: {site['not_measured']}")
        if site["findings"]:
            lines.append(f"  answers lint findings: {', '.join(f['rule'] for f in site['findings'])}")
    if doc["sites"]:
        lines.append(f"measure them: {doc['command']}")
    return "\n".join(lines)


# --- measuring --------------------------------------------------------------------------------------
def measure(doc: dict[str, Any], *, steps: int, warmup: int, device: str, out_dir: Path, lint: bool,
            max_sites: int | None, progress: Callable[[int, str], Any]) -> dict[str, Any]:
    """Run each site's variants at its shapes (runner.run, one output directory and run.json per site), then the
    verdicts. `progress(n, label)` gives the context manager that reports a site's n variants."""
    import orjson

    from attntrace.capture import runner
    from attntrace.report.compare import analyse_run

    measured = []
    chosen = doc["sites"][:max_sites]
    for site in chosen:
        if not site["variants"]:
            measured.append({"site": site, "report": None})
            continue
        folder = out_dir / f"site-{site['id']}"
        config = runner.RunConfig(tuple(site["variants"]), shape_of(site), site["dtype"], site["causal"],
                                  site["backward"], steps, warmup, device, folder)
        label = (f"site {site['id']} of {len(chosen)}: {describe(site)}, {len(config.variants)} variant(s) on "
                 f"{device}")
        with progress(len(config.variants), label) as report_progress:
            meta, results = runner.run(config, progress=report_progress)
        report = analyse_run(meta, [asdict(r) for r in results], lint=lint)
        report["site"] = site
        folder.joinpath("run.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
        measured.append({"site": site, "report": report})
    return summarize_measurement(doc, measured, out_dir)


def _variant_ms(report: dict[str, Any]) -> dict[str, float]:
    """Milliseconds per call of each variant that ran and passed, timed without the profiler."""
    return {row["variant"]: row["event_ms"] for row in report["table"]
            if row.get("status") == "ok" and row.get("event_ms")}


def summarize_measurement(doc: dict[str, Any], measured: list[dict[str, Any]], out_dir: Path) -> dict[str, Any]:
    """The verdict per site and for the step, and each lint finding's measured saving."""
    environment = next((m["report"]["environment"] for m in measured if m["report"]), {})
    here = environment.get("gpu") or "cpu"
    same_device = here == doc["device"]
    results, findings = [], {}
    for m in measured:
        site, report = m["site"], m["report"]
        entry: dict[str, Any] = {"id": site["id"], "implementation": site["implementation"],
                                 "calls_per_step": site["calls_per_step"], "run": None}
        if report is None:
            entry["verdict"] = f"site {site['id']}: not measured ({site['not_measured']})"
            results.append(entry)
            continue
        entry["run"] = f"site-{site['id']}/run.json"
        calls = site["calls_per_step"]
        per_step = {name: ms * calls for name, ms in _variant_ms(report).items()}
        trace_ms = (site["gpu_us_per_step"] or site["cpu_us_per_step"]) / 1e3
        current = site["current_variant"]
        # The user's time: the trace's own on the same device (it holds everything the site's ops ran: casts,
        # copies, the backward), else the like-for-like variant measured here.
        if same_device or current not in per_step:
            yours_ms, basis = trace_ms, "in the trace"
        else:
            yours_ms, basis = per_step[current], f"{current} measured here"
        entry.update({"trace_ms_per_step": round(trace_ms, 4), "yours_ms_per_step": round(yours_ms, 4),
                      "yours_basis": basis, "variants_ms_per_step": {k: round(v, 4) for k, v in per_step.items()}})
        if not per_step:
            entry["verdict"] = f"site {site['id']}: no variant ran and passed its check here"
            results.append(entry)
            continue
        best = min(per_step, key=lambda name: (per_step[name], name))
        # Running the fastest variant already saves nothing: a gap to the trace's own time is noise or profiler cost.
        saving = 0.0 if best == current else max(0.0, yours_ms - per_step[best])
        entry.update({"best": best, "best_ms_per_step": round(per_step[best], 4),
                      "saving_ms_per_step": round(saving, 4)})
        entry["verdict"] = _site_verdict(site, entry, current)
        for f in site["findings"]:
            found = findings.setdefault(f["fingerprint"], {"rule": f["rule"], "saved_us_per_step": 0.0,
                                                           "sites": [], "best": best})
            found["saved_us_per_step"] = round(found["saved_us_per_step"] + saving * 1e3 * f["share"], 3)
            found["sites"].append(site["id"])
        results.append(entry)
    done = [r for r in results if "best" in r]
    total_yours = sum(r["yours_ms_per_step"] for r in done)
    total_best = sum(r["best_ms_per_step"] for r in done)
    step = {"yours_ms_per_step": round(total_yours, 4), "best_ms_per_step": round(total_best, 4),
            "saving_ms_per_step": round(sum(r["saving_ms_per_step"] for r in done), 4)}
    step["verdict"] = (f"whole step: attention takes {total_yours:.3f} ms per step over {len(done)} measured "
                       f"site(s); the fastest variants measured here take {total_best:.3f} ms: saves "
                       f"~{step['saving_ms_per_step']:.3f} ms per step") if done else "whole step: nothing measured"
    notes = []
    if not same_device:
        notes.append(f"the trace ran on {doc['device']}; these measurements are for {here}")
    return {"kind": MEASURED_KIND, "schema_version": PLAN_SCHEMA, "trace": doc["trace"],
            "trace_device": doc["device"], "device": here, "environment": environment, "plan": doc,
            "sites": results, "step": step, "findings": findings, "notes": notes, "out_dir": str(out_dir)}


def _site_verdict(site: dict[str, Any], entry: dict[str, Any], current: str | None) -> str:
    yours = (f"site {site['id']}: your {site['implementation']}: {entry['yours_ms_per_step']:.3f} ms per step "
             f"({site['calls_per_step']:g} call(s), {entry['yours_basis']})")
    best, best_ms = entry["best"], entry["best_ms_per_step"]
    if best == current:
        return f"{yours}; the fastest measured here is {best} at {best_ms:.3f} ms, which is what you run"
    if entry["saving_ms_per_step"] <= 0:
        return f"{yours}; the fastest measured here, {best} at {best_ms:.3f} ms, is no faster than what you run"
    return f"{yours}; {best} measured here: {best_ms:.3f} ms; saves ~{entry['saving_ms_per_step']:.3f} ms per step"


def render_measurement(doc: dict[str, Any]) -> str:
    lines = [*(f"note: {n}" for n in doc["notes"])]
    lines += [r["verdict"] for r in doc["sites"]]
    lines.append(doc["step"]["verdict"])
    return "\n".join(lines)


# --- lint --measured --------------------------------------------------------------------------------
class MeasuredError(Exception):
    """A --measured file that is not a `run --from-trace` result; the message is one line."""


MAX_SAVING_US = 86_400e6  # a day per step: a measured saving past it is no measurement


def read_measured(path: str) -> dict[str, Any]:
    import orjson

    try:
        doc = orjson.loads(read_small_file(path))
    except OSError as exc:
        raise MeasuredError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except orjson.JSONDecodeError as exc:
        raise MeasuredError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("kind") != MEASURED_KIND or not isinstance(doc.get("findings"), dict):
        raise MeasuredError(f"{path}: not the run.json of `attntrace run --from-trace`")
    version = doc.get("schema_version")
    if type(version) is not int or version != PLAN_SCHEMA:  # not True, not 1.0
        # A later layout may mean something else by the same fields: refuse it rather than guess.
        raise MeasuredError(f"{path}: schema_version {version!r} is not {PLAN_SCHEMA}, the only one this attntrace "
                            "reads (run `attntrace run --from-trace` again with this version)")
    for fingerprint, entry in doc["findings"].items():
        saved = entry.get("saved_us_per_step") if isinstance(entry, dict) else None
        # `run --from-trace` writes savings of 0 or more.
        if not (isinstance(saved, int | float) and not isinstance(saved, bool) and 0 <= saved <= MAX_SAVING_US
                and isinstance(entry.get("best"), str | None) and isinstance(entry.get("rule"), str)):
            raise MeasuredError(f"{path}: finding {fingerprint[:40]!r} is not a measured saving "
                                "(an object with a rule name, a number saved_us_per_step from 0 to a day and a variant "
                                "name best)")
    return doc


def apply_measured(report: dict[str, Any], measured: dict[str, Any], source: str
                   ) -> tuple[int, list[str], list[str]]:
    """Replace the assumed impact of findings that a from-trace run measured with the measured saving, and say so;
    the findings are sorted again and each trace's total impact redone. A finding is matched by its fingerprint,
    else by its rule and the op chain of the sites measured for it (a fingerprint written by an earlier version of
    attntrace: the committed GPT-2 run.json's AT102 key changed when AT102 began counting the backward). Returns how
    many findings changed, the measured fingerprints that matched none, and those whose saving is larger than the
    whole step of the finding's trace (measured on another program, or not a measurement): those are not applied."""
    entries = measured["findings"]
    chains = _measured_chains(measured)
    used: set[str] = set()
    changed = 0
    too_large: list[str] = []
    for finding in report["findings"]:
        # A saving measured for one rule is never given to another rule's finding, even under its fingerprint.
        key = finding["fingerprint"] if entries.get(finding["fingerprint"], {}).get("rule") == finding["rule"] \
            else _by_chain(finding, chains, used, measured.get("trace"))
        if key is None:
            continue
        used.add(key)
        hit = entries[key]
        impact = finding["impact"]
        old_us, old_share = impact["gpu_us_per_step"], impact["share_of_step"]
        # The step the share is of, as the finding holds it (a step rebuilt from the rounded share was off by up
        # to 2x on small findings).
        step_us = impact.get("step_us") or (old_us / old_share if old_us and old_share else
                                            _step_us(report, finding["trace"]))
        saved = float(hit["saved_us_per_step"])
        if step_us and saved > step_us:  # 8.6e10 us on a 2.3 ms step was applied: "3773560065.8% of step"
            too_large.append(key)
            continue
        impact.update({"gpu_us_per_step": round(saved, 3),
                       "share_of_step": round(saved / step_us, 4) if step_us else 0.0,
                       "basis": "measured", "assumed_gpu_us_per_step": old_us})
        finding["evidence"]["measured"] = {"source": source, "device": measured.get("device"),
                                           "best_variant": hit.get("best"), "sites": hit.get("sites")}
        finding["message"] += (f" [impact measured by `attntrace run --from-trace` on {measured.get('device')}: "
                               f"{hit.get('best')} saves {saved / 1e3:.3f} ms per step]")
        changed += 1
    if changed:
        from attntrace.report import sort_key, total_impact

        report["findings"].sort(key=sort_key)
        for trace in report["traces"]:
            if "impact_gpu_us_per_step" in trace:
                trace["impact_gpu_us_per_step"] = total_impact([f for f in report["findings"]
                                                                if f["trace"] == trace["path"]])
    return changed, sorted(set(entries) - used), sorted(too_large)


def _measured_chains(measured: dict[str, Any]) -> dict[str, tuple[str, set[str]]]:
    """Each measured fingerprint's rule and the op chains of the sites it was measured at (from the run's plan)."""
    plan = measured.get("plan")
    plan_sites = plan.get("sites") if isinstance(plan, dict) else None
    chains: dict[str, tuple[str, set[str]]] = {}
    for site in plan_sites if isinstance(plan_sites, list) else []:
        if not isinstance(site, dict) or not isinstance(site.get("op_chain"), str):
            continue
        for f in site.get("findings") if isinstance(site.get("findings"), list) else []:
            entry = measured["findings"].get(str(f.get("fingerprint"))) if isinstance(f, dict) else None
            # The saving's own rule decides; a plan that names another rule for it is not trusted.
            if entry is not None and f.get("rule") == entry["rule"]:
                _, found = chains.setdefault(str(f.get("fingerprint")), (entry["rule"], set()))
                found.add(site["op_chain"])
    return chains


def _by_chain(finding: dict[str, Any], chains: dict[str, tuple[str, set[str]]], used: set[str],
              measured_trace: Any) -> str | None:
    """The one unused measured fingerprint of the same rule at the finding's op chain, for a finding of the trace
    the run measured (by file name: the run.json may have been made elsewhere)."""
    if Path(str(finding.get("trace"))).name != Path(str(measured_trace)).name:
        return None
    chain = (finding.get("where") or {}).get("op_chain")
    candidates = [key for key, (rule, found) in chains.items()
                  if key not in used and rule == finding["rule"] and chain in found]
    return candidates[0] if len(candidates) == 1 else None


def _step_us(report: dict[str, Any], path: str) -> float:
    for trace in report["traces"]:
        if trace["path"] == path and trace.get("summary"):
            rows = trace["summary"].get("per_step") or []
            if rows:
                return sum(max(r.get("cpu_us", 0.0), r.get("gpu_busy_us", 0.0)) for r in rows) / len(rows)
    return 0.0
