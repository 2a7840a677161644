"""What every check gets (the trace, its rule, the parameters) and the one way it builds a finding."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import PurePath
from typing import Any

import polars as pl

from attntrace.catalog import Rule
from attntrace.model import Trace

ITEM_SIZE = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "bool": 1, "int": 4, "long int": 8,
             "short int": 2, "signed char": 1, "unsigned char": 1, "c10::Float8_e4m3fn": 1,
             "c10::Float8_e5m2": 1, "c10::complex<float>": 8}


class Skip(Exception):
    """The trace lacks what the rule needs; the rule reports why instead of guessing."""


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_round(v) for v in value]
    return value


@dataclass
class Context:
    trace: Trace
    rule: Rule
    params: dict[str, Any]
    severity: str

    @cached_property
    def steps(self) -> pl.DataFrame:
        """Per-step, per-device numbers (Trace.step_table) of steady-state steps: graph captures left out."""
        return self.trace.step_table.filter(~pl.col("capture"))

    @property
    def step_count(self) -> int:
        """Steps of one process, without graph captures: counts "per step" divide by this."""
        return self.trace.step_count

    @cached_property
    def step_us(self) -> float:
        return float(self.steps["step_us"].mean()) if self.steps.height else 0.0

    @cached_property
    def step_gpu_us(self) -> float:
        return float(self.steps["gpu_busy_us"].mean()) if self.steps.height else 0.0

    @cached_property
    def gpu(self) -> pl.DataFrame:
        """GPU activity inside steady-state steps (not graph captures), linked to its launch and op."""
        return self.trace.gpu_linked.filter(pl.col("step").is_in(self.trace.steady_steps))

    @property
    def each_step(self) -> str:
        """How a per-step time reads: "per step", or "in the trace" when the trace shows no steps (it is then
        one window)."""
        return "per step" if self.trace.has_step_markers else "in the trace"

    @property
    def of_step_gpu(self) -> str:
        return "of step GPU time" if self.trace.has_step_markers else "of the trace's GPU time"

    def per_step(self, total: int, noun: str, plural: str | None = None) -> str:
        """A count as people say it: "1 host sync per step", "2 host syncs in 3 steps", "2 ... in the trace"."""
        return count_per_step(total, self.step_count, self.trace.has_step_markers, noun, plural)

    def gpu_under(self, ops: set[int]) -> pl.DataFrame:
        """GPU activity in steps launched by any of `ops` or by ops nested in them; `under` names which."""
        # Walk down from the given ops (few) rather than up from every GPU event (many).
        owner: dict[int, int] = {}
        children = self.trace.op_children
        for root in sorted(ops):
            todo = [root]
            while todo:
                op = todo.pop()
                owner.setdefault(op, root)
                todo.extend(children.get(op, ()))
        mapping = pl.DataFrame({"op": list(owner), "under": list(owner.values())},
                               schema={"op": pl.Int64, "under": pl.Int64})
        return self.gpu.with_columns(pl.col("op").cast(pl.Int64)).join(mapping, on="op", how="inner").sort("idx")

    def share_of_gpu(self, us_per_step: float) -> float:
        return us_per_step / self.step_gpu_us if self.step_gpu_us else 0.0

    def op_types(self, op: int | None) -> list[str]:
        if op is None:
            return []
        _, types, _ = self.trace.op_input(op)
        return [t for t in types or [] if isinstance(t, str)]

    def finding(self, *, key: str, message: str, where: dict[str, Any], evidence: dict[str, Any],
                gpu_us_per_step: float, fix: str, severity: str | None = None, op: int | None = None,
                device: int | None = None) -> dict[str, Any]:
        """A finding. The fingerprint hashes the rule, the trace's file name and a key made of names only
        (op chain, kernel), never timings, so it survives re-captures of the same program."""
        digest = hashlib.sha256(f"{self.rule.id}|{trace_label(self.trace.path)}|{key}".encode()).hexdigest()[:16]
        source = self.trace.source_of(op)
        if source:
            where = {**where, "source": source}
        if device is None and len(self.trace.devices) == 1:
            device = self.trace.devices[0]
        where = {**where, "device": device, "device_name": None if device is None else self.trace.device_name(device),
                 "rank": self.trace.meta.rank}
        return {
            "rule": self.rule.id,
            "name": self.rule.name,
            "severity": severity or self.severity,
            "trace": self.trace.path,
            "message": message,
            "where": _round(where),
            "evidence": _round(evidence),
            "impact": {"gpu_us_per_step": round(gpu_us_per_step, 3),
                       "share_of_step": round(gpu_us_per_step / self.step_us, 4) if self.step_us else 0.0},
            "fix": fix,
            "fingerprint": digest,
        }


def trace_label(path: str) -> str:
    """The trace's file name without extensions and with digit runs folded, so that re-captures of one
    program (tensorboard_trace_handler names files {worker}.{time_ns}.pt.trace.json) share fingerprints."""
    name = PurePath(path).name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        name = name.removesuffix(suffix)
    return re.sub(r"\d+", "#", name)


def count_per_step(total: int, steps: int, has_steps: bool, noun: str, plural: str | None = None) -> str:
    def things(n: int) -> str:
        return f"{n} {noun if n == 1 else plural or noun + 's'}"

    if not has_steps:
        return f"{things(total)} in the trace"
    if steps <= 1 or total % steps == 0:
        return f"{things(total // max(steps, 1))} per step"
    return f"{things(total)} in {steps} steps"


def steps_of(frame: pl.DataFrame) -> list[int]:
    return sorted(int(s) for s in frame["step"].unique().to_list() if s is not None)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def fmt_us(us: float) -> str:
    return f"{us / 1e3:.3f} ms" if us >= 1000 else f"{us:.1f} us"
