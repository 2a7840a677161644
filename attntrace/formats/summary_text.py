"""`attntrace summary` as terminal tables."""

from __future__ import annotations

import re
import textwrap
from typing import Any

from tabulate import tabulate

from attntrace.formats.text import attention_text, width


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.3f}"


def summary_table(s: dict[str, Any]) -> str:
    share = s["tensor_core_share_of_gemm"]
    rank = f"   rank: {s['rank']}" if s.get("rank") is not None else ""
    prose = [
        f"  device: {_devices(s)}{rank}   steps: {_steps(s)}   "
        f"attention: {attention_text(s, [])}",
        f"  whole trace: GPU busy {_ms(s['gpu_busy_us'])} ms   kernels {s['kernels']}   memcpy {s['memcpy']}   "
        f"memset {s['memset']}   launches {s['launches']} ({_ms(s['launch_cpu_us'])} ms CPU)   "
        f"tensor-core share of GEMM time: {'-' if share is None else f'{100 * share:.0f}%'}",
        *(f"  note: {note}" for note in s["notes"]),
        *([f"  profiler: {profiler_line(s['profiler'])}"] if s.get("profiler") else []),
    ]
    lines = [f"{s['path']}", *(folded for line in prose for folded in _wrapped(line)),
             *(folded for line in critical_path_lines(s.get("critical_path"))
               for folded in _wrapped(line, parts=line.startswith("  critical path")))]
    if len(s["devices"]) > 1 or any(d["comm_us"] for d in s["devices"]):
        rows = [[d["device"], d["name"] or "-", d["streams"], _ms(d["gpu_busy_us"]), _ms(d["compute_us"]),
                 _ms(d["comm_us"]), _ms(d["overlap_us"])] for d in s["devices"]]
        table = tabulate(rows, headers=["device", "name", "streams", "GPU busy ms", "compute ms", "comm ms",
                                        "overlap ms"], tablefmt="simple", disable_numparse=True)
        lines.append("  " + table.replace("\n", "\n  "))
    if s["per_step"]:
        several = len({r["device"] for r in s["per_step"]}) > 1
        comm = any(r["comm_us"] for r in s["per_step"])
        replayed = any(r.get("est_step_us") is not None for r in s["per_step"])
        calibrated = any(r.get("calibrated_step_us") is not None for r in s["per_step"])
        rows = [[_step_label(r), *([r["device"]] if several else []), _ms(r["cpu_us"]),
                 *([_ms(r.get("recorded_step_us")), _ms(r.get("est_step_us")), _ms(r.get("profiler_cpu_us"))]
                   if replayed else []), *([_ms(r.get("calibrated_step_us"))] if calibrated else []),
                 _ms(r["gpu_busy_us"]), *([_ms(r["comm_us"]), _ms(r["overlap_us"])] if comm else []), r["kernels"],
                 r["memcpy"], r["memset"], r["launches"], _ms(r["launch_cpu_us"])] for r in s["per_step"]]
        headers = ["step", *(["device"] if several else []), "CPU ms",
                   *(["step ms as recorded", "est. ms w/o profiler", "profiler CPU ms"] if replayed else []),
                   *(["replay fitted to measured ms"] if calibrated else []),
                   "GPU busy ms",
                   *(["comm ms", "overlap ms"] if comm else []), "kernels", "memcpy", "memset", "launches",
                   "launch CPU ms"]
        table = tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)
        lines.append("  " + table.replace("\n", "\n  "))
    if s["top_kernels"]:
        names = distinct_short([k["name"] for k in s["top_kernels"]])
        rows = [[_ms(k["us"]), f"{100 * k['share']:.1f}%", k["count"], k["class"], _occupancy(k), name]
                for k, name in zip(s["top_kernels"], names, strict=True)]
        table = tabulate(rows, headers=["GPU ms", "share", "count", "class", "occupancy", "top kernels"],
                         tablefmt="simple", disable_numparse=True)
        lines.append("  " + table.replace("\n", "\n  "))
    return "\n".join(lines)


class _PartsWrapper(textwrap.TextWrapper):
    """Folds only where parts meet (three spaces apart): "gpu: copy 0.053 (8%)" is never cut in two."""

    wordsep_simple_re = re.compile(r"(\s{3,})")


