"""The HTML report's roofline (`traces[].roofline`): each op signature a point sized by its GPU time per step,
against the device's roofs. Left: ops with FLOPs (GEMM, convolution, attention) at their arithmetic intensity
and achieved TFLOP/s under min(peak, intensity x HBM) for each precision they ran in. Right: the ops modelled by
bytes at their achieved TB/s under the HBM roof. Needs plotly (the `html` extra), imported by the caller."""

from __future__ import annotations

import math
from typing import Any

CLASS_COLOURS = {"gemm": "#1565c0", "conv": "#6a1b9a", "attention": "#2e7d32", "elementwise": "#f9a825",
                 "reduction": "#00838f", "norm": "#8d6e63", "copy": "#ef6c00", "communication": "#5d4037",
                 "transfer": "#9e9e9e"}
ROOF_DASH = {"bf16": "solid", "fp16": "dot", "fp8": "dashdot", "tf32": "dash", "fp32": "longdash"}


def _size(us: float, largest: float) -> float:
    """Marker diameter in px: area proportional to time, 6 to 40 px."""
    return 6.0 + 34.0 * math.sqrt(us / largest) if largest > 0 else 6.0


def roofline_figure(roofline: dict[str, Any], title: str) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    device = roofline["device"]
    ops = [o for o in roofline["ops"] if o["us_per_step"] and o["us_per_step"] > 0]
    largest = max((o["us_per_step"] for o in ops), default=0.0)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.62, 0.38], horizontal_spacing=0.09,
                        subplot_titles=("ops with FLOPs: achieved TFLOP/s vs arithmetic intensity",
                                        "ops by bytes: achieved TB/s vs bytes per call"))
    with_flops = [o for o in ops if o.get("tflops") and o.get("intensity")]
    by_bytes = [o for o in ops if not o.get("tflops") and o.get("tbs")]
    intensities = [o["intensity"] for o in with_flops] or [1.0, 1000.0]
    lo, hi = min(intensities) / 4, max(intensities) * 4
    hbm = device.get("hbm_tbs")
    for precision in sorted({o["precision"] for o in with_flops if o["precision"]}):
        peak = device["tflops"].get(precision)
        if not peak or not hbm:
            continue
        ridge = peak / hbm  # FLOP/B where the memory roof meets the compute roof
        xs = [x for x in (lo, ridge, hi) if lo <= x <= hi] if lo < ridge < hi else [lo, hi]
        fig.add_trace(go.Scatter(x=xs, y=[min(peak, x * hbm) for x in xs], mode="lines",
                                 name=f"roof {precision} {peak:g} TFLOP/s, HBM {hbm:g} TB/s",
                                 line={"color": "#c62828", "dash": ROOF_DASH.get(precision, "solid"), "width": 2},
                                 hoverinfo="name"), row=1, col=1)
    for kind in sorted({o["class"] for o in ops}):
        panels = ((1, with_flops, "intensity", "tflops"), (2, by_bytes, "bytes_per_call", "tbs"))
        for col, group, x_key, y_key in panels:
            points = [o for o in group if o["class"] == kind]
            if not points:
                continue
            fig.add_trace(go.Scatter(
                x=[o[x_key] for o in points], y=[o[y_key] for o in points], mode="markers", name=kind,
                legendgroup=kind, showlegend=col == 1 or not any(o["class"] == kind for o in with_flops),
                marker={"size": [_size(o["us_per_step"], largest) for o in points],
                        "color": CLASS_COLOURS.get(kind, "#757575"), "opacity": 0.7,
                        "line": {"width": 1, "color": "#333"}},
                text=[f"{o['op']} {o['shape']} {o['precision'] or ''}<br>{o['us_per_step']:.1f} us/step, "
                      f"{100 * (o['share_of_bound'] or 0):.0f}% of its {o['bound'] or '?'} bound" for o in points],
                hovertemplate="%{text}<extra></extra>"), row=1, col=col)
    if hbm:
        fig.add_hline(y=hbm, line={"color": "#c62828", "width": 2}, annotation_text=f"HBM {hbm:g} TB/s",
                      row=1, col=2)
    fig.update_xaxes(type="log", title_text="FLOP per byte", row=1, col=1)
    fig.update_yaxes(type="log", title_text="TFLOP/s", row=1, col=1)
    # SI prefixes: plotly's default writes a billion bytes as "1B", which reads as one byte.
    fig.update_xaxes(type="log", title_text="bytes per call", exponentformat="SI", row=1, col=2)
    fig.update_yaxes(type="log", title_text="TB/s", row=1, col=2)
    mfu = roofline.get("mfu")
    fig.update_layout(title=f"{title}: MFU {'-' if mfu is None else f'{100 * mfu:.1f}%'}, coverage "
                            f"{100 * (roofline.get('coverage') or 0):.0f}% of GPU time (point area = GPU time)",
                      height=520, margin={"l": 60, "r": 20, "t": 80, "b": 50}, plot_bgcolor="white",
                      legend={"orientation": "h", "y": -0.18})
    fig.update_xaxes(gridcolor="#eee")
    fig.update_yaxes(gridcolor="#eee")
    return fig
