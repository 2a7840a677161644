"""`attntrace summary` as terminal tables."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.3f}"


def summary_table(s: dict[str, Any]) -> str:
    share = s["tensor_core_share_of_gemm"]
    lines = [
        f"{s['path']}",
        f"  device: {s['device'] or 'none (CPU only)'}   steps: {s['steps'] or 'none (whole trace)'}   "
        f"attention: {', '.join(s['attention_backends']) or 'none found'}",
        f"  whole trace: GPU busy {_ms(s['gpu_busy_us'])} ms   kernels {s['kernels']}   memcpy {s['memcpy']}   "
        f"memset {s['memset']}   launches {s['launches']} ({_ms(s['launch_cpu_us'])} ms CPU)   "
        f"tensor-core share of GEMM time: {'-' if share is None else f'{100 * share:.0f}%'}",
    ]
    lines.extend(f"  note: {note}" for note in s["notes"])
    if s["per_step"]:
        rows = [[r["step"] if r["step"] != -1 else "all", _ms(r["cpu_us"]), _ms(r["gpu_busy_us"]), r["kernels"],
                 r["memcpy"], r["memset"], r["launches"], _ms(r["launch_cpu_us"])] for r in s["per_step"]]
        table = tabulate(rows, headers=["step", "CPU ms", "GPU busy ms", "kernels", "memcpy", "memset",
                                        "launches", "launch CPU ms"], tablefmt="simple", disable_numparse=True)
        lines.append("  " + table.replace("\n", "\n  "))
    if s["top_kernels"]:
        rows = [[_ms(k["us"]), f"{100 * k['share']:.1f}%", k["count"], k["class"], _short(k["name"])]
                for k in s["top_kernels"]]
        table = tabulate(rows, headers=["GPU ms", "share", "count", "class", "top kernels"], tablefmt="simple",
                         disable_numparse=True)
        lines.append("  " + table.replace("\n", "\n  "))
    return "\n".join(lines)


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."