def _wrapped(line: str, parts: bool = False) -> list[str]:
    """A sentence folded to the terminal's width (a profiler line ran to 370 columns), its tail indented under it;
    with `parts`, a list of parts folded between them."""
    wrapper = (_PartsWrapper if parts else textwrap.TextWrapper)(
        width(), subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
    return wrapper.wrap(line)


def _step_label(row: dict[str, Any]) -> str:
    """The step's number, marked * where it is one of the steady steps the profiler line's medians are over."""
    if row["step"] == -1:
        return "all"
    return f"{row['step']}{' *' if row.get('steady') else ''}"


def profiler_line(profiler: dict[str, Any]) -> str:
    """What recording cost: "record_shapes, with_stack (from the trace header); ~6.9 ms CPU per step: step 22.8 ms
    as recorded, ~16.0 ms estimated without the profiler (GPU busy 5.3 ms)"."""
    settings = profiler["settings"]
    on = [name for name in ("record_shapes", "with_stack", "profile_memory", "with_modules", "with_flops")
          if settings.get(name)]
    source = "trace header" if settings.get("source") == "header" else "events"
    text = f"{', '.join(on) or 'default settings'} (from the {source})"
    if profiler.get("est_step_us") is None:
        return f"{text}; no estimate without the profiler: {profiler.get('reason')}" + _measured_text(profiler)
    return (f"{text}; ~{_ms(profiler['cpu_us_per_step'])} ms CPU per step: step {_ms(profiler['recorded_step_us'])} ms "
            f"as recorded, ~{_ms(profiler['est_step_us'])} ms estimated without the profiler{_range(profiler)} "
            f"(GPU busy {_ms(profiler['gpu_busy_us'])} ms; medians of the steady steps, marked *, none shorter than "
            "the CPU time it needs)" + _measured_text(profiler))


def _range(profiler: dict[str, Any]) -> str:
    """", likely 20.1..27.3 ms (eager_stack: cost 0.63x..1.43x)": the estimate's range where nothing was measured."""
    found, spread = profiler.get("est_step_range_us"), profiler.get("est_spread")
    if not found or not spread:
        return ""
    low, high = spread["cost_ratio"]
    return (f", likely {_ms(found[0])}..{_ms(found[1])} ms (the profiler's cost {low:.2f}x..{high:.2f}x the "
            f"estimate's on calibration captures like it: {spread['label']})")


def _measured_text(profiler: dict[str, Any]) -> str:
    """The step measured without the profiler in the capturing run, beside the estimate and its error."""
    measured = profiler.get("measured")
    if not measured:
        return ""
    if profiler.get("measured_step_us") is None:
        return "; no step was timed without the profiler in the capturing run (a schedule with wait=0)"
    clock = "CUDA events" if measured.get("method") == "cuda_events" else "the host clock"
    text = (f"; {_ms(profiler['measured_step_us'])} ms measured without the profiler ({measured['steps']} steps, "
            f"{clock})")
    if profiler.get("est_error") is not None:
        text += f", the estimate {100 * profiler['est_error']:+.0f}% off it"
    calibration = profiler.get("calibration")
    if calibration:
        reached = "" if calibration["reached"] else ", as near as it comes"
        text += (f"; the rules judge the replay fitted to the measured step ({_ms(calibration['calibrated_step_us'])}"
                 f" ms, profiler costs x{calibration['scale']:.2f}{reached})")
    return text


def _occupancy(kernel: dict[str, Any]) -> str:
    """"13% (trace)" or "50% (computed)": the value and where it came from (the JSON's occupancy_source)."""
    pct = kernel.get("occupancy_pct")
    if pct is None:
        return "-"
    source = str(kernel.get("occupancy_source") or "")
    return f"{pct:.0f}% ({'computed' if source.startswith('computed') else 'trace'})"


def distinct_short(names: list[str], width: int = 90) -> list[str]:
    """Each name cut to `width` so that no two read the same: templated kernels that differ only near the end
    (a tile size, a dtype) keep their head and as much of their tail as tells them apart."""
    shown = [n if len(n) <= width else n[: width - 3] + "..." for n in names]
    for tail in range(10, width - 10, 6):
        clashes = {s for s in shown if shown.count(s) > 1}
        if not clashes:
            break
        shown = [n[: width - tail - 3] + "..." + n[-tail:] if s in clashes and len(n) > width else s
                 for n, s in zip(names, shown, strict=True)]
    return shown


def _devices(s: dict[str, Any]) -> str:
    if not s["device"]:
        return "none (CPU only)"
    if len(s["devices"]) > 1:
        names = sorted({d["name"] or "unknown GPU" for d in s["devices"]})
        return f"{len(s['devices'])} GPUs ({', '.join(names)})"
    return str(s["device"])


def _steps(s: dict[str, Any]) -> str:
    if not s["steps"]:
        return "none (whole trace)"
    if s.get("steps_source") == "inferred":
        return f"{s['steps']} (inferred from {s['steps_from']})"
    return str(s["steps"])


def critical_path_lines(path: dict[str, Any] | None) -> list[str]:
    """The critical path of the median steady step, per device, and the step with every replayable fix."""
    if not path:
        return []
    lines = []
    after = {d["device"]: d for d in path["all_fixes"]["devices"]}
    for device in path["devices"]:
        parts = "   ".join(f"{p['on']} {_ms(p['us'])} ({100 * p['share']:.0f}%)" for p in device["parts"][:6])
        lines.append(f"  critical path (device {device['device']}, {_ms(device['step_us'])} ms step without the "
                     f"profiler): {parts}")
        fixed = after.get(device["device"])
        if fixed:
            lines.append(f"  all fixes at once ({path['all_fixes']['change']}): {_ms(fixed['before_us'])} -> "
                         f"{_ms(fixed['after_us'])} ms per step (replayed; savings do not add)")
    return lines


INCOMPLETE_WHATIF = ("incomplete trace (cut off, read with --salvage): the steps replayed are those before the cut, "
                     "and the last of them may be cut short")


def whatif_text(result: dict[str, Any]) -> str:
    """`attntrace whatif`'s table: each device's step before and after, and its critical path both ways."""
    lines = [f"{result['path']}", f"  change: {result['change']}"]
    if result.get("incomplete"):
        lines.append(f"  {INCOMPLETE_WHATIF}")
    for device in result["devices"]:
        lines.append(f"  device {device['device']}: {_ms(device['before_us'])} -> {_ms(device['after_us'])} ms per "
                     f"step without the profiler (saves {_ms(device['saved_us'])} ms, replayed; mean of the steady "
                     "steps)")
    for label, paths in (("before", result["critical_path_before"]), ("after", result["critical_path_after"])):
        for path in paths:
            parts = "   ".join(f"{p['on']} {_ms(p['us'])} ({100 * p['share']:.0f}%)" for p in path["parts"][:6])
            lines.append(f"  critical path {label} (device {path['device']}): {parts}")
    return "\n".join(lines)
