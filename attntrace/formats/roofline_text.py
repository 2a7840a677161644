"""`attntrace summary --ops`: the roofline (roofline.py) as terminal tables: MFU and coverage, op classes, top
ops, and the GPU time no model covers."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

TOP_OPS = 12


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.3f}"


def _indent(table: str) -> str:
    return "  " + table.replace("\n", "\n  ")


def roof_line(device: dict[str, Any]) -> str:
    if not device.get("device"):
        return "roofs: unknown device (add it to attntrace/peaks.toml): no bound, MFU or share of peak"
    sheet = device.get("datasheet_tflops") or {}
    roofs = ", ".join(f"{p} {v:g}" + (f" (measured; datasheet {sheet[p]:g})" if sheet.get(p) not in (None, v) else "")
                      for p, v in device["tflops"].items())
    measured = f"; measured: {device['measured_source']}" if device.get("measured_source") else ""
    return (f"roofs: {device['device']}: {roofs} TFLOP/s, HBM {_num(device.get('hbm_tbs'), 'g')} TB/s "
            f"({device.get('source') or 'datasheet'}{measured})")


def roofline_tables(roofline: dict[str, Any] | None) -> str:
    if roofline is None:
        return "  roofline: no GPU work in the trace"
    lines = [f"  {roof_line(roofline['device'])}"]
    if roofline.get("mfu_peak_tflops"):
        peak = f"{roofline['mfu_precision']} {roofline['mfu_peak_tflops']:g} TFLOP/s datasheet peak"
        lines.append(f"  MFU {_pct(roofline['mfu'])} (~{_pct(roofline.get('mfu_est'))} of the step estimated without "
                     f"the profiler)   HFU {_pct(roofline['hfu'])}   against the {peak}; medians of steady steps")
    else:
        lines.append("  MFU -: no FLOPs modelled, or no peak for their precision on this device")
    lines.append(f"  coverage: {_pct(roofline['coverage'])} of GPU time has a model (FLOPs or bytes)")
    rows = [[c["class"], _ms(c["us_per_step"]), _pct(c["share_of_gpu"]), _num(c.get("tflops"), ".1f"),
             _num(c.get("tbs"), ".2f"), _num(c.get("intensity"), ".1f"), _pct(c.get("share_of_bound")),
             _ms(c.get("headroom_us"))] for c in roofline["classes"]]
    lines.append(_indent(tabulate(rows, headers=["op class", "GPU ms/step", "share", "TFLOP/s", "TB/s", "FLOP/B",
                                                 "of bound", "headroom ms"], tablefmt="simple",
                                  disable_numparse=True)))
    rows = [[_short(o["op"]), o["shape"], o["precision"] or "-", _num(o["calls_per_step"], "g"),
             _ms(o["us_per_step"]), _num(o.get("tflops"), ".1f"), _num(o.get("tbs"), ".2f"), o["bound"] or "-",
             _pct(o.get("share_of_bound")), _ms(o.get("headroom_us"))] for o in roofline["ops"][:TOP_OPS]]
    if rows:
        lines.append(_indent(tabulate(rows, headers=["top ops", "shape", "dtype", "calls/step", "GPU ms/step",
                                                     "TFLOP/s", "TB/s", "bound", "of bound", "headroom ms"],
                                      tablefmt="simple", disable_numparse=True)))
    rows = [[_short(u["op"]), _ms(u["us_per_step"]), _pct(u["share_of_gpu"]), u["reason"]]
            for u in roofline["unmodelled"]]
    if rows:
        lines.append(_indent(tabulate(rows, headers=["unmodelled", "GPU ms/step", "share", "why"],
                                      tablefmt="simple", disable_numparse=True)))
    return "\n".join(lines)


def _short(name: str, width: int = 48) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."
