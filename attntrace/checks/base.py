"""What every check gets (the trace, its rule, the parameters) and the one way it builds a finding."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import polars as pl

from attntrace.checks.catalog import DEFAULT_MIN_SAVING_SHARE, MIN_SAVING_SHARE, Rule, load_frameworks
from attntrace.model import Trace
from attntrace.model.identity import trace_label
from attntrace.model.replay import Change

ITEM_SIZE = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "bool": 1, "int": 4, "long int": 8,
             "short int": 2, "signed char": 1, "unsigned char": 1, "c10::Float8_e4m3fn": 1,
             "c10::Float8_e5m2": 1, "c10::complex<float>": 8}


# What an impact saves: GPU time (kernels that no longer run or run faster), idle removed (the step gets shorter
# because the GPU waits less), CPU time (the host does less; the step shrinks only where the CPU bounds it).
GPU_TIME, IDLE_REMOVED, CPU_TIME = "gpu time", "idle removed", "cpu time"


def significant(value: float, digits: int = 2) -> float:
    """`value` to `digits` significant figures: an estimate that rests on an assumed speed-up is no finer."""
    if not value or not math.isfinite(value):
        return 0.0
    return float(round(value, digits - 1 - math.floor(math.log10(abs(value)))))


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
    _means: dict[str, dict[int, float]] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def steps(self) -> pl.DataFrame:
        """Per-step, per-device numbers (Trace.step_table) of steady-state steps: graph captures left out."""
        return self.trace.steady_step_table

    @property
    def step_count(self) -> int:
        """Steps of one process, without graph captures."""
        return self.trace.step_count

    def steps_in(self, pids: Iterable[Any]) -> int:
        """The steps a finding's rows are counted over: every step of each process they ran in (a merged trace of
        two ranks whose copies only rank 0 makes is per step of rank 0, not over both ranks' steps; where both
        make them it is per step of a rank). Rows of no process that marked steps: the steps of one process."""
        counts = self.trace.steps_per_process
        chosen = {str(p) for p in pids if p is not None and str(p) in counts}
        return sum(counts[p] for p in chosen) if chosen else self.step_count

    def steps_of_ops(self, ops: Iterable[int | None]) -> int:
        """steps_in for rows found by their ops."""
        pids = self.trace.op_pids
        return self.steps_in(pids[op] for op in ops if op is not None)

    @cached_property
    def step_us(self) -> float:
        """The program's step, the denominator of every share of the step: the mean step replayed without the
        profiler's own cost (the slowest device's), else the slowest device's mean step as recorded. Over every
        step, as the rules' per-step times are (their sums over the steps, over the step count): a median of the
        steady steps left a slow first step's time in the numerator alone (shares of 500%). Not the recorded steps
        where a replay exists: they held the profiler's cost, and a verdict flipped between two captures of one
        program."""
        replayed = self.trace.replay
        calibration = self.trace.calibration
        if calibration is not None and not calibration.reached:
            # A measured step the replay could not be fitted to (model/measured.py) is the program's step.
            return max(calibration.measured_us, self._largest_device_mean("gpu_busy_us"))
        if not replayed.reason and replayed.table.height:
            # Over the steps that ran GPU work, as the per-step counts are (Trace.steps_per_process).
            return float(replayed.working.group_by("device").agg(pl.col("est_step_us").mean())["est_step_us"].max())
        return self._largest_device_mean("step_us")

    def _largest_device_mean(self, column: str) -> float:
        if not self.steps.height:
            return 0.0
        return float(self.steps.group_by("device").agg(pl.col(column).mean())[column].max())

    @property
    def gpu(self) -> pl.DataFrame:
        """GPU activity inside steady-state steps (not graph captures), linked to its launch and op."""
        return self.trace.steady_gpu

    @property
    def each_step(self) -> str:
        """How a per-step time reads: "per step", or "in the trace" when the trace shows no steps (it is then
        one window)."""
        return "per step" if self.trace.has_step_markers else "in the trace"

    @property
    def of_step_gpu(self) -> str:
        return "of step GPU time" if self.trace.has_step_markers else "of the trace's GPU time"

    def per_step(self, total: int, noun: str, plural: str | None = None, steps: int | None = None) -> str:
        """A count as people say it: "1 host sync per step", "2 host syncs in 3 steps", "2 ... in the trace"
        (over `steps`, Context.steps_in's count, else the steps of one process)."""
        return count_per_step(total, steps or self.step_count, self.trace.has_step_markers, noun, plural)

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

    def gpu_us_of(self, devices: Iterable[Any] = (), column: str = "gpu_busy_us") -> float:
        """Mean GPU time per step (`column` of the step table) of the devices a finding's rows ran on, the mean over
        them (its per-step time is over each one's steps, Context.steps_in); of the busiest device where none is
        known. In a merged trace of two ranks, one rank's fp32 GEMMs were 8% of the busier rank's compute and 65% of
        their own."""
        chosen = sorted({int(d) for d in devices if d is not None})
        if not chosen:
            return self._largest_device_mean(column)
        means = self._device_means(column)
        known = [means[d] for d in chosen if d in means]
        return float(pl.Series(known, dtype=pl.Float64).mean()) if known else self._largest_device_mean(column)

    def _device_means(self, column: str) -> dict[int, float]:
        """Each device's mean of a step-table column, once per column (a rule asks for each of its findings)."""
        cached = self._means.get(column)
        if cached is None:
            rows = self.steps.filter(pl.col("device").is_not_null()).group_by("device").agg(pl.col(column).mean())
            cached = self._means[column] = {int(d): float(m) for d, m in rows.iter_rows() if m is not None}
        return cached

    def share_of_gpu(self, us_per_step: float, devices: Iterable[Any] = ()) -> float:
        """A per-step GPU time's share of the GPU time per step of the devices it ran on (gpu_us_of), at most all of
        it: that is the union of the busy intervals, and kernels that overlap each other (streams side by side, or
        a trace whose kernels share one start) add up to more than the time they cover (a share of 539% was shown)."""
        gpu = self.gpu_us_of(devices)
        return min(1.0, us_per_step / gpu) if gpu else 0.0

    def wall_saving(self, change: Change, devices: Iterable[Any] = ()) -> float | None:
        """What the step loses in wall time with `change` (model/whatif.py): the largest saving over the devices given
        (all where none is), None where the steps cannot be replayed."""
        if self.trace.replay.reason:
            return None
        chosen = {int(d) for d in devices if d is not None}
        savings = [s.saved_us for s in self.trace.whatif(change) if not chosen or s.device in chosen]
        return max(savings) if savings else None

    def faster(self, kernels: Iterable[Any], factor: float, ops_gone: Iterable[int] = ()) -> Change:
        """The change that runs these GPU events (gpu-table idx) `factor` times faster (inf: they go), and takes the
        CPU time of `ops_gone` (op idx: ops the fix no longer runs) off the path."""
        spans: list[tuple[float, float]] = []
        ops = self.trace.ops
        for ts, end in sorted((float(ops["ts"][op]), float(ops["end"][op])) for op in set(ops_gone)):
            if spans and ts <= spans[-1][1]:  # nested or overlapping ops count once
                spans[-1] = (spans[-1][0], max(spans[-1][1], end))
            else:
                spans.append((ts, end))
        return Change(speedup=tuple(sorted((int(i), factor) for i in set(kernels))), cpu_removed=tuple(spans))

    def op_types(self, op: int | None) -> list[str]:
        if op is None:
            return []
        _, types, _ = self.trace.op_input(op)
        return [t for t in types or [] if isinstance(t, str)]

    def _framework_fix(self, op: int | None, variant: str | None = None) -> tuple[str, str] | None:
        """(framework, its fix for this rule) when the op's Python stack runs through a framework of
        rules/frameworks.toml that has one; for no op, when the trace's stacks do, or its ops name the framework
        (a compiled program recorded without with_stack is still compiled). A fix of the finding's variant
        ("RULE.variant", e.g. an SDPA call with a mask) comes before the rule's own."""
        files = self.trace.stack_files(op)
        ops = self.trace.ops["name"]
        for framework in load_frameworks():
            text = (variant and framework.fixes.get(f"{self.rule.id}.{variant}")) or framework.fixes.get(self.rule.id)
            if text is None:
                continue
            if any(framework.match.search(f) for f in files) or (
                    op is None and framework.ops is not None and ops.str.contains(framework.ops.pattern).any()):
                return framework.name, text
        return None

    def finding(self, *, key: str, message: str, where: dict[str, Any], evidence: dict[str, Any],
                gpu_us_per_step: float, fix: str, severity: str | None = None, op: int | None = None,
                device: int | None = None, saving: str = GPU_TIME, assumption: str | None = None,
                step_us: float | None = None, framework_fix: bool = True,
                fix_variant: str | None = None, identity_key: str | None = None,
                wall_us_per_step: float | None = None, whatif: str | None = None) -> dict[str, Any]:
        """A finding. Its `identity` hashes the rule and a key made of names only (op chain, kernel), never
        timings, so it survives re-captures of the same program; its `fingerprint` adds the trace's identity
        (model/identity.py), so that two traces' findings never share one. Baselines use the fingerprint, `diff`
        and `--group ranks` the identity within traces they pair.

        Its impact says what the fix saves per step (`saving`: GPU time, idle removed or CPU time) over which
        step (`step_us`, default the program's step without the profiler, Context.step_us; rules about one
        device's CPU-side time pass that device's), and the assumption it rests on, if any; an estimate that
        rests on one is rounded to two significant figures. Without an explicit severity, it is the rule's when
        the saving reaches the rule's min_saving_share of the step, else info: a warning promises a saving worth
        acting on. A framework's own fix (rules/frameworks.toml) comes first unless framework_fix is False (a
        finding that says there is nothing to fix); `fix_variant` picks a framework's fix for this kind of
        finding where it has one; `identity_key`, where given, makes the identity instead of `key` (a key part
        that tells findings of one trace apart but not the same cause on two ranks).

        `wall_us_per_step`, where the rule replayed its fix (Trace.whatif; `whatif` names the change), is what the
        step itself would lose: what leaves its critical path. The severity then follows it, not the GPU time.
        """
        keyed = hashlib.sha256(f"{self.rule.id}|{key}".encode()).hexdigest()[:16]
        identity = keyed if identity_key is None else \
            hashlib.sha256(f"{self.rule.id}|{identity_key}".encode()).hexdigest()[:16]
        label = self.trace.label or trace_label(self.trace.path, (), self.trace.meta.rank)
        digest = hashlib.sha256(f"{keyed}|{label}".encode()).hexdigest()[:16]
        source = self.trace.source_of(op)
        if source:
            where = {**where, "source": source}
        framework = self._framework_fix(op, fix_variant) if framework_fix else None
        if framework:
            name, text = framework
            where = {**where, "framework": name}
            fix = f"{text} In plain PyTorch: {fix}"
        if device is None and len(self.trace.devices) == 1:
            device = self.trace.devices[0]
        where = {**where, "device": device, "device_name": None if device is None else self.trace.device_name(device),
                 "rank": self.trace.meta.rank}
        denominator = self.step_us if step_us is None else step_us
        # A saving is at most the step: GPU time of kernels that overlap each other can add up to more (113% was
        # shown); the GPU time itself stays as it was counted.
        share = min(1.0, gpu_us_per_step / denominator) if denominator else 0.0
        wall_share = (min(1.0, wall_us_per_step / denominator) if denominator else 0.0) \
            if wall_us_per_step is not None else None
        if severity is None and wall_share is not None:
            severity = self.severity if wall_share >= self.params.get(MIN_SAVING_SHARE, DEFAULT_MIN_SAVING_SHARE) \
                else "info"
        if severity is None:
            worth = share >= self.params.get(MIN_SAVING_SHARE, DEFAULT_MIN_SAVING_SHARE)
            severity = self.severity if worth else "info"
        saved = significant(gpu_us_per_step) if assumption else round(gpu_us_per_step, 3)
        impact: dict[str, Any] = {"gpu_us_per_step": saved, "share_of_step": round(share, 4), "saving": saving,
                                  "step_us": round(denominator, 3), "assumption": assumption}
        if wall_us_per_step is not None:
            impact.update(wall_us_per_step=significant(wall_us_per_step) if wall_us_per_step >= 0.01 else 0.0,
                          wall_share_of_step=round(wall_share or 0.0, 4), whatif=whatif)
        return {
            "rule": self.rule.id,
            "name": self.rule.name,
            "severity": severity,
            "trace": self.trace.path,
            "message": message,
            "where": _round(where),
            "evidence": _round(evidence),
            "impact": impact,
            "fix": fix,
            "fingerprint": digest,
            "identity": identity,
        }


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


def steps_in(rows: Iterable[Mapping[str, Any]]) -> list[int]:
    """The steps of rows taken from a table (a frame built from them guessed each column's type from its first
    rows, and a value first set past them failed it)."""
    return sorted({int(r["step"]) for r in rows if r.get("step") is not None})


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def fmt_us(us: float) -> str:
    return f"{us / 1e3:.3f} ms" if us >= 1000 else f"{us:.1f} us"


def fmt_ms(us: float) -> str:
    """A span of time at the precision a step-level estimate has: "23.6 ms", "870 us"."""
    if us >= 10_000:
        return f"{us / 1e3:.0f} ms"
    if us >= 1000:
        return f"{us / 1e3:.1f} ms"
    return f"{us:.0f} us"
