"""The HTML report rendered in a real browser (headless Chromium): charts drawn, one mark per kernel class or
variant, no script errors, nothing fetched from the network."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import SAMPLES, sample

pytest.importorskip("plotly", reason="the html extra (plotly) is not installed")

from attntrace import api
from attntrace.cli import main
from attntrace.formats import html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# CI installs Chromium (.ci/run): there a missing browser is a failure, not a skip.
needs_browser = pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                                   reason="chromium is not installed (apt-get install chromium)")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  # No name resolves: the charts must draw offline.
                  "--host-resolver-rules=MAP * ~NOTFOUND"]
# Installed before the page's own scripts: records uncaught errors in the DOM that --dump-dom prints.
ERROR_TRAP = ("<script>window.__errors=[];function __keep(m){document.documentElement.setAttribute("
              "'data-errors',JSON.stringify(window.__errors.concat([m])));window.__errors.push(m)}"
              "window.addEventListener('error',function(e){__keep(String(e.message))});"
              "window.addEventListener('unhandledrejection',function(e){__keep(String(e.reason))});</script>")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Figures(HTMLParser):
    """Per plotly figure (a div with an id): its bar traces, bar marks, legend labels; and the page's errors."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, str | None, str]] = []  # (tag, figure id, class)
        self.figures: dict[str, dict[str, list]] = {}
        self.errors: list[str] = []
        self.svg = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "html" and a.get("data-errors"):
            self.errors = orjson.loads(a["data-errors"])
        cls = a.get("class") or ""
        figure = self.stack[-1][1] if self.stack else None
        if tag == "div" and "plotly-graph-div" in cls and a.get("id"):
            figure = a["id"]
            self.figures[figure] = {"bar_traces": [], "dot_traces": [], "legend": [], "points": []}
        if figure and tag == "g" and cls == "trace bars":
            self.figures[figure]["bar_traces"].append(0)
        if figure and tag == "g" and cls == "point" and self.figures[figure]["bar_traces"]:
            self.figures[figure]["bar_traces"][-1] += 1
        if figure and tag == "g" and cls.startswith("trace scatter"):
            self.figures[figure]["dot_traces"].append(0)
        if figure and tag == "path" and cls == "point" and self.figures[figure]["dot_traces"]:
            self.figures[figure]["dot_traces"][-1] += 1
        if figure and tag == "text" and cls == "legendtext":
            self.figures[figure]["legend"].append(a.get("data-unformatted"))
        if tag == "svg":
            self.svg += 1
        if tag not in VOID:
            self.stack.append((tag, figure, cls))

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop()[0] == tag:
                break


def render(page: str, tmp: Path) -> Figures:
    assert CHROMIUM, "chromium is not installed"
    assert "<script src=" not in page and "<link " not in page  # self-contained: no script or style to fetch
    file = tmp / "page.html"
    file.write_text(page.replace("<head>", "<head>" + ERROR_TRAP, 1), encoding="utf-8")
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=10000",
                               "--dump-dom", file.as_uri()], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = Figures()
    figures.feed(done.stdout)
    return figures


@needs_browser
def test_lint_page_draws_a_timeline_with_a_mark_per_kernel_class(tmp_path: Path):
    report = api.lint([sample("bf16_causal_fwd/naive"), sample("bf16_causal_fwd/sdpa_math")])
    dom = render(report.to_html(), tmp_path)
    assert dom.errors == []
    assert set(dom.figures) == {"timeline-0", "timeline-1", "roofline-0", "roofline-1"}
    for n, trace in enumerate(report.traces):
        timeline = report.timelines[trace.path]
        rules = sorted({f["rule"] for s in timeline["steps"] for f in s["flagged"]})
        expected = timeline["groups"] + [f"flagged: {r}" for r in rules]
        figure = dom.figures[f"timeline-{n}"]
        assert figure["legend"] == expected
        # One bar trace per kernel class and per rule, and every merged span and flagged span drawn.
        assert len(figure["bar_traces"]) == len(expected)
        spans = [sum(1 for s in timeline["steps"] for seg in s["segments"] if seg["group"] == g)
                 for g in timeline["groups"]]
        flagged = [sum(1 for s in timeline["steps"] for f in s["flagged"] if f["rule"] == r) for r in rules]
        assert figure["bar_traces"] == spans + flagged
    assert {"copies", "elementwise", "GEMM tensor-core", "idle"} <= set(dom.figures["timeline-0"]["legend"])
    assert "GEMM FP32" in dom.figures["timeline-1"]["legend"]  # sdpa_math's upcast GEMMs


