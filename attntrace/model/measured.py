"""The step without the profiler as measured in the same run, read from the trace's metadata, and the replay
calibrated to it.

`attntrace.profile` (and `attntrace run`, which captures through it) times the steps the schedule runs with the
profiler off and writes them under MEASURED_KEY (the contract is in README, "Measured, not modelled"). Where a trace
has them, the program's step is that measurement, not the replay's estimate: the replay's per-event costs are scaled
until its step matches the measured one (a few replays, bisection on one factor), so that the idle, launch and sync
figures the rules take from the replay are those of the measured step.
"""

from __future__ import annotations

import functools
import math
import statistics
import tomllib
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from attntrace.model.replay import COST_NAMES, STEADY_RATIO, ProfilerCosts, Replay, replay

MEASURED_KEY = "attntrace_measured"
METHODS = ("cuda_events", "host_clock")
# A step past this is a broken writer (the model's own limit on durations, 28 hours).
MAX_STEP_US = 1e11
# The calibration: the factor on the per-event costs is searched in [0, MAX_SCALE], with at most MAX_REPLAYS replays,
# until the replayed step is within TOLERANCE of the measured one. The largest miss of the estimate on record was
# +61% (issue 40: mixture-of-experts training with stacks), which a factor of about 2 on the costs closes.
MAX_SCALE = 4.0
MAX_REPLAYS = 8
TOLERANCE = 0.01


@dataclass(frozen=True)
class Measured:
    """The steps timed in the capturing run: without the profiler (the schedule's skip_first and wait steps) and
    with it (the active steps, the trace's ProfilerStep#N), in microseconds."""
    unprofiled_us: tuple[float, ...]
    unprofiled_steps: tuple[int, ...]
    profiled_us: tuple[float, ...]
    method: str  # cuda_events (GPU-side, off steps) or host_clock
    version: int
    settings: dict[str, Any]

    @property
    def steady_unprofiled_us(self) -> list[float]:
        """The un-profiled steps at the program's steady pace: within STEADY_RATIO of the shortest, as the replay
        picks its steady steps (the first steps of a program compile, tune and allocate)."""
        if not self.unprofiled_us:
            return []
        shortest = min(self.unprofiled_us)
        return [us for us in self.unprofiled_us if us <= STEADY_RATIO * shortest]

    @property
    def step_us(self) -> float | None:
        """The measured step without the profiler: the median of the steady un-profiled steps."""
        steady = self.steady_unprofiled_us
        return float(statistics.median(steady)) if steady else None

    @property
    def profiled_step_us(self) -> float | None:
        return float(statistics.median(self.profiled_us)) if self.profiled_us else None

    def as_json(self) -> dict[str, Any]:
        return {"step_us": _r(self.step_us), "steps": len(self.steady_unprofiled_us),
                "unprofiled_steps_timed": len(self.unprofiled_us), "method": self.method,
                "profiled_step_us": _r(self.profiled_step_us), "version": self.version}


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _numbers(value: Any, name: str) -> list[float]:
    if value is None:
        return []
    ok = isinstance(value, list) and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 < v <= MAX_STEP_US
        for v in value)
    if not ok:
        raise ValueError(f"{name} is not a list of step times in microseconds")
    return [float(v) for v in value]


def read(value: Any) -> tuple[Measured | None, str | None]:
    """The measurement in a trace's metadata (None when there is none) and a note when it is there but unusable
    (the trace is then linted as one without it)."""
    if value is None:
        return None, None
    try:
        if not isinstance(value, dict):
            raise ValueError("it is not an object")
        version = value.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError("its version is not a positive integer")
        unprofiled = _numbers(value.get("unprofiled_step_us"), "unprofiled_step_us")
        profiled = _numbers(value.get("profiled_step_us"), "profiled_step_us")
        steps = value.get("unprofiled_steps")
        steps = steps if isinstance(steps, list) and all(isinstance(s, int) and not isinstance(s, bool)
                                                         and abs(s) < 2**63 for s in steps) else []
        method = value.get("method") if value.get("method") in METHODS else "host_clock"
        settings = value.get("settings") if isinstance(value.get("settings"), dict) else {}
    except ValueError as exc:
        return None, f"{MEASURED_KEY} in the trace's metadata ignored: {exc}"
    return Measured(tuple(unprofiled), tuple(steps), tuple(profiled), method, version, settings), None


@dataclass(frozen=True)
class Calibration:
    """The replay fitted to the measured step: its per-event costs times `scale`."""
    measured_us: float  # the measured step without the profiler
    estimated_us: float  # the replay's step before calibration (the estimate a trace without a measurement gets)
    calibrated_us: float  # the replay's step after it
    scale: float  # the factor on the per-event costs (already scaled to the trace's host) that fits
    replays: int
    replay: Replay
    device: int

    @property
    def reached(self) -> bool:
        """The replay could be brought to the measured step (it cannot where the measured step is longer than the
        step as recorded, or shorter than the GPU's work: the host moved between the timing and the capture)."""
        return abs(self.calibrated_us - self.measured_us) <= 2 * TOLERANCE * self.measured_us

    @property
    def estimate_error(self) -> float:
        """How far the estimate without a measurement was off: (estimated - measured) / measured."""
        return (self.estimated_us - self.measured_us) / self.measured_us


