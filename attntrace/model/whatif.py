"""What a fix saves in wall time: the replayed step minus the replayed step with the fix applied (model/replay.py's
Change), over the steady steps of each device. A saving is what leaves the critical path, so savings do not add:
several fixes together are one replay of their own."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl

from attntrace.model.critical_path import DATA_LOADING
from attntrace.model.replay import Change, Replay


@dataclass(frozen=True)
class WallSaving:
    """Per device: the step before and after the change (mean of the steady steps replayed without the profiler)."""
    device: int
    before_us: float
    after_us: float

    @property
    def saved_us(self) -> float:
        return max(0.0, self.before_us - self.after_us)


# Steady steps a what-if replays (and one before them as a lead-in).
WHATIF_STEPS = 3


def sample_steps(base: Replay) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """(the steps to replay, the steps to judge): up to WHATIF_STEPS steady steps from the middle of the run with
    the step before the first as a lead-in; every step, all judged (None), where there are too few to sample."""
    numbers = sorted(set(base.table["step"].to_list()))
    steady = sorted(set(base.steady["step"].to_list()))
    if len(numbers) <= WHATIF_STEPS + 1 or not steady:
        return tuple(numbers), None
    middle = len(steady) // 2
    chosen = steady[max(0, middle - WHATIF_STEPS // 2):][:WHATIF_STEPS]
    before = [n for n in numbers if n < chosen[0]]
    return tuple(([before[-1]] if before else []) + chosen), tuple(chosen)


def wall_savings(base: Replay, changed: Replay, judged: tuple[int, ...] | None = None) -> list[WallSaving]:
    """Each device's step before and after, over the base's steady steps (those in `judged` where given). Means,
    not medians: a fix can move work across a step boundary (the GPU's tail of one step ending in the next), which
    moves one step's median and leaves the sum whole."""
    steady = base.steady.select("step", "device", pl.col("est_step_us").alias("before"))
    if judged and steady["step"].is_in(list(judged)).any():
        steady = steady.filter(pl.col("step").is_in(list(judged)))
    after = changed.table.select("step", "device", pl.col("est_step_us").alias("after"))
    # A fix takes work away and never lengthens a step: where the replay's placement with the change comes out
    # longer (a dependency it reads from the recorded order), the step before bounds it, as the recorded step bounds
    # the replay without the profiler.
    joined = (steady.join(after, on=["step", "device"], how="inner")
              .with_columns(pl.min_horizontal("before", "after").alias("after")))
    means = joined.group_by("device").agg(pl.col("before").mean(), pl.col("after").mean()).sort("device")
    return [WallSaving(int(d), float(b), float(a)) for d, b, a in means.iter_rows()]


def describe(change: Change) -> str:
    """The change in words, as `whatif` and the findings name it."""
    parts: list[str] = []
    if change.drop_syncs is None or change.drop_syncs:
        parts.append("host syncs removed" if change.drop_syncs is None else f"{len(change.drop_syncs)} host sync "
                     "call(s) removed")
    if change.pin_copies is None or change.pin_copies:
        parts.append("pageable copies pinned and asynchronous")
    if change.speedup:
        parts.append(f"{len(change.speedup)} GPU kernel(s) sped up")
    if change.graph:
        parts.append("launches captured as CUDA graphs")
    if change.cpu_removed:
        parts.append("the data loader's wait taken off the path")
    return ", ".join(parts) or "no change"


def as_json(savings: list[WallSaving]) -> list[dict[str, Any]]:
    return [{"device": s.device, "before_us": round(s.before_us, 3), "after_us": round(s.after_us, 3),
             "saved_us": round(s.saved_us, 3)} for s in savings]


def loader_waits(trace: Any) -> tuple[tuple[float, float], ...]:
    """The recorded intervals the main thread spent getting the next batch from a data loader."""
    loaders = trace.ops.filter(pl.col("name").str.contains(DATA_LOADING.pattern))
    return tuple(sorted(zip(loaders["ts"].to_list(), loaders["end"].to_list(), strict=True)))


def is_speedup(factor: Any) -> bool:
    """Whether `factor` is a speed-up a what-if replays: a finite number of 1 or more (an int past a float's range
    is not)."""
    if isinstance(factor, bool) or not isinstance(factor, int | float):
        return False
    try:
        return math.isfinite(float(factor)) and factor >= 1
    except OverflowError:
        return False


def change_for(trace: Any, speedup: dict[str, float] | None = None, drop_syncs: bool = False,
               pin_copies: bool = False, graph: bool = False, offload_loader: bool = False) -> Change:
    """The Change that `attntrace whatif` asks for (trace: model.Trace): `speedup` maps a kernel class or group of
    rules/taxonomy.toml (`gemm_fp32_simt`, `attention_flash`, `elementwise`, ...) to how many times faster it runs."""
    factors: dict[int, float] = {}
    for name, factor in sorted((speedup or {}).items()):
        # Not NaN (it passed `<= 0` and gave a saving larger than infinity's) nor infinite, as on the command line;
        # not below 1 either: a slowdown was reported as "saves 0.000 ms", and 1e-310 (durations past a float's
        # range) as a saving of 93%.
        if not is_speedup(factor):
            shown = "an integer past a float's range" if isinstance(factor, int) and abs(factor) > 1e300 \
                else repr(factor)
            raise ValueError(f"speed-up of {name} must be a finite number of 1 or more (got {shown})")
        chosen = trace.gpu.filter((pl.col("cls") == name) | (pl.col("group") == name))
        factors.update(dict.fromkeys(chosen["idx"].to_list(), float(factor)))
    return Change(drop_syncs=None if drop_syncs else frozenset(), pin_copies=None if pin_copies else frozenset(),
                  speedup=tuple(sorted(factors.items())), graph=graph,
                  cpu_removed=loader_waits(trace) if offload_loader else ())


def kernel_classes(trace: Any) -> list[str]:
    """The kernel classes and groups present in the trace, as `--speedup` takes them."""
    kernels = trace.gpu.filter(pl.col("kind") == "kernel")
    return sorted({*kernels["cls"].drop_nulls().to_list(), *kernels["group"].drop_nulls().to_list()})