@needs_browser
def test_run_page_charts_one_bar_per_variant(tmp_path: Path):
    run_dir = tmp_path / "run"
    shutil.copytree(SAMPLES / "bf16_causal_fwd", run_dir)
    run = orjson.loads((run_dir / "run.json").read_bytes())
    page = api.write_run_report(run_dir, run).read_text()
    dom = render(page, tmp_path)
    assert dom.errors == []
    ok = [r for r in run["table"] if r["status"] == "ok"]
    # Time on a log scale is dots (a bar's length there would start wherever the axis does); counts and
    # throughput are bars on linear axes from zero.
    assert dom.figures["chart-gpu_ms"]["dot_traces"] == [len(ok)] and dom.figures["chart-gpu_ms"]["bar_traces"] == []
    for chart in ("chart-tflops", "chart-kernels"):
        assert dom.figures[chart]["bar_traces"] == [len(ok)], chart
    assert page.count('"rangemode":"tozero"') == 2
    assert len([f for f in dom.figures if f.startswith("timeline-")]) == len(ok)
    # Each trace is headed by its file name: the output folder's path (a temporary one here) said nothing.
    assert "<h2>naive.pt.trace.json.gz</h2>" in page and f"<h2>{tmp_path}" not in page


@needs_browser
def test_cpu_run_writes_a_report_page(tmp_path: Path):
    pytest.importorskip("torch")
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", "--device", "cpu", "--variants", "naive,sdpa", "--seq", "32", "--batch",
                                       "1", "--heads", "1", "--steps", "1", "--warmup", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    dom = render((out / "report.html").read_text(), tmp_path)
    assert dom.errors == []
    # On the CPU there are no kernels: time is wall-clock, one dot per variant (log scale).
    assert dom.figures["chart-event_ms"]["dot_traces"] == [2]


def test_lint_format_html_is_one_offline_file(tmp_path: Path):
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["lint", sample("bf16_causal_fwd/naive"), "--format", "html", "-o", str(out)])
    assert result.exit_code == 1  # naive has warnings: the exit code does not depend on the format
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "Plotly" in page and "<script src=" not in page
    assert "AT102" in page and "scaled_dot_product_attention" in page  # a cause and its fix
    assert "also removes (counted in it):<ul><li><b>AT101 hidden-copy" in page  # its consequence, inside it
    # The attention line says what AT102 found, as the terminal does ("none found" beside it contradicted it).
    assert "<td>attention</td><td>unfused (AT102)</td>" in page


def test_a_rule_has_one_colour_on_every_trace_and_none_is_a_kernel_classs():
    assert not set(html.RULE_COLOURS.values()) & set(html.COLOURS.values())
    report = api.lint([sample("bf16_causal_fwd/naive"), sample("fp32_causal_fwd/naive")])
    colours = {}
    for trace in report.traces:
        figure = html.timeline_figure(report.timelines[trace.path], "t")
        for bar in figure.data:
            if bar.name.startswith("flagged: "):
                colours.setdefault(bar.name, set()).add(bar.marker.color)
    assert colours and all(len(c) == 1 for c in colours.values())
    page = report.to_html()
    assert "tensor-core share of GEMM time</td><td>100%" in page  # a share as a percentage, not 1.0


def test_lint_page_says_what_the_baseline_says(tmp_path: Path):
    # The page had no word of a baseline: neither which findings were new nor what had been fixed.
    naive, math = sample("bf16_causal_fwd/naive"), sample("bf16_causal_fwd/sdpa_math")
    baseline = tmp_path / "baseline.json"
    runner = CliRunner()
    assert runner.invoke(main, ["lint", naive, "--write-baseline", str(baseline), "--fail-on", "never"]).exit_code == 0
    out = tmp_path / "report.html"
    result = runner.invoke(main, ["lint", naive, math, "--baseline", str(baseline), "--format", "html", "-o", str(out),
                                  "--fail-on", "never"])
    assert result.exit_code == 0, result.output
    report = api.lint([naive, math], baseline=str(baseline))
    counts = report.to_dict()["baseline"]
    page = out.read_text()
    assert (f"baseline <code>{baseline}</code>: {counts['new']} new, {counts['known']} known, "
            f"{len(counts['fixed'])} fixed") in page
    assert page.count("(known)</span>") == counts["known"] > 0 and page.count("(new)</span>") == counts["new"] > 0
