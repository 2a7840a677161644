"""Which trace events a finding is about, and the span they cover in each step: for --annotate and the HTML
timeline. Findings name their events by op chain, kernel name and steps (`where`), so this resolves those
names against the model's tables rather than asking each check to return event ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from attntrace.model import Trace

CHAIN_SEP = " > "


@dataclass(frozen=True)
class Target:
    """One event a finding flags: a GPU kernel/copy/memset ("gpu") or a CPU op ("op")."""

    kind: str
    name: str
    pid: Any
    tid: Any
    ts: float
    end: float


@dataclass
class Span:
    """A finding in one step: the time its targets cover (the step's window when it names no events)."""

    finding: int  # index into the findings given to `resolve`
    step: int
    ts: float
    end: float
    targets: list[Target] = field(default_factory=list)


class _Resolver:
    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.gpu = trace.gpu_linked.filter(pl.col("step").is_not_null())
        self.ops = trace.ops_stepped
        self._by_name: dict[str, list[int]] | None = None
        self._position: dict[int, int] | None = None

    def ops_named(self, name: str) -> list[int]:
        if self._by_name is None:
            self._by_name = {}
            for idx, op_name in enumerate(self.trace.op_names):
                self._by_name.setdefault(op_name, []).append(idx)
        return self._by_name.get(name, [])

    def chain_ops(self, parts: list[str]) -> list[int]:
        """Ops whose chain from the outermost op is `parts` (nested), else runs of sibling ops named
        `parts` in order (a chain that describes a sequence, such as an unfused attention)."""
        nested = [op for op in self.ops_named(parts[-1]) if self.trace.op_chain(op) == parts]
        if nested or len(parts) < 2:
            return nested
        found: list[int] = []
        children = self.trace.op_children
        names = self.trace.op_names
        position = self.sibling_position()
        for first in self.ops_named(parts[0]):
            siblings = children.get(self.trace.op_parent[first], [])
            run = siblings[position[first]:position[first] + len(parts)]
            if [names[i] for i in run] == parts:
                found.extend(run)
        return sorted(set(found))

    def sibling_position(self) -> dict[int, int]:
        if self._position is None:
            self._position = {op: i for kids in self.trace.op_children.values() for i, op in enumerate(kids)}
        return self._position

    def descendants(self, roots: list[int]) -> set[int]:
        seen: set[int] = set()
        todo = list(roots)
        children = self.trace.op_children
        while todo:
            op = todo.pop()
            if op not in seen:
                seen.add(op)
                todo.extend(children.get(op, ()))
        return seen

    def targets(self, where: dict[str, Any], steps: set[int]) -> list[tuple[int, Target]]:
        kernel, chain = where.get("kernel"), where.get("op_chain")
        gpu = self.gpu.filter(pl.col("step").is_in(list(steps)))
        roots = self.chain_ops(chain.split(CHAIN_SEP)) if chain else []
        if kernel:
            gpu = gpu.filter(pl.col("name") == kernel)
        if chain:
            under = self.descendants(roots)
            gpu = gpu.filter(pl.col("op").is_in(list(under)))
        if not (kernel or chain):
            return []
        found = [(step, Target(kind, name, pid, tid, ts, end)) for step, kind, name, pid, tid, ts, end in
                 gpu.select("step", "kind", "name", "pid", "tid", "ts", "end").iter_rows()]
        if found or kernel:
            return found
        # No GPU work under the chain (a host sync, a CPU-side mask build): the CPU ops themselves.
        ops = self.ops.filter(pl.col("idx").is_in(roots) & pl.col("step").is_in(list(steps)))
        return [(step, Target("op", name, pid, tid, ts, end)) for step, name, pid, tid, ts, end in
                ops.select("step", "name", "pid", "tid", "ts", "end").iter_rows()]


def resolve(trace: Trace, findings: list[dict[str, Any]]) -> list[Span]:
    """One span per finding and step, in finding order then step order. Findings of other traces are
    passed over."""
    resolver = _Resolver(trace)
    windows = {step: (ts, end) for step, ts, end in trace.steps.select("step", "ts", "end").iter_rows()}
    spans: list[Span] = []
    for index, finding in enumerate(findings):
        if finding["trace"] != trace.path:
            continue
        where = finding.get("where") or {}
        steps = set(where.get("steps") or windows)
        by_step: dict[int, list[Target]] = {}
        for step, target in resolver.targets(where, steps):
            by_step.setdefault(step, []).append(target)
        if not by_step:  # a finding about whole steps (idle GPU, launch overhead)
            spans.extend(Span(index, step, *windows[step]) for step in sorted(steps) if step in windows)
            continue
        for step in sorted(by_step):
            targets = sorted(by_step[step], key=lambda t: (t.ts, t.end))
            spans.append(Span(index, step, min(t.ts for t in targets), max(t.end for t in targets), targets))
    return spans
