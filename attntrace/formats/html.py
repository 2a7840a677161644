"""`--format html` and `run`'s report.html: one self-contained page (plotly.js inlined, no network) with
each trace's numbers, its findings by impact and a per-step GPU timeline by kernel class; for `run`, the
comparison as charts next to the table. Needs the `html` extra (plotly); nothing else imports this module."""

from __future__ import annotations

import html
import math
import os
from typing import Any

from attntrace.formats.printable import shown
from attntrace.formats.text import attention_text, impact_text
from attntrace.install import pip_install
from attntrace.report.ranks import render_job

MISSING_EXTRA = f"the HTML report needs plotly: {pip_install('html')}"
COLOURS = {"attention": "#2e7d32", "GEMM tensor-core": "#1565c0", "GEMM FP32": "#c62828", "GEMM other": "#6a1b9a",
           "elementwise": "#f9a825", "Triton": "#00838f", "copies": "#ef6c00", "communication": "#5d4037",
           "other": "#757575", "idle": "#e0e0e0"}
# One colour per rule on every page and trace, none of them a kernel class's: a flagged span never reads as a
# kind of kernel. Flagged bars are hatched as well, for readers who do not tell these colours apart.
RULE_COLOURS = {"AT101": "#212121", "AT102": "#d81b60", "AT201": "#00b8d4", "AT202": "#64dd17",
                "AT203": "#304ffe", "AT301": "#827717", "AT302": "#ff80ab", "AT401": "#80cbc4",
                "AT402": "#9e9e9e", "AT501": "#ffd54f"}