def busiest_step(result: Replay) -> tuple[int, float] | None:
    """(device, median steady step) of the busiest device, as summary gives the step: None without a replay."""
    if result.reason:
        return None
    per_device = result.per_device()
    if not per_device.height:
        return None
    row = per_device.sort(["gpu_busy_us", "device"], descending=[True, False]).row(0, named=True)
    return int(row["device"]), float(row["est_step_us"])


def scaled(costs: ProfilerCosts, factor: float) -> ProfilerCosts:
    """Every per-event cost times `factor`; the host reference stays, so replay() still scales to the trace's host."""
    return replace(costs, **{name: getattr(costs, name) * factor for name in COST_NAMES})


def calibrate(trace: Any, costs: ProfilerCosts, estimate: Replay, measured_us: float) -> Calibration | None:
    """The replay whose step matches `measured_us` (trace: model.Trace; estimate: its replay with `costs`), by
    bisection (regula falsi) on a factor on the costs: more cost taken away, a shorter step. None without a replay."""
    first = busiest_step(estimate)
    if first is None:
        return None
    device, estimated = first

    def step_at(factor: float) -> tuple[float, Replay]:
        result = replay(trace, scaled(costs, factor))
        found = busiest_step(result)
        return (found[1] if found else estimated), result

    tried: list[tuple[float, float, Replay]] = [(1.0, estimated, estimate)]
    if abs(estimated - measured_us) > TOLERANCE * measured_us:
        # The other end of the bracket: no profiler cost at all (the step as recorded) or MAX_SCALE times it.
        edge = MAX_SCALE if estimated > measured_us else 0.0
        tried.append((edge, *step_at(edge)))
        low, high = sorted(tried[:2], key=lambda t: t[0])  # low factor: the longer step
        if (low[1] - measured_us) * (high[1] - measured_us) < 0:
            while len(tried) < MAX_REPLAYS:
                # Regula falsi between the bracket's ends, kept off them so that a flat end cannot stall it.
                span = low[1] - high[1]
                share = (low[1] - measured_us) / span if span else 0.5
                factor = low[0] + min(0.9, max(0.1, share)) * (high[0] - low[0])
                step, result = step_at(factor)
                tried.append((factor, step, result))
                if abs(step - measured_us) <= TOLERANCE * measured_us:
                    break
                if step > measured_us:
                    low = (factor, step, result)
                else:
                    high = (factor, step, result)
    factor, step, result = min(tried, key=lambda t: (abs(t[1] - measured_us), t[0]))
    return Calibration(measured_us=measured_us, estimated_us=estimated, calibrated_us=step, scale=round(factor, 4),
                       replays=len(tried), replay=result, device=device)


def calibration_json(calibration: Calibration | None) -> dict[str, Any] | None:
    if calibration is None:
        return None
    return {"scale": calibration.scale, "replays": calibration.replays, "reached": calibration.reached,
            "estimated_step_us": _r(calibration.estimated_us), "calibrated_step_us": _r(calibration.calibrated_us),
            "estimate_error": round(calibration.estimate_error, 4), "device": calibration.device}


def measured_pace(calibration: Calibration | None, device: int, step_us: float, idle_us: float,
                  gpu_busy_us: float) -> tuple[float, float]:
    """A device's step and idle without the profiler as the rules judge them (step_us, idle_us: the replay's
    medians): the replay's, unless a step was measured on this device's process that the replay could not be
    brought to (a step as recorded longer than the profiler's cost explains, or a host that moved between the
    timing and the capture). Then the measured step, no shorter than the GPU's work, with what is left of it idle."""
    if calibration is None or calibration.reached or device != calibration.device:
        return step_us, idle_us
    step = max(calibration.measured_us, gpu_busy_us)
    return step, step - gpu_busy_us


@dataclass(frozen=True)
class Spread:
    """How far off the estimate's profiler cost was on the calibration captures of one kind (compiled or eager, with
    or without stacks): the true cost over the cost the replay took away, its quartiles (the central half)."""
    group: str
    cost_ratio_low: float
    cost_ratio_high: float
    captures: int

    @property
    def label(self) -> str:
        """"eager, with stacks" or "compiled, without stacks": the kind of capture, as messages say it."""
        kind, _, stack = self.group.partition("_")
        return f"{kind}, {'without' if stack == 'no_stack' else 'with'} stacks"

    def step_range(self, est_step_us: float, profiler_us: float, gpu_busy_us: float) -> tuple[float, float]:
        """The step without the profiler if the profiler's cost (profiler_us a step, as the replay took it away) was
        cost_ratio_low to cost_ratio_high times that: more cost, a shorter step, never shorter than the GPU's work."""
        shortest = max(gpu_busy_us, est_step_us - (self.cost_ratio_high - 1.0) * profiler_us)
        longest = est_step_us + (1.0 - self.cost_ratio_low) * profiler_us
        return min(shortest, est_step_us), max(longest, est_step_us)


@functools.cache
def _spreads() -> dict[str, Spread]:
    table = tomllib.loads(resources.files("attntrace").joinpath("profiler_spread.toml").read_text())
    return {name: Spread(name, float(v["cost_ratio_low"]), float(v["cost_ratio_high"]), int(v["captures"]))
            for name, v in table.items()}


def spread_for(settings: dict[str, Any], compiled: bool) -> Spread:
    """The spread of traces recorded like this one (tools/profiler_spread.py wrote attntrace/profiler_spread.toml)."""
    name = f"{'compiled' if compiled else 'eager'}_{'stack' if settings.get('with_stack') else 'no_stack'}"
    return _spreads()[name]
