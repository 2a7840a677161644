"""`attntrace.profile(...)`: torch.profiler.profile that also times each step with the profiler off, and keeps
those timings in the trace it writes.

A drop-in: the same arguments and methods as torch.profiler.profile (it is a subclass). What it adds:
- each step, from the return of one `step()` to the next call (the time `step()` itself spends starting, stopping
  and exporting traces is no step's), is timed on the host clock;
- steps the schedule runs with the profiler off (`skip_first` and `wait`) are also timed on the GPU, where the
  profiler records CUDA: a CUDA event on the current stream at each end of the step, so that a CPU running ahead
  of the GPU (no sync in the loop) is not read as a short step. The events are read when the profiler is about to
  start (one host wait for the last of them, while nothing is recorded); no sync is added inside any step;
- when the trace is stopped (before torch collects it, so export_chrome_trace and every on_trace_ready handler
  write it), the timings go into the trace's metadata under MEASURED_KEY (the contract in README, "Measured, not
  modelled").

torch is imported here, when `attntrace.profile` is first used (attntrace/__init__.py loads this module lazily).
"""

from __future__ import annotations

import inspect
import json
import time
from typing import Any

import torch
from torch.profiler import ProfilerAction

import attntrace

MEASURED_KEY = "attntrace_measured"
MEASURED_VERSION = 1
FLAGS = ("record_shapes", "with_stack", "profile_memory", "with_modules", "with_flops")
SCHEDULE_ARGS = ("skip_first", "wait", "warmup", "active", "repeat")


def _phase(action: Any) -> str:
    if action in (None, ProfilerAction.NONE):
        return "off"
    if action == ProfilerAction.WARMUP:
        return "warmup"
    return "active"


def schedule_settings(schedule: Any) -> dict[str, int] | None:
    """The arguments of a torch.profiler.schedule(...) (read from its closure), or None for a schedule of the
    user's own or none."""
    if schedule is None:
        return None
    try:
        found = inspect.getclosurevars(schedule).nonlocals
    except (TypeError, ValueError):
        return None
    values = {name: found[name] for name in SCHEDULE_ARGS if isinstance(found.get(name), int)}
    return values if len(values) == len(SCHEDULE_ARGS) else None


class profile(torch.profiler.profile):  # lower case: the name torch.profiler.profile has
    """torch.profiler.profile that times each step without the profiler (the schedule's skip_first and wait steps)
    and with it (warmup and active), and writes the timings into the trace's metadata under "attntrace_measured"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._schedule_args = schedule_settings(kwargs.get("schedule"))
        activities = getattr(self, "activities", None) or set()
        self._gpu_clock = (torch.profiler.ProfilerActivity.CUDA in activities) and torch.cuda.is_available()
        # Steps timed since the last trace was written: (step number, phase, host us, gpu us or None).
        self._timed: list[tuple[int, str, float, float | None]] = []
        # The open step: its number, phase, host start (ns), and CUDA start event (off steps on the GPU).
        self._open: tuple[int, str, int, Any] | None = None
        # Off steps whose CUDA events are not read yet: index into _timed -> (start event, end event).
        self._pending: dict[int, tuple[Any, Any]] = {}
        self.measured: list[dict[str, Any]] = []  # what each trace got, in order (for tests and the curious)

    # --- the step clock ---------------------------------------------------------------------------
    def _begin(self) -> None:
        phase = _phase(self.current_action)
        event = None
        if phase == "off" and self._gpu_clock and not torch.cuda.is_current_stream_capturing():
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self._open = (self.step_num, phase, time.perf_counter_ns(), event)

    def _end(self) -> None:
        if self._open is None:
            return
        ended = time.perf_counter_ns()
        step, phase, began, start_event = self._open
        self._open = None
        if start_event is not None:
            end_event = torch.cuda.Event(enable_timing=True)
            end_event.record()
            self._pending[len(self._timed)] = (start_event, end_event)
        self._timed.append((step, phase, (ended - began) / 1e3, None))

    def _read_gpu_clock(self) -> None:
        """Read the CUDA events of the off steps: a host wait for the last one, made while the profiler is off."""
        if not self._pending:
            return
        last = max(self._pending)
        self._pending[last][1].synchronize()
        for index, (start, end) in sorted(self._pending.items()):
            step, phase, host_us, _ = self._timed[index]
            self._timed[index] = (step, phase, host_us, start.elapsed_time(end) * 1e3)
        self._pending.clear()

    # --- torch.profiler.profile's hooks -----------------------------------------------------------
    def start(self) -> None:
        super().start()
        self._begin()

    def step(self) -> None:
        self._end()
        super().step()
        self._begin()

    def stop(self) -> None:
        # A step still open when the profiler stops ran under it when the profiler records (its ProfilerStep marker
        # closes here); one that ran with the profiler off is no step of the trace and is not kept.
        if self._open is not None and self._open[1] == "off":
            self._open = None
        self._end()
        super().stop()

    def prepare_trace(self) -> None:
        self._read_gpu_clock()
        super().prepare_trace()

    def stop_trace(self) -> None:
        # Before torch collects the trace: metadata added after it is not written.
        self._read_gpu_clock()
        record = self._record()
        self.measured.append(record)
        self.add_metadata_json(MEASURED_KEY, json.dumps(record))
        self._timed = []
        super().stop_trace()

    def _record(self) -> dict[str, Any]:
        """The metadata of the trace being stopped: the steps timed since the last one, by phase."""
        off = [t for t in self._timed if t[1] == "off"]
        on_gpu = bool(off) and all(t[3] is not None for t in off)
        active = [t for t in self._timed if t[1] == "active"]
        return {
            "version": MEASURED_VERSION,
            "method": "cuda_events" if on_gpu else "host_clock",
            "unprofiled_step_us": [round(t[3] if on_gpu else t[2], 3) for t in off],
            "unprofiled_steps": [t[0] for t in off],
            "host_unprofiled_step_us": [round(t[2], 3) for t in off],
            "warmup_step_us": [round(t[2], 3) for t in self._timed if t[1] == "warmup"],
            "profiled_step_us": [round(t[2], 3) for t in active],
            "profiled_steps": [t[0] for t in active],
            "settings": {**{name: bool(getattr(self, name, False)) for name in FLAGS},
                         "schedule": self._schedule_args, "device": "cuda" if self._gpu_clock else "cpu"},
            "tool": f"attntrace {attntrace.__version__}",
        }
