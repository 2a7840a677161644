"""`attntrace diff BASE NEW`: per-step time, kernel counts by class, copies, launches and findings of two
traces (or two directories of traces matched by name), with the spread across steps kept in view so that
noise is not called a regression."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from attntrace.checks.base import trace_label
from attntrace.lint import TraceReport, lint_trace
from attntrace.loading import InputError, guarded, load
from attntrace.reader import discover

METRICS = ("step_us", "gpu_busy_us", "cpu_us", "kernels", "memcpy", "memset", "launches", "launch_cpu_us")


def pairs(base: str, new: str) -> list[tuple[str | None, str | None]]:
    """(base, new) paths: the two files, or the traces of two directories matched by name."""
    if not (Path(base).is_dir() and Path(new).is_dir()):
        return [(base, new)]

    def by_label(root: str) -> dict[str, str]:
        found = [item[0] for item in discover([root]) if isinstance(item, tuple)]
        return {trace_label(str(Path(p).relative_to(root))): p for p in found}

    left, right = by_label(base), by_label(new)
    return [(left.get(k), right.get(k)) for k in sorted(set(left) | set(right))]


def _classes(trace: Any, steps: int) -> dict[str, float]:
    gpu = trace.gpu_linked.filter(pl.col("step").is_not_null())
    counts = gpu.group_by("cls").len().sort("cls")
    return {cls: n / max(steps, 1) for cls, n in counts.iter_rows()}


def _key(f: dict[str, Any]) -> tuple[str, str, str]:
    # Match findings across two different traces by what they are, not by the trace they came from.
    return f["rule"], f["where"].get("op_chain") or "", f["where"].get("kernel") or ""


def _analyse(path: str) -> tuple[Any, TraceReport]:
    trace = load(path)
    return trace, lint_trace(trace)


def compare_pair(base: str, new: str, fail_over: float | None) -> dict[str, Any]:
    results = [guarded(p, _analyse) for p in (base, new)]
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
    step = metrics["step_us"]
    # A change is real only when the two ranges across steps do not overlap.
    outside_noise = step["new_range"][0] > step["base_range"][1] or step["new_range"][1] < step["base_range"][0]
    regression = bool(fail_over is not None and outside_noise and step["change_pct"] is not None
                      and step["change_pct"] > fail_over)
    before = {_key(f): f for f in br.findings}
    after = {_key(f): f for f in nr.findings}
    changed = []
    for key in sorted(set(before) & set(after)):
        b_us, n_us = before[key]["impact"]["gpu_us_per_step"], after[key]["impact"]["gpu_us_per_step"]
        if abs(n_us - b_us) > 0.1 * max(b_us, 1.0):
            changed.append({"rule": key[0], "message": after[key]["message"], "base_gpu_us_per_step": b_us,
                            "new_gpu_us_per_step": n_us})
    return {
        "base": base, "new": new, "errors": [],
        "steps": {"base": bs.height, "new": ns.height},
        "metrics": metrics,
        "kernel_classes": {"base": _classes(bt, bs.height), "new": _classes(nt, ns.height)},
        "findings": {
            "new": [_brief(after[k]) for k in sorted(set(after) - set(before))],
            "fixed": [_brief(before[k]) for k in sorted(set(before) - set(after))],
            "changed": changed,
        },
        "outside_noise": outside_noise,
        "regression": regression,
    }


def _brief(f: dict[str, Any]) -> dict[str, Any]:
    return {"rule": f["rule"], "severity": f["severity"], "message": f["message"],
            "gpu_us_per_step": f["impact"]["gpu_us_per_step"]}


def compare(base: str, new: str, fail_over: float | None) -> dict[str, Any]:
    comparisons, unmatched = [], []
    matched = pairs(base, new)
    for b, n in matched:
        if b is None or n is None:
            unmatched.append({"base": b, "new": n})
            continue
        result = compare_pair(b, n, fail_over)
        if len(matched) > 1 and result.pop("not_traces", False):
            continue  # other JSON beside the traces of a directory (run.json)
        result.pop("not_traces", None)
        comparisons.append(result)
    return {"comparisons": comparisons, "unmatched": unmatched, "fail_over_pct": fail_over,
            "regressions": sum(c.get("regression", False) for c in comparisons),
            "errors": sum(bool(c["errors"]) for c in comparisons)}


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
        for label in ("new", "fixed"):
            out += [f"  {label}: {f['rule']} {f['message']}" for f in c["findings"][label]]
        out += [f"  changed: {f['rule']} {f['base_gpu_us_per_step']:.1f} -> {f['new_gpu_us_per_step']:.1f} us/step"
                for f in c["findings"]["changed"]]
        step = c["metrics"]["step_us"]
        verdict = ("REGRESSION" if c["regression"] else
                   "change outside the step-to-step spread" if c["outside_noise"] else "within noise")
        out.append(f"  step time {step['base']:.1f} -> {step['new']:.1f} us: {verdict}")
        out.append("")
    out += [f"only in {'base' if u['base'] else 'new'}: {u['base'] or u['new']}" for u in result["unmatched"]]
    return "\n".join(out) + "\n"