OTHER_RULE_COLOUR = "#000000"
SEVERITY_COLOURS = {"error": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}
CONFIG = {"displaylogo": False, "responsive": True}
STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd;word-break:break-all}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f5f5f5}td:first-child,th:first-child{text-align:left}
.finding{border-left:4px solid #999;padding:4px 12px;margin:10px 0;background:#fafafa}
.sev{font-weight:bold;text-transform:uppercase;font-size:.8em}.muted{color:#777;font-size:.9em}
code{background:#f0f0f0;padding:1px 3px;word-break:break-all}dl{margin:4px 0}dt{float:left;clear:left;width:14em;
color:#555}dd{margin-left:14.5em}.error{color:#c62828}
"""


def _require_plotly() -> Any:
    try:
        import plotly.graph_objects as go
    except ImportError as exc:
        raise RuntimeError(MISSING_EXTRA) from exc
    return go


def _esc(value: Any) -> str:
    """A value as HTML text, its control characters escaped as in the text report (`shown`): an escape sequence, a
    NUL or a right-to-left override (U+202E, which turns the text after it around) from a kernel or file name went
    into the page as it was."""
    return html.escape(shown(str(value)), quote=True)


def _figure_html(fig: Any, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=CONFIG)


def _page(title: str, body: list[str]) -> str:
    from plotly.offline import get_plotlyjs

    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_esc(title)}</title><style>{STYLE}</style>"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def timeline_figure(timeline: dict[str, Any], title: str) -> Any:
    """Horizontal bars per step (one trace per kernel class, one mark per merged busy span) and the
    findings' spans as thin bars above each step's row."""
    go = _require_plotly()
    fig = go.Figure()
    steps = timeline["steps"]
    rows = {s["step"]: i for i, s in enumerate(steps)}
    for group in timeline["groups"]:
        spans = [(rows[s["step"]], seg) for s in steps for seg in s["segments"] if seg["group"] == group]
        fig.add_trace(go.Bar(
            name=group, orientation="h", y=[r for r, _ in spans], base=[seg["start"] for _, seg in spans],
            x=[max(seg["end"] - seg["start"], 1e-4) for _, seg in spans], width=0.55,
            marker={"color": COLOURS.get(group, COLOURS["other"]), "line": {"width": 0}},
            hovertemplate=f"{group}<br>%{{base:.3f}} ms + %{{x:.3f}} ms<extra></extra>"))
    rules = sorted({f["rule"] for s in steps for f in s["flagged"]})
    for n, rule in enumerate(rules):  # n staggers the thin bars of several rules in one row
        spans = [(rows[s["step"]], f) for s in steps for f in s["flagged"] if f["rule"] == rule]
        offset = 0.36 + 0.1 * (n % 3)
        fig.add_trace(go.Bar(
            name=f"flagged: {rule}", orientation="h", y=[r + offset for r, _ in spans],
            base=[f["start"] for _, f in spans], x=[max(f["end"] - f["start"], 1e-4) for _, f in spans], width=0.08,
            marker={"color": RULE_COLOURS.get(rule, OTHER_RULE_COLOUR), "line": {"width": 0},
                    "pattern": {"shape": "/", "size": 4, "solidity": 0.5}},
            hovertemplate=f"{rule}<br>%{{base:.3f}} ms + %{{x:.3f}} ms<extra></extra>"))
    fig.update_layout(
        title={"text": title, "font": {"size": 14}}, barmode="overlay", height=140 + 46 * max(len(steps), 1),
        margin={"l": 70, "r": 20, "t": 40, "b": 40}, legend={"orientation": "h", "y": -0.25},
        xaxis={"title": "ms from the step's start on the GPU", "zeroline": False},
        yaxis={"tickvals": list(range(len(steps))), "ticktext": [f"step {s['step']}" for s in steps],
               "autorange": "reversed"},
        template="plotly_white")
    return fig


def _summary_table(summary: dict[str, Any], findings: list[dict[str, Any]]) -> str:
    per_step = summary.get("per_step") or []

    def mean(key: str) -> float | None:
        values = [s[key] for s in per_step if s.get(key) is not None]
        return sum(values) / len(values) if values else None

    def shown(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    busy = mean("gpu_busy_us")
    rows = [("device", summary.get("device") or "CPU only"), ("steps", summary.get("steps")),
            ("GPU busy per step", "-" if busy is None else f"{busy / 1e3:.3f} ms"),
            ("kernels per step", shown(mean("kernels"), ".4g")),
            ("Memcpy calls per step (copy kernels: the chart's copies)", shown(mean("memcpy"), ".4g")),
            ("launches per step", shown(mean("launches"), ".4g")),
            ("tensor-core share of GEMM time", None if summary.get("tensor_core_share_of_gemm") is None
             else f"{100 * summary['tensor_core_share_of_gemm']:.0f}%"),
            ("attention", attention_text(summary, findings))]
    body = "".join(f"<tr><td>{_esc(k)}</td><td>{_esc('-' if v is None else v)}</td></tr>" for k, v in rows)
    return f"<table class=\"summary\">{body}</table>"


def _finding_html(finding: dict[str, Any]) -> str:
    colour = SEVERITY_COLOURS.get(finding["severity"], "#999")
    where = finding.get("where") or {}
    parts = [f"<div class=\"finding\" style=\"border-color:{colour}\" data-rule=\"{_esc(finding['rule'])}\">",
             f"<div><span class=\"sev\" style=\"color:{colour}\">{_esc(finding['severity'])}</span> "
             f"<b>{_esc(finding['rule'])} {_esc(finding['name'])}</b>{_baseline_mark(finding)}: "
             f"{_esc(finding['message'])}</div>"]
    impact = finding.get("impact") or {}
    if impact.get("gpu_us_per_step"):
        assumes = f" &mdash; assumes {_esc(impact['assumption'])}" if impact.get("assumption") else ""
        parts.append(f"<div>impact: {_esc(impact_text(impact))}{assumes}</div>")
    if where.get("op_chain"):
        parts.append(f"<div>where: <code>{_esc(where['op_chain'])}</code></div>")
    if where.get("kernel"):
        parts.append(f"<div>kernel: <code>{_esc(where['kernel'])}</code></div>")
    source = where.get("source")
    if source:
        parts.append(f"<div>source: <code>{_esc(source.get('file'))}:{_esc(source.get('line'))}</code> "
                     f"in {_esc(source.get('function'))}</div>")
    evidence = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in (finding.get("evidence") or {}).items()
                       if v is not None)
    if evidence:
        parts.append(f"<details><summary>evidence</summary><dl>{evidence}</dl></details>")
    parts.append(f"<div>fix: {_esc(finding['fix'])}</div>")
    consequences = finding.get("consequences") or []
    if consequences:
        items = "".join(f"<li><b>{_esc(c['rule'])} {_esc(c['name'])}</b> ({_esc(c['severity'])}): "
                        f"{_esc(c['message'])}</li>" for c in consequences)
        parts.append(f"<div class=\"consequences\">this cause's fix also removes (counted in it):<ul>{items}</ul>"
                     "</div>")
    parts.append("</div>")
    return "".join(parts)


def _baseline_mark(finding: dict[str, Any]) -> str:
    """" (new)" or " (known)" against a baseline, as the text and Markdown reports mark a finding."""
    state = finding.get("baseline")
    return f" <span class=\"muted\">({_esc(state)})</span>" if state in ("new", "known") else ""


def _baseline_section(baseline: dict[str, Any]) -> str:
    """What the baseline says of the run, as the text report's baseline lines: counts, then what it held that is
    gone (fixed) and what it held that an incomplete trace could not judge."""
    lists = []
    for key, label in (("fixed", "fixed since the baseline"),
                       ("not_judged", "not judged (the trace is incomplete)")):
        entries = baseline.get(key) or []
        if entries:
            items = "".join(f"<li>{_esc(e['rule'])} in <code>{_esc(e['trace'])}</code>: {_esc(e['message'])}</li>"
                            for e in entries)
            lists.append(f"<details><summary>{len(entries)} {label}</summary><ul>{items}</ul></details>")
    return (f"<section class=\"baseline\"><p>baseline <code>{_esc(baseline['path'])}</code>: {baseline['new']} new, "
            f"{baseline['known']} known, {len(baseline['fixed'])} fixed</p>{''.join(lists)}</section>")


def trace_sections(report: dict[str, Any], timelines: dict[str, dict[str, Any]], file_names: bool = False
                   ) -> list[str]:
    """Per trace: its numbers, the timeline chart and its findings sorted by impact. Headed by the trace's path, or
    its file name alone where the page sits beside the traces (run's report.html: a temporary or absolute output
    folder's path said nothing)."""
    body = []
    for n, trace in enumerate(report["traces"]):
        path = trace["path"]
        body.append(f"<section class=\"trace\"><h2>{_esc(os.path.basename(path) if file_names else path)}</h2>")
        if trace.get("error"):
            body.append(f"<p class=\"error\">unreadable: {_esc(trace['error']['message'])}</p></section>")
            continue
        found = sorted((f for f in report["findings"] if f["trace"] == path),
                       key=lambda f: (-f["impact"]["gpu_us_per_step"], f["rule"], f["fingerprint"]))
        body.append(_summary_table(trace.get("summary") or {}, found))
        timeline = timelines.get(path)
        if timeline and timeline["steps"] and timeline["groups"] != ["idle"]:
            fig = timeline_figure(timeline, "GPU timeline per step, by kernel class; thin bars: flagged spans")
            body.append(_figure_html(fig, f"timeline-{n}"))
        elif timeline is not None:
            body.append("<p class=\"muted\">no GPU activity in steps: no timeline</p>")
        if trace.get("roofline") and trace["roofline"]["ops"]:
            from attntrace.formats.roofline_plot import roofline_figure

            body.append(_figure_html(roofline_figure(trace["roofline"], "Roofline"), f"roofline-{n}"))
        body.append(f"<h3>{len(found)} cause(s)</h3>")
        body += [_finding_html(f) for f in found]
        skipped = [s for s in report.get("skipped", []) if s["trace"] == path]
        if skipped:
            items = "".join(f"<li>{_esc(s['rule'])}: {_esc(s['reason'])}</li>" for s in skipped)
            body.append(f"<details class=\"muted\"><summary>{len(skipped)} rule(s) skipped</summary>"
                        f"<ul>{items}</ul></details>")
        body.append("</section>")
    return body


def lint_page(report: dict[str, Any], timelines: dict[str, dict[str, Any]], title: str = "attntrace lint") -> str:
    _require_plotly()
    counts = report["summary"]["findings"]
    head = [f"<h1>{_esc(title)}</h1>",
            f"<p>{report['summary']['traces']} trace(s), {report['summary']['errors']} unreadable; causes: "
            f"{counts['error']} error, {counts['warning']} warning, {counts['info']} info "
            f"<span class=\"muted\">(attntrace {_esc(report['tool']['version'])})</span></p>"]
    if report.get("job"):  # one job's ranks: its step times per rank and stragglers, as the text report gives
        head.append(f"<section class=\"job\"><pre>{chr(10).join(map(_esc, render_job(report['job'])))}</pre></section>")
    if report.get("baseline"):
        head.append(_baseline_section(report["baseline"]))
    return _page(title, head + trace_sections(report, timelines))


def _bar(go: Any, rows: list[dict[str, Any]], key: str, title: str, axis: str, log: bool = False,
         peak: float | None = None) -> Any:
    """Bars from zero on a linear axis; on a log axis dots, since a bar's length there starts wherever the axis
    does and 0.068 ms would look like nothing next to 0.141 ms."""
    shown = [r for r in rows if r.get(key) is not None and (not log or r[key] > 0)]
    names, values = [r["variant"] for r in shown], [r[key] for r in shown]
    hover = "%{x}: %{y:.4g}<extra></extra>"
    fig = go.Figure(go.Scatter(x=names, y=values, mode="markers+text", text=[f"{v:.3g}" for v in values],
                               textposition="top center", marker={"color": "#1565c0", "size": 11},
                               hovertemplate=hover) if log else
                    go.Bar(x=names, y=values, marker={"color": "#1565c0"}, hovertemplate=hover))
    if peak:
        fig.add_hline(y=peak, line={"color": "#c62828", "dash": "dash"}, annotation_text=f"peak {peak:g}")
    fig.update_layout(title={"text": title, "font": {"size": 14}}, height=320, template="plotly_white",
                      margin={"l": 60, "r": 20, "t": 50, "b": 70},
                      # The log axis padded past the dots so that each dot and its label stay in view.
                      yaxis={"title": axis, "type": "log", "showgrid": True,
                             "range": [math.log10(min(values)) - 0.2, math.log10(max(values)) + 0.25]}
                      if log and values else
                      {"title": axis, "type": "linear", "rangemode": "tozero"})
    return fig


def comparison_charts(rows: list[dict[str, Any]], peak_tflops: float | None) -> list[str]:
    """Charts of a run's comparison rows (compare.table_rows): one bar per variant that has the number."""
    go = _require_plotly()
    ok = [r for r in rows if r.get("status") == "ok"]
    gpu = any(r.get("gpu_ms") is not None for r in ok)
    time_key = "gpu_ms" if gpu else "event_ms"
    charts = [
        (time_key, f"{'GPU' if gpu else 'wall-clock'} ms per call (log scale, dots)", "ms", True, None),
        ("tflops", "achieved TFLOP/s" + (" against the device's peak" if peak_tflops else ""), "TFLOP/s", False,
         peak_tflops),
        ("kernels", "kernels per call", "kernels", False, None),
    ]
    out = []
    for key, title, axis, log, peak in charts:
        if any(r.get(key) is not None for r in ok):
            out.append(f"<div>{_figure_html(_bar(go, ok, key, title, axis, log, peak), f'chart-{key}')}</div>")
    return out


def _run_table(rows: list[dict[str, Any]], backward: bool) -> str:
    from attntrace.report.compare import headers

    titles = headers(backward)
    shown = [k for k in titles if k in ("variant", "status") or any(r.get(k) is not None for r in rows)]

    def cell(key: str, value: Any) -> str:
        if value is None:
            return "-"
        if key == "speedup":
            return f"{value:.2f}x"
        if isinstance(value, float):
            return f"{value:.3f}" if key.endswith("_ms") else f"{value:.4g}"
        return str(value)

    head = "".join(f"<th>{_esc(titles[k])}</th>" for k in shown)
    body = "".join("<tr>" + "".join(f"<td>{_esc(cell(k, r.get(k)))}</td>" for k in shown) + "</tr>" for r in rows)
    return f"<table class=\"comparison\"><tr>{head}</tr>{body}</table>"


def run_page(rows: list[dict[str, Any]], *, title: str, description: str = "", peak_tflops: float | None = None,
             backward: bool = False,
             report: dict[str, Any] | None = None, timelines: dict[str, dict[str, Any]] | None = None) -> str:
    """report.html of `attntrace run`: the comparison table and charts, then each trace as in lint_page."""
    _require_plotly()
    body = [f"<h1>{_esc(title)}</h1>"]
    if description:
        body.append(f"<p>{_esc(description)}</p>")
    body += [_run_table(rows, backward), *comparison_charts(rows, peak_tflops)]
    if report is not None:
        body += trace_sections(report, timelines or {}, file_names=True)
    return _page(title, body)



def run_report_page(run: dict[str, Any], linted: dict[str, Any] | None = None,
                    timelines: dict[str, dict[str, Any]] | None = None) -> str:
    """The page of `attntrace run` from its run.json data (compare.analyse_run): the comparison rows as table
    and charts, and the lint report of the traces it wrote (`linted`, with their timelines) when given."""
    _require_plotly()
    config, env = run.get("config", {}), run.get("environment", {})
    shape = config.get("shape", {})
    description = " | ".join(str(part) for part in (
        f"torch {env.get('torch')}", config.get("dtype"),
        f"B={shape.get('batch')} H={shape.get('heads')} S={shape.get('seq')} D={shape.get('head_dim')}",
        "causal" if config.get("causal") else "full", "fwd+bwd" if config.get("backward") else "fwd") if part)
    page = run_page(run.get("table", []), title=f"attntrace run on {env.get('gpu') or env.get('cpu') or 'CPU'}",
                    description=description, peak_tflops=run.get("peak_tflops"), backward=bool(config.get("backward")),
                    report=linted, timelines=timelines)
    return page
