"""The steps replayed without the profiler's own CPU cost: what the program's step time and GPU idle would be
when nobody records it.

The profiler spends CPU time on every event it records (an op, a runtime call, a Python function under
`with_stack`). On a small-op step that can double the step and make a busy GPU look idle. The replay takes the
recorded timeline of the process that drives each device and:
- shrinks the CPU timeline by the estimated profiler time spent before each moment (all threads of the process
  as one timeline: PyTorch's autograd thread and the main thread hand work to each other, rarely overlap);
- moves each launch earlier by that much, and starts its GPU work at the later of the launch plus the
  launch-to-start latency the trace showed on an idle stream, the end of the work before it on its stream, and
  the end of the work on another stream it was seen to wait for;
- keeps kernel and copy durations, and the CPU waiting at synchronisations: a sync returns once the GPU work it
  waited for has finished in the replay.
The costs per event come from attntrace/profiler_cost.toml (measured on an H200 host), or from the user's own
(`attntrace run --calibrate-profiler`).
"""

from __future__ import annotations

import bisect
import re
import tomllib
from dataclasses import dataclass, field, replace
from functools import cached_property
from importlib import resources
from operator import itemgetter
from typing import Any

import polars as pl

from attntrace.model import optree
from attntrace.model.critical_path import COPIES, CpuTimeline, Placement, cpu_timeline, walk
from attntrace.model.intervals import busy_us
from attntrace.model.plain import collect_plain
from attntrace.model.tables import GRAPH_LAUNCH_APIS

# Calls that block the host until the device is done: synchronize calls and synchronous copies.
BLOCKING_CALLS = frozenset((
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "hipDeviceSynchronize",
    "hipStreamSynchronize", "hipEventSynchronize", "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpyFromSymbol",
    "cudaMemcpyToSymbol", "cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cuMemcpyHtoD", "cuMemcpyHtoD_v2",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "hipMemcpy", "hipMemcpyWithStream",
    "hipMemcpyDtoH", "hipMemcpyHtoD", "hipCtxSynchronize"))
# An async copy call that lasts this long and ends as its own copy ends waited for it (pageable memory).
BLOCKING_COPY_MIN_US = 20.0
# Two GPU events this close are back to back: the second waited for the first.
TOUCH_US = 3.0
# A sync call that found the GPU done still costs the CPU this much (measured without the profiler).
SYNC_FLOOR_US = 4.0
STEADY_RATIO = 1.5
HOST_FACTOR_MIN, HOST_FACTOR_MAX = 0.5, 3.0
COST_NAMES = ("cpu_op_us", "cpu_op_shapes_us", "cpu_op_stack_us", "python_function_us", "runtime_call_us",
              "step_us", "graph_kernel_us", "inductor_kernel_us", "inductor_kernel_shapes_us",
              "inductor_kernel_stack_us", "inductor_wrapper_event_us",
              "inductor_wrapper_statement_us")
# The op torch.compile's (Inductor's) launcher records around each Triton kernel it launches: it takes that path,
# and records it, only while the profiler runs.
INDUCTOR_KERNEL_OP = "triton_"
# The Python frame of Inductor's generated wrapper: `call` in the module it writes to its code cache
# (<cache dir>/<2 chars>/c<hash>.py), one straight-line function with a statement per kernel and buffer.
INDUCTOR_WRAPPER = r"/c[a-z0-9]{20,}\.py\(\d+\): call$"
SETTINGS = ("record_shapes", "with_stack", "profile_memory", "with_modules", "with_flops")
# A copy to or from pageable host memory (Kineto names the memory kinds of each copy).
PAGEABLE_COPY = "Pageable"
# A pinned host-to-device copy on the H200 host (PCIe Gen5), bytes per us: what a pageable copy takes once pinned.
PINNED_COPY_BYTES_PER_US = 50e3
# What an asynchronous copy call costs the CPU once its memory is pinned (it only queues the copy).
ASYNC_COPY_CALL_US = 6.0
# The CPU cost of one kernel in a graph launch (cudaGraphLaunch, per node), measured without the profiler.
GRAPH_NODE_US = 0.5


@dataclass(frozen=True)
class Change:
    """A fix applied to the replay, to see what the step would gain (a what-if).

    drop_syncs: the blocking calls (launches-table idx) that no longer wait for the GPU; None: every one that is not
    a pageable copy. pin_copies: the pageable copy calls made pinned and asynchronous; None: every one. speedup:
    GPU work (gpu-table idx) -> how many times faster it runs. graph: every stretch of launches with no blocking
    call between them launched as one graph (the CPU's time between launches gone). cpu_removed: recorded CPU
    intervals (start, end) taken off the path (a data loader's wait moved to its workers)."""
    drop_syncs: frozenset[int] | None = frozenset()
    pin_copies: frozenset[int] | None = frozenset()
    speedup: tuple[tuple[int, float], ...] = ()
    graph: bool = False
    cpu_removed: tuple[tuple[float, float], ...] = ()

    def drops(self, call: int, pageable: bool) -> bool:
        """Whether the blocking call no longer blocks: a sync dropped, or a pageable copy pinned."""
        if pageable:
            return self.pin_copies is None or call in self.pin_copies
        return self.drop_syncs is None or call in self.drop_syncs


NO_CHANGE = Change()


@dataclass(frozen=True)
class ProfilerCosts:
    """CPU microseconds the profiler spends per recorded event, by setting, and where they were measured."""
    cpu_op_us: float
    cpu_op_shapes_us: float
    cpu_op_stack_us: float
    python_function_us: float
    runtime_call_us: float
    step_us: float
    graph_kernel_us: float
    # What Inductor's launcher does per Triton kernel only under the profiler (its kernel's name and arguments
    # gathered in Python, a RecordFunctionFast op), beyond the cost of the op it records; more with record_shapes
    # (the arguments' shapes) and with with_stack (the Python tracer follows all of it).
    inductor_kernel_us: float = 0.0
    inductor_kernel_shapes_us: float = 0.0
    inductor_kernel_stack_us: float = 0.0
    # with_stack: every Python event directly inside Inductor's wrapper (a statement's call) costs
    # inductor_wrapper_event_us, plus inductor_wrapper_statement_us for each such event in that call. The recorded
    # time between two statements of the wrapper grows with the wrapper's length (on the H200 host: 6 us apart in
    # a wrapper of 370 statements, 29 us in one of 1,400), so a wrapper of n statements costs n * (event + n *
    # statement).
    inductor_wrapper_event_us: float = 0.0
    inductor_wrapper_statement_us: float = 0.0
    measured_on: dict[str, Any] = field(default_factory=dict)
    # The median launch call (cudaLaunchKernel, cuLaunchKernel...) under the profiler on the host the costs were
    # measured on. A trace whose launch calls took longer was recorded on a slower host or with a costlier
    # CUPTI: its per-event costs are scaled by the ratio (0 turns that off, as for costs from a config).
    launch_call_us: float = 0.0

    @classmethod
    def default(cls) -> ProfilerCosts:
        data = tomllib.loads(resources.files("attntrace").joinpath("profiler_cost.toml").read_text())
        return cls.from_table(data["profiler_cost"])

    @classmethod
    def from_table(cls, table: dict[str, Any], base: ProfilerCosts | None = None) -> ProfilerCosts:
        """Costs from a TOML table; names it lacks keep `base`'s values."""
        values = {name: float(table[name]) if name in table else getattr(base, name, 0.0) for name in COST_NAMES}
        measured = table.get("measured_on", base.measured_on if base else {})
        # Not inherited: a config's costs were measured on its own host, whose launch time the base does not know.
        return cls(**values, measured_on=dict(measured), launch_call_us=float(table.get("launch_call_us", 0.0)))

    def scaled_for(self, launch_us: float | None) -> tuple[ProfilerCosts, float]:
        """The costs for a trace whose median launch call took `launch_us`, and the factor applied (1 when the
        reference or the trace's launch time is unknown; kept within 0.5..3)."""
        if not self.launch_call_us or not launch_us:
            return self, 1.0
        factor = min(HOST_FACTOR_MAX, max(HOST_FACTOR_MIN, launch_us / self.launch_call_us))
        return replace(self, **{name: getattr(self, name) * factor for name in COST_NAMES}), factor

    def inductor_kernel_cost(self, settings: dict[str, bool]) -> float:
        return _by_setting(settings, self.inductor_kernel_us, self.inductor_kernel_shapes_us,
                           self.inductor_kernel_stack_us)

    def op_cost(self, settings: dict[str, bool]) -> float:
        return _by_setting(settings, self.cpu_op_us, self.cpu_op_shapes_us, self.cpu_op_stack_us)


def _by_setting(settings: dict[str, bool], plain: float, shapes: float, stack: float) -> float:
    """A cost under these settings: what every recording pays, plus what record_shapes and with_stack add."""
    return plain + (shapes if settings.get("record_shapes") else 0.0) + (stack if settings.get("with_stack") else 0.0)


def settings_of(flags: dict[str, bool], has_shapes: bool, python_events: int) -> dict[str, Any]:
    """The profiler's settings: the trace header's flags where it has them (Kineto writes them since 2023),
    otherwise what the events show (input shapes recorded, python_function events); `source` says which."""
    if any(flags.get(name) for name in SETTINGS):
        return {**{name: bool(flags.get(name)) for name in SETTINGS}, "source": "header"}
    return {"record_shapes": has_shapes, "with_stack": python_events > 0, "profile_memory": None,
            "with_modules": None, "with_flops": None, "source": "events"}


# A step as recorded, from Replay.table: its chained window, as the estimate's is (AT402 quotes the same figure), or
# its GPU work where that is longer (a GPU running behind spreads a step's kernels over the next windows).
RECORDED_STEP = pl.max_horizontal(pl.col("window_end") - pl.col("window_ts"), "gpu_busy_us")


@dataclass
class Replay:
    """Per (step, device): the step as recorded and as estimated without the profiler."""
    # Per (step, device): recorded_us, est_step_us, cpu_us (the CPU's own time for the step, replayed),
    # window_ts/window_end (the step as recorded, chained: from the previous step's end to the later of the next
    # step's start and the end of this step's GPU work; trace times), gpu_busy_us, est_idle_us, profiler_cpu_us.
    table: pl.DataFrame
    settings: dict[str, Any]
    events_by_device: dict[int, dict[str, float]]  # each device's process: events recorded per step, by kind
    reason: str | None = None  # why no replay could be made (no CPU events, a CPU-only trace, ...)
    idle_after_sync: dict[int, float] = field(default_factory=dict)  # launches-table idx -> replayed GPU idle
    host_factor: float = 1.0  # the per-event costs' scale for this trace's host (ProfilerCosts.scaled_for)
    costs: ProfilerCosts | None = None  # the per-event costs the replay charged, scaled for this trace's host
    costs_by_device: dict[int, ProfilerCosts] = field(default_factory=dict)  # each device's process's, scaled
    # With with_path: per (step, device), the replayed step's critical path (step, device, step_us, spent: {on: us}).
    paths: list[dict[str, Any]] = field(default_factory=list)

    @property
    def events_per_step(self) -> dict[str, float]:
        """Events recorded per step, by kind, the mean over devices (summary's `profiler.events_per_step`)."""
        counts = list(self.events_by_device.values())
        return {k: sum(c[k] for c in counts) / len(counts) for k in counts[0]} if counts else {}

    @cached_property  # asked by summary and several rules (the table never changes)
    def working(self) -> pl.DataFrame:
        """The steps that ran GPU work, on each device where any did (Trace.steps_per_process counts the same): a
        step with none (a trailing ProfilerStep around nothing, 49 us of a 9 ms loop) is no step of the program."""
        ran = pl.col("gpu_busy_us") > 0
        return self.table.filter(ran | ~ran.any().over("device"))

    def charged(self) -> pl.DataFrame:
        """Per device: the profiler cost the replay charged each op (op_us) and each runtime call (call_us) of the
        process that drives it, scaled to its host (a merged trace's ranks ran on their own hosts)."""
        devices = sorted(self.costs_by_device)
        costs = [self.costs_by_device[d] for d in devices]
        return pl.DataFrame({"device": devices, "op_us": [c.op_cost(self.settings) for c in costs],
                             "call_us": [c.runtime_call_us for c in costs]},
                            schema={"device": pl.Int64, "op_us": pl.Float64, "call_us": pl.Float64})

    @cached_property
    def steady(self) -> pl.DataFrame:
        """The steps that ran at the device's steady pace: at most STEADY_RATIO times the shortest recorded step
        that ran GPU work, and only steps that ran some where any did.
        The profiler's first active steps run slow (seen on an H200, one SDPA call per step: 6.7, 1.6, 0.8, 0.3,
        0.14 ms), and a verdict must not flip between two captures of one program because of them."""
        # Among the working steps: the empty trailing step (49 us) alone was kept as the pace of a 9 ms loop.
        working = self.working
        return working.filter(pl.col("recorded_us") <= STEADY_RATIO * pl.col("recorded_us").min().over("device"))

    def per_device(self, steps: list[int] | None = None) -> pl.DataFrame:
        """Medians over the steady steps (or those of them in `steps`), per device (a step's numbers are the median
        steady step's, not a mean over 3 to 5 samples that a one-off stall can move).
        No steady step is shorter than the CPU time it needs: with the GPU a step or more behind the CPU, the
        chained steps end where each step's GPU work does, and a queue that drains shifts time from step to step
        (HTA's rank-0 trace: 368, 165, 200, 166, 83 ms for 200 ms of CPU in each). The step is then the CPU's
        median (no longer than the recorded step's: taking the profiler's cost away never lengthens a step), and the
        time it adds is idle: the GPU's work is the same."""
        # Each step's estimate is within its RECORDED_STEP, so the medians are too: a median of per-step windows
        # alone came out under the median estimate (HTA's trace_diff test: 116.9 ms recorded, 122.2 ms estimated).
        steady = self.steady if steps is None else self.steady.filter(pl.col("step").is_in(steps))
        medians = steady.lazy().group_by("device").agg(
            pl.len().alias("steps"), RECORDED_STEP.median().alias("recorded_us"),
            pl.col("est_step_us", "gpu_busy_us", "est_idle_us", "profiler_cpu_us", "cpu_us").median())
        lift = (pl.min_horizontal("cpu_us", "recorded_us") - pl.col("est_step_us")).clip(lower_bound=0.0)
        return collect_plain(medians.with_columns(pl.col("est_step_us") + lift, pl.col("est_idle_us") + lift)
                             .drop("cpu_us").sort("device"))


def _is_blocking(name: str, dur: float, own_copy_end: float | None, end: float) -> bool:
    if name in BLOCKING_CALLS:
        return True
    # cudaMemcpyAsync to or from pageable memory returns only when the copy is done.
    return (own_copy_end is not None and dur >= BLOCKING_COPY_MIN_US and "Memcpy" in name
            and abs(end - own_copy_end) <= 2 * TOUCH_US + 0.05 * dur)


class _CpuClock:
    """Maps a recorded CPU time of one process to the replayed one: minus the profiler cost of the events that
    began before it, minus the waiting that syncs no longer do."""

    def __init__(self, events: pl.DataFrame) -> None:
        # events: start, cost. A stable sort and a running sum, as a loop in start order would add them. Kept as
        # columns (8 bytes a value), not lists of Python floats (32 and a pointer): on a 185 MB generate() trace the
        # clock's lists were 12 MB of the replay's 55 MB peak.
        ordered = events.sort("start", maintain_order=True)
        self.starts: pl.Series = ordered["start"]
        # cumulative[i]: the cost of the first i events.
        self.cumulative: pl.Series = pl.concat([pl.Series([0.0], dtype=pl.Float64),
                                                ordered["cost"].cast(pl.Float64).cum_sum()])
        self.saved = 0.0  # waiting removed at syncs so far (negative when a sync now waits longer)
        # (recorded return, saved after it) at each blocking call, in order: the waiting removed before a moment.
        self.saved_times: list[float] = []
        self.saved_after: list[float] = []

    def fresh(self) -> _CpuClock:
        """This clock with no waiting removed yet: one replay's, sharing the profiler's costs."""
        clock = _CpuClock.__new__(_CpuClock)
        clock.starts, clock.cumulative = self.starts, self.cumulative
        clock.saved, clock.saved_times, clock.saved_after = 0.0, [], []
        return clock

    def returned(self, end: float) -> None:
        """A blocking call returned at recorded `end` with `saved` now removed before what follows it."""
        self.saved_times.append(end)
        self.saved_after.append(self.saved)

    def saved_before(self, t: float) -> float:
        i = bisect.bisect_right(self.saved_times, t)
        return self.saved_after[i - 1] if i else 0.0

    def overhead_before(self, t: float) -> float:
        return self.overheads_before([t])[0]

    def overheads_before(self, times: list[float]) -> list[float]:
        """overhead_before of each time, in one sorted search instead of one bisection each."""
        found = self.starts.search_sorted(pl.Series(times, dtype=pl.Float64), side="right")
        return self.cumulative.gather(found).to_list()

    def at(self, t: float) -> float:
        """The replayed time of a recorded moment once the loop has run: the waiting removed by the syncs that
        returned before it, not by all of them (a step's CPU time holds its own syncs' waits as replayed)."""
        return t - self.overhead_before(t) - self.saved_before(t)


def replay(trace: Any, costs: ProfilerCosts, change: Change = NO_CHANGE, with_path: bool = False,
           only_steps: tuple[int, ...] | None = None) -> Replay:
    """Replay the steady steps of every device without the profiler's cost (trace: model.Trace), with the
    per-event costs scaled to the host the trace was recorded on (ProfilerCosts.scaled_for), and `change` applied
    (a what-if: the step as it would run with that fix); with_path: each step's critical path too (Replay.paths);
    only_steps: those steps alone (a what-if's sample of the steady steps)."""
    # CUDA kernel launch calls only: the reference was measured on them (a HIP launch costs what ROCm's runtime
    # does; a graph launch records every kernel of its graph and takes far longer, which is no slower host: a
    # graph-replaying trace read as one scaled its costs 3x and charged more profiler time than its step lasted).
    kernel_launches = trace.launches.filter(pl.col("is_launch") & pl.col("name").str.starts_with("cu")
                                            & ~pl.col("name").is_in(GRAPH_LAUNCH_APIS))
    # Each process on its own host's scale: ranks merged into one file ran on their own CPUs (two H200 captures
    # at 1.12x and 1.54x were scaled 1.31x each, merged).
    medians = {str(pid): float(us) for pid, us in kernel_launches.group_by(pl.col("pid").cast(pl.String))
               .agg(pl.col("dur").median()).iter_rows()}
    scaled = {device: costs.scaled_for(medians.get(pid)) for device, pid in sorted(trace.device_process.items())}
    by_device = {device: c for device, (c, _) in scaled.items()}
    result = _replay(trace, by_device, change, with_path, only_steps)
    # The first device's, as summary gives one (a single process: its only one); with no device, the trace's.
    pooled = kernel_launches["dur"].median() if kernel_launches.height else None
    first = next(iter(scaled.values()), None) or costs.scaled_for(float(pooled) if pooled is not None else None)
    result.costs, result.host_factor, result.costs_by_device = first[0], round(first[1], 3), by_device
    return result


def _replay(trace: Any, costs_by_device: dict[int, ProfilerCosts], change: Change, with_path: bool,
            only_steps: tuple[int, ...] | None = None) -> Replay:
    settings = settings_of(trace.meta.flags, trace.has_shapes, trace.python.height)
    steps = trace.steps.filter(~pl.col("capture"))
    if only_steps is not None:
        steps = steps.filter(pl.col("step").is_in(list(only_steps)))
    empty = pl.DataFrame(schema={"step": pl.Int64, "device": pl.Int64, "recorded_us": pl.Float64,
                                 "est_step_us": pl.Float64, "window_ts": pl.Float64, "window_end": pl.Float64,
                                 "cpu_us": pl.Float64, "gpu_busy_us": pl.Float64, "est_idle_us": pl.Float64,
                                 "profiler_cpu_us": pl.Float64})
    if not trace.has_gpu:
        return Replay(empty, settings, {}, "a CPU-only trace: no GPU to be idle")
    if not trace.has_step_markers or not steps.height:
        return Replay(empty, settings, {}, "no steps to replay")
    if not trace.ops.height and not trace.launches.height:
        return Replay(empty, settings, {}, "no CPU events: the profiler's CPU cost cannot be estimated")
    frames, idle_after_sync, by_device = [], {}, {}
    paths: list[dict[str, Any]] = []
    for device, pid in sorted(trace.device_process.items()):
        mine = steps.filter(pl.col("pid").cast(pl.String) == pid)
        # A pid of ASCII digits (str.isdigit also takes "²", which int() refuses) that int() reads quickly.
        if not mine.height or not re.fullmatch(r"-?[0-9]{1,40}", pid):
            continue
        frame, per_step, idle, device_paths = _replay_device(trace, device, int(pid), mine.sort("ts", "step"),
                                                             settings, costs_by_device[device], change, with_path,
                                                             keep=only_steps is not None)
        paths.extend(device_paths)
        frames.append(frame)
        by_device[device] = per_step
        idle_after_sync.update(idle)
    if not frames:
        return Replay(empty, settings, {}, "no step of the process that drives the GPU")
    return Replay(pl.concat(frames).sort("step", "device"), settings, by_device, idle_after_sync=idle_after_sync,
                  paths=paths)


@dataclass
class _Prepared:
    """What a device's replay of some steps needs before its loop, the same whatever the change: the window's
    events, the profiler's costs, and the CPU's timeline in recorded order. The what-ifs of one trace replay the
    same sampled steps, and this part was most of each one's cost (0.15 of 0.22 s on a 185 MB generate() trace)."""
    ops: pl.DataFrame
    launches: pl.DataFrame
    python: pl.DataFrame
    gpu: pl.DataFrame
    profiler_costs: pl.DataFrame  # start, cost
    clock: _CpuClock
    latency: float
    pageable: set[int]
    # Each entry: (time, kind, tie-break, payload); kind 1 is a blocking call, payload (idx, ts, end); kind 0 a
    # launch's work; kind 2 work with no launch in the window; payload of 0 and 2: [(idx, ts, end, stream)].
    cpu_events: list[tuple[float, int, float, Any]]
    blocking_ends: list[float]
    blocking_calls: set[int]
    single_work: set[int]
    overhead: dict[float, float]  # the profiler's cost before each moment the loop asks about
    recorded: _Recorded | None = None  # the recorded work per step, once a replay with no faster work asked
    timeline: CpuTimeline | None = None  # the CPU's recorded timeline (critical_path.cpu_timeline), once a path asked


def _prepare(trace: Any, device: int, pid: int, steps: pl.DataFrame, settings: dict[str, Any],
             costs: ProfilerCosts) -> _Prepared:
    """A device's replay before its loop (_Prepared), kept on the trace for replays of the same steps and costs."""
    key = (device, pid, tuple(steps["step"].to_list()), tuple(getattr(costs, n) for n in COST_NAMES))
    cache: dict[Any, _Prepared] = trace.__dict__.setdefault("_replay_prepared", {})
    if key not in cache:
        cache[key] = _prepared(trace, device, pid, steps, settings, costs)
    return cache[key]


def _prepared(trace: Any, device: int, pid: int, steps: pl.DataFrame, settings: dict[str, Any],
              costs: ProfilerCosts) -> _Prepared:
    begin, finish = float(steps["ts"].min()), float(steps["end"].max())
    # pid columns are text in traces where some pid is ("Spans", ""): compare as text, which fits both.
    inside = (pl.col("pid").cast(pl.String) == str(pid)) & (pl.col("ts") >= begin) & (pl.col("ts") < finish)
    ops = trace.ops.filter(inside & ~pl.col("name").str.starts_with("ProfilerStep#"))
    launches = trace.launches.filter(inside)
    python = trace.python.filter(inside)
    op_cost = costs.op_cost(settings)

    # GPU work that ends inside the window or after it: of the window's steps, queued before it (no step, or an
    # earlier one still running), never a later step's.
    last_step = int(steps["step"].max())
    gpu = (trace.gpu_linked.filter((pl.col("device") == device) & (pl.col("end") > begin)
                                   & (pl.col("step").is_null() | (pl.col("step") <= last_step)))
           .sort("ts", "idx").select("idx", "ts", "end", "stream", "launch", "kind", "name", "bytes", "group", "step"))
    launch_rows = dict(zip(launches["idx"].to_list(),
                           zip(launches["ts"].to_list(), launches["end"].to_list(), launches["name"].to_list(),
                               strict=True), strict=True))
    # A graph launch records every kernel of the graph: the call takes the profiler's cost for each of them, and
    # no more than the call lasted (that cost is spent inside it).
    per_launch = gpu.filter(pl.col("launch").is_not_null()).group_by("launch").len()
    graphs = (per_launch.filter(pl.col("len") > 1)
              .join(launches.select(pl.col("idx").alias("launch"), "ts", "end"), on="launch", how="inner")
              .sort("launch").select(pl.col("ts").alias("start"), pl.min_horizontal(
                  costs.graph_kernel_us * (pl.col("len") - 1), pl.col("end") - pl.col("ts")).cast(pl.Float64)
                  .alias("cost")))

    def costed(starts: pl.Series, cost: float) -> pl.DataFrame:
        # The cost repeated from one value (not pl.repeat: a query each, and there are six per trace).
        each = pl.Series("cost", [cost], dtype=pl.Float64)
        return pl.DataFrame({"start": starts.cast(pl.Float64), "cost": each.new_from_index(0, starts.len())})

    profiler_costs = pl.concat([
        costed(ops["ts"], op_cost), costed(launches["ts"], costs.runtime_call_us),
        costed(python["ts"], costs.python_function_us), costed(steps["ts"].slice(1), costs.step_us), graphs,
        costed(ops.filter(pl.col("name").str.starts_with(INDUCTOR_KERNEL_OP))["ts"],
               costs.inductor_kernel_cost(settings)),
        _inductor_wrapper_costs(python, costs.inductor_wrapper_event_us, costs.inductor_wrapper_statement_us)])
    clock = _CpuClock(profiler_costs)
    single = set(per_launch.filter(pl.col("len") == 1)["launch"].to_list())
    latency = _idle_launch_latency(gpu, launches.filter(pl.col("idx").is_in(list(single))).select("idx", "ts"),
                                   costs.runtime_call_us)
    copies = gpu.filter(pl.col("launch").is_not_null() & (pl.col("kind") == "memcpy"))
    copy_end = dict(zip(copies["launch"].to_list(), copies["end"].to_list(), strict=True))
    pageable = pageable_copies(copies)
    if pageable:
        # A blocking copy's op also synchronizes its stream after it (copy_ with non_blocking=False): that sync
        # goes with the copy when the copy is made pinned and asynchronous.
        linked = trace.launches_linked.filter(pl.col("pid").cast(pl.String) == str(pid)).select("idx", "op")
        copy_ops = set(linked.filter(pl.col("idx").is_in(list(pageable)))["op"].drop_nulls().to_list())
        pageable |= set(linked.filter(pl.col("op").is_in(list(copy_ops)))["idx"].to_list())

    # Timeline of what happens on the CPU, in recorded order: launches (which place GPU work) and blocking
    # calls (which wait for it); at one time and kind, work that started first goes first.
    cpu_events: list[tuple[float, int, float, Any]] = []
    blocking_ends: list[float] = []
    blocking_calls: set[int] = set()
    for idx, (ts, end, name) in launch_rows.items():
        if _is_blocking(name, end - ts, copy_end.get(idx), end):
            cpu_events.append((end, 1, 0.0, (idx, ts, end)))
            blocking_ends.append(end)
            blocking_calls.add(idx)
    work_by_launch: dict[int, list[tuple[int, float, float, int]]] = {}
    unlaunched: list[tuple[int, float, float, int]] = []
    # Each GPU event as (idx, ts, end, stream), made in one pass rather than unpacked and packed again (the 40k
    # events of a generate() trace).
    items = zip(gpu["idx"].to_list(), gpu["ts"].to_list(), gpu["end"].to_list(), gpu["stream"].to_list(),
                strict=True)
    for launch, item in zip(gpu["launch"].to_list(), items, strict=True):
        if launch in launch_rows:  # (None never is)
            work = work_by_launch.get(launch)
            if work is None:
                work_by_launch[launch] = [item]
            else:
                work.append(item)
        else:
            unlaunched.append(item)
    for launch, items in work_by_launch.items():
        cpu_events.append((launch_rows[launch][0], 0, items[0][1], items))
    single_work = {item[0] for launch in single for item in work_by_launch.get(launch, ())}
    # Work with no launch in the window that ran before the window's first launched work was queued before the
    # window: it goes first, in its recorded order, ahead of everything launched in the window.
    first_launched = min((item[1] for items in work_by_launch.values() for item in items), default=float("inf"))
    for item in unlaunched:
        cpu_events.append((begin - 1.0 if item[1] < first_launched else item[1], 2, item[1], [item]))
    cpu_events.sort(key=itemgetter(0, 1, 2))
    return _Prepared(ops, launches, python, gpu, profiler_costs, clock, latency, pageable, cpu_events,
                     blocking_ends, blocking_calls, single_work, _overheads(cpu_events, clock))


def _overheads(cpu_events: list[tuple[float, int, float, Any]], clock: _CpuClock) -> dict[float, float]:
    """The profiler's cost before each moment the replay's loop asks about (a launch, a sync's call and return),
    found in one search: the loop runs once per GPU event and is the replay's cost on a large trace."""
    asked = [t for t, kind, _, payload in cpu_events for t in ((payload[1], payload[2]) if kind == 1 else (t,))]
    return dict(zip(asked, clock.overheads_before(asked), strict=True))


def _replay_device(trace: Any, device: int, pid: int, steps: pl.DataFrame, settings: dict[str, Any],
                   costs: ProfilerCosts, change: Change = NO_CHANGE, with_path: bool = False, keep: bool = False
                   ) -> tuple[pl.DataFrame, dict[str, float], dict[int, float], list[dict[str, Any]]]:
    """keep: keep the preparation on the trace for more replays of these steps (the what-ifs' sample)."""
    prep = (_prepare if keep else _prepared)(trace, device, pid, steps, settings, costs)
    ops, launches, python, gpu = prep.ops, prep.launches, prep.python, prep.gpu
    latency, pageable, single_work, overhead = prep.latency, prep.pageable, prep.single_work, prep.overhead
    clock = prep.clock.fresh()
    if change.graph or change.cpu_removed:
        # The CPU time the fix takes away, beside the profiler's: charged the same way, as a cost before a moment.
        clock = _CpuClock(pl.concat([prep.profiler_costs,
                                     _removed_cpu(change, clock, launches, steps, prep.blocking_ends)]))
        overhead = _overheads(prep.cpu_events, clock)
    durations = _changed_durations(change, gpu, pageable)

    stream_end: dict[int, tuple[float, float]] = {}  # stream -> (recorded end, replayed end) of its last work
    ends_recorded: list[float] = []  # recorded ends of placed work, sorted, with replayed ends alongside
    ends_replayed: list[float] = []
    # The latest recorded and replayed ends of all placed work: a sync that waited for all of it (a decode loop's
    # .item() on every token) needs no pass over the placed work.
    latest_recorded = latest_replayed = float("-inf")
    new_start: dict[int, float] = {}
    new_end: dict[int, float] = {}
    sync_returns: dict[int, float] = {}
    runtime_call_us = costs.runtime_call_us
    find = bisect.bisect_right
    # What the critical path needs of the placement, kept only when it is asked for.
    placement = (Placement(new_start, new_end, {}, latency, {}, _path_groups(gpu)) if with_path
                 else None)
    ended_by: dict[float, int] = {}  # replayed end -> the work that ends there
    for t, kind, _, payload in prep.cpu_events:
        if kind == 1:
            sync, ts, end = payload
            dropped = change.drops(sync, sync in pageable)
            # The sync returned at `end`: what it waited for had ended by then. In the replay it returns when
            # that work ends there, or at once.
            if dropped:  # the fix: the call no longer waits (a sync removed, a copy made pinned and asynchronous)
                start_new = ts - overhead[ts] - clock.saved
                returns = start_new + (min(ASYNC_COPY_CALL_US, end - ts) if sync in pageable else 0.0)
                clock.saved += (end - overhead[end] - clock.saved) - returns
                clock.returned(end)
                sync_returns[sync] = returns
                continue
            if end + TOUCH_US >= latest_recorded:
                done = latest_replayed
            else:
                i = find(ends_recorded, end + TOUCH_US)
                done = max(ends_replayed[:i], default=float("-inf"))
            start_new = ts - overhead[ts] - clock.saved
            returns = max(start_new + min(SYNC_FLOOR_US, end - ts), done)
            clock.saved += (end - overhead[end] - clock.saved) - returns
            clock.returned(end)
            sync_returns[sync] = returns
            if placement is not None:
                placement.anchors.append((end, returns))
                placement.blocking.append((start_new, returns))
                if done > start_new + min(SYNC_FLOOR_US, end - ts):
                    placement.waits.append((returns, start_new, ended_by[done]))
            continue
        launched_at = t - overhead[t] - clock.saved if kind == 0 else 0.0
        if placement is not None and kind == 0:
            placement.anchors.append((t, launched_at))
        for idx, ts, end, stream in payload:
            prev = stream_end.get(stream)
            gap = max(0.0, ts - prev[0]) if prev else 0.0
            if kind == 0:
                ready = launched_at + latency
                explained = t + latency + runtime_call_us
                if prev is not None:
                    # Back-to-back work keeps its (GPU-side) gap; work that waited for its launch loses the wait.
                    ready = max(ready, prev[1] + min(gap, 1.0))
                    explained = max(explained, prev[0])
            else:  # work with no recorded launch (a graph's later kernels, work queued before the window)
                ready = ts if prev is None else prev[1] + gap
                explained = ts if prev is None else prev[0]
            if ts - explained > TOUCH_US:
                # It started later than its launch and its stream allow: it waited for another stream's work.
                i = find(ends_recorded, ts + 0.01)
                if i and ts - ends_recorded[i - 1] <= TOUCH_US:
                    ready = max(ready, ends_replayed[i - 1])
                elif kind == 0 and idx in single_work and prev is not None and prev[0] >= t + latency:
                    # No work ended just before it, and it was queued behind its stream's last work: the GPU held
                    # it back (another stream's kernel filled the SMs; seen on an H200, an elementwise kernel
                    # waiting 130 us for a GEMM's last wave). That wait is the GPU's, not the profiler's: it stays.
                    # (Not a late start after a launch: the launch latency varies, and the profiler lengthens
                    # it; nor a graph launch: its kernels wait for the call, which the profiler lengthens.)
                    ready = max(ready, prev[1] + (ts - prev[0]))
            stop = ready + durations.get(idx, end - ts)
            new_start[idx] = ready
            new_end[idx] = stop
            if placement is not None:
                ended_by[stop] = idx
                placement.stream[idx] = stream
                placement.recorded[idx] = (ts, end)
                if kind == 0:
                    placement.launched[idx] = launched_at
            stream_end[stream] = (end, stop)
            if end >= latest_recorded:  # work mostly ends in order: append rather than search
                ends_recorded.append(end)
                ends_replayed.append(stop)
                latest_recorded = end
            else:
                j = find(ends_recorded, end)
                ends_recorded.insert(j, end)
                ends_replayed.insert(j, stop)
            if stop > latest_replayed:
                latest_replayed = stop

    # Per step that ran GPU work, as the rules count (Trace.steps_per_process): an empty trailing step halved them.
    count = trace.steps_per_process.get(str(pid)) or steps.height
    per_step_events = {"cpu_ops": ops.height / count, "runtime_calls": launches.height / count,
                       "python_functions": python.height / count}
    bounds: list[tuple[int, float, float, float]] | None = [] if placement is not None else None
    table = _per_step(trace, device, steps, clock, new_start, new_end, durations, prep, bounds)
    paths = _paths(trace, device, placement, bounds, prep) if placement is not None and bounds is not None else []
    return table, per_step_events, _idle_after_syncs(sync_returns, new_start), paths


def pageable_copies(copies: pl.DataFrame) -> set[int]:
    """The launch calls (idx) of bulk copies to or from pageable host memory (copies: the gpu table's memcpy rows
    with their launch): the call blocks the CPU while the driver stages the data. A `.item()`'s few bytes copied
    to pageable memory are a sync, not a copy to pin."""
    bulk = copies.filter(pl.col("name").str.contains(PAGEABLE_COPY, literal=True)
                         & (pl.col("bytes").fill_null(PAGEABLE_COPY_MIN_BYTES) >= PAGEABLE_COPY_MIN_BYTES))
    return set(bulk["launch"].to_list())


# A copy of fewer bytes is a read-back (a scalar, a few values), whatever memory it lands in.
PAGEABLE_COPY_MIN_BYTES = 64 << 10


def _changed_durations(change: Change, gpu: pl.DataFrame, pageable: set[int]) -> dict[int, float]:
    """GPU work whose duration the fix changes (idx -> replayed us): sped-up kernels, and pageable copies made
    pinned (at the pinned rate, never slower than recorded)."""
    durations: dict[int, float] = {}
    if change.speedup:
        factors = dict(change.speedup)
        for idx, ts, end in gpu.filter(pl.col("idx").is_in(list(factors))).select("idx", "ts", "end").iter_rows():
            durations[idx] = (end - ts) / factors[idx]
    if pageable and (change.pin_copies is None or change.pin_copies):
        pinned = pageable if change.pin_copies is None else pageable & change.pin_copies
        rows = gpu.filter(pl.col("launch").is_in(list(pinned)) & pl.col("bytes").is_not_null())
        for idx, ts, end, size in rows.select("idx", "ts", "end", "bytes").iter_rows():
            durations[idx] = min(end - ts, size / PINNED_COPY_BYTES_PER_US)
    return durations


def _removed_cpu(change: Change, clock: _CpuClock, launches: pl.DataFrame, steps: pl.DataFrame,
                 blocking_ends: list[float]) -> pl.DataFrame:
    """The CPU time a fix takes off the path, as (start, cost) rows: each removed interval's recorded time less the
    profiler's cost inside it, charged at its end; with graphs, the CPU time between two launches of one stretch
    (no blocking call and no step boundary between them) less the profiler's and a graph node's cost, charged at
    the later launch."""
    rows: list[tuple[float, float]] = []
    for start, end in change.cpu_removed:
        spent = clock.overhead_before(end) - clock.overhead_before(start)
        rows.append((float(end), max(0.0, end - start - spent)))
    if change.graph:
        kernel_launches = launches.filter(pl.col("is_launch")).sort("ts")
        times = kernel_launches["ts"].cast(pl.Float64).to_list()
        # A stretch ends at a blocking call (a graph holds none) and at a step's start (one graph per step).
        breaks = sorted([*blocking_ends, *steps["ts"].cast(pl.Float64).to_list()])
        # A graph replays its kernels without running their ops' CPU code: the CPU time from the stretch's start (or
        # the launch before) to each launch goes, not only the time between launches.
        starts = [breaks[j - 1] if (j := bisect.bisect_right(breaks, t)) else None for t in times]
        spent = clock.overheads_before(times)
        spent_at_start = clock.overheads_before([s if s is not None else t for s, t in zip(starts, times, strict=True)])
        for i, t in enumerate(times):
            if i and starts[i] == starts[i - 1]:
                gap = t - times[i - 1] - (spent[i] - spent[i - 1])
            elif starts[i] is not None:
                gap = t - starts[i] - (spent[i] - spent_at_start[i])
            else:
                continue
            if gap - GRAPH_NODE_US > 0:
                rows.append((t, gap - GRAPH_NODE_US))
    return pl.DataFrame(rows, schema={"start": pl.Float64, "cost": pl.Float64}, orient="row")


def _path_groups(gpu: pl.DataFrame) -> dict[int, str]:
    """Each GPU work's category on the critical path: its kernel group, copies as copies."""
    groups: dict[int, str] = {}
    for idx, kind, group in gpu.select("idx", "kind", "group").iter_rows():
        groups[idx] = COPIES if kind != "kernel" else f"gpu: {group or 'other'}"
    return groups


def _paths(trace: Any, device: int, placement: Placement, bounds: list[tuple[int, float, float, float]],
           prep: _Prepared) -> list[dict[str, Any]]:
    """Each step's critical path (model/critical_path.py) from the replay's placement."""
    if prep.timeline is None:  # the CPU's recorded timeline: the same for every replay of these steps
        parents, names = trace.op_parent, trace.op_names
        # Top-level ops: no parent but the step's marker.
        roots = pl.Series([parents[i] is None or names[parents[i]].startswith("ProfilerStep#")
                           for i in prep.ops["idx"].to_list()], dtype=pl.Boolean)
        prep.timeline = cpu_timeline(prep.ops, roots, prep.launches, prep.blocking_calls)
    own: dict[int, set[int]] = {}
    for idx, step in prep.gpu.select("idx", "step").iter_rows():  # every row of it is placed
        if step is not None:
            own.setdefault(step, set()).add(idx)
    paths = []
    for step, start, end, cpu_end in bounds:
        segments: list[tuple[float, float, str]] = []
        spent = walk(placement, prep.timeline, start, end, cpu_end, own.get(step, set()), segments)
        paths.append({"step": step, "device": device, "step_us": end - start, "spent": spent,
                      "segments": segments[::-1]})
    return paths


def _inductor_wrapper_costs(python: pl.DataFrame, event_us: float, statement_us: float) -> pl.DataFrame:
    """The profiler's cost before each Python event directly inside an Inductor wrapper call (start, cost):
    event_us plus statement_us times the number of such events in that call (python: the window's
    python_function events)."""
    is_wrapper = python["name"].str.contains(INDUCTOR_WRAPPER)
    if not (event_us or statement_us) or not is_wrapper.any():
        return pl.DataFrame(schema={"start": pl.Float64, "cost": pl.Float64})
    events = python.select("pid", "tid", "ts", "end").with_row_index("idx")
    parent = pl.Series("parent", optree.op_parents(events), dtype=pl.UInt32)
    wrappers = events["idx"].filter(is_wrapper)
    children = (events.with_columns(parent).filter(pl.col("parent").is_in(wrappers.implode()))
                .with_columns(pl.len().over("parent").alias("statements")))
    return children.select(pl.col("ts").cast(pl.Float64).alias("start"),
                           (event_us + pl.col("statements") * statement_us).cast(pl.Float64).alias("cost"))


def _idle_after_syncs(sync_returns: dict[int, float], new_start: dict[int, float]) -> dict[int, float]:
    """For each blocking call, how long the GPU idles in the replay from its return to the next GPU work (AT302
    bounds what removing it saves by the CPU time the sync held). Blocking calls in a row with no GPU work
    between them share one gap: the last counts it, the one the GPU's next work waited for (a `.item()` is a
    blocking copy, then a synchronize: the synchronize is the sync a rule names)."""
    starts = sorted(new_start.values())
    idle: dict[int, float] = {}
    last_before: dict[int, tuple[int, float]] = {}  # next work's index -> the last call returning before it
    for sync, returns in sorted(sync_returns.items(), key=lambda item: (item[1], item[0])):
        idle[sync] = 0.0
        i = bisect.bisect_left(starts, returns)
        if i < len(starts):
            last_before[i] = (sync, returns)
    for i, (sync, returns) in last_before.items():
        idle[sync] = starts[i] - returns
    return idle


def _idle_launch_latency(gpu: pl.DataFrame, launches: pl.DataFrame, runtime_cost: float) -> float:
    """Median time from a launch call's start to its work's start when its stream was idle, less the profiler's
    share of the call (gpu in start order; launches: idx, ts of the single-kernel launches)."""
    # The latest end on the work's stream before it, in start order.
    before = gpu.with_columns(pl.col("end").cum_max().shift(1).over("stream").alias("stream_busy_until"))
    samples = (before.join(launches.select(pl.col("idx").alias("launch"), pl.col("ts").alias("call_ts")),
                           on="launch", how="inner")
               .filter(pl.col("stream_busy_until").is_null() | (pl.col("stream_busy_until") < pl.col("call_ts")))
               .select((pl.col("ts") - pl.col("call_ts")).alias("wait"))["wait"].sort())
    if not samples.len():
        return 5.0
    return max(1.0, float(samples[samples.len() // 2]) - runtime_cost)


@dataclass(frozen=True)
class _Recorded:
    """A device's GPU work as recorded, per step, that bounds the replayed steps (_per_step)."""
    busy: dict[int, float]  # step -> the GPU time its placed work took as recorded (streams merged)
    done: dict[int, float]  # step -> when its last work ended as recorded
    backlog_us: float  # work queued before the first step: how far past the first step's start it ran


def _recorded(trace: Any, device: int, prep: _Prepared, durations: dict[int, float], steps: pl.DataFrame
              ) -> _Recorded:
    """The device's recorded GPU work per step (_Recorded), kept on `prep` when no work is sped up: each what-if
    that only moves syncs and launches holds its steps against the same figures."""
    if not durations and prep.recorded is not None:
        return prep.recorded
    recorded_work = trace.gpu_linked.filter(pl.col("device") == device)
    if durations:  # a what-if's faster work: the step's GPU time as recorded shrinks with it
        changed = pl.DataFrame({"idx": list(durations), "changed_us": list(durations.values())},
                               schema={"idx": recorded_work.schema["idx"], "changed_us": pl.Float64})
        recorded_work = (recorded_work.join(changed, on="idx", how="left")
                         .with_columns(pl.coalesce(pl.col("ts") + pl.col("changed_us"), "end").alias("end"))
                         .drop("changed_us"))
    # The GPU time each step's work took as recorded (streams merged): the replay keeps kernel durations but can
    # overlap two streams' kernels that ran one after the other (each filled the GPU), and a step is never
    # shorter than its GPU work took. The placed work is the prepared window's (every row of it is placed).
    placed = recorded_work.join(prep.gpu.select("idx"), on="idx", how="semi")
    busy = {s: b for s, b in busy_us(placed.select("ts", "end", "step", "device"), ["step"])
            .select("step", "busy_us").iter_rows() if s is not None}
    done = {s: e for s, e in recorded_work.group_by("step").agg(pl.col("end").max()).iter_rows() if s is not None}
    starts, numbers = steps["ts"].to_list(), steps["step"].to_list()
    first_recorded = recorded_work.filter(pl.col("step").is_not_null())["ts"].min()
    backlog = (recorded_work.filter(pl.col("step").is_null() & (pl.col("ts") <= first_recorded))["end"].max()
               if first_recorded is not None else None)
    backlog_us = max(0.0, float(backlog) - starts[0]) if backlog is not None else 0.0
    # Work queued before the profiler started is in no trace: the first step's first kernel then starts long after
    # its launch with the GPU idle as recorded (one SDPA call began 784 us after its launch, behind the warm-up's
    # kernels). That wait is the backlog's, not the step's.
    first_work = recorded_work.filter(pl.col("step") == numbers[0]).sort("ts").head(1)
    if first_work.height and first_work["launch_ts"][0] is not None:
        began, launched = float(first_work["ts"][0]), max(float(first_work["launch_ts"][0]), starts[0])
        if not recorded_work.filter((pl.col("end") > launched) & (pl.col("ts") < began)).height:
            backlog_us = max(backlog_us, began - launched)
    found = _Recorded(busy, done, backlog_us)
    if not durations:
        prep.recorded = found
    return found


def _per_step(trace: Any, device: int, steps: pl.DataFrame, clock: _CpuClock, new_start: dict[int, float],
              new_end: dict[int, float], durations: dict[int, float], prep: _Prepared,
              bounds: list[tuple[int, float, float, float]] | None = None) -> pl.DataFrame:
    """Each step's replayed length: from its start to the next step's start, on the CPU or the GPU, whichever
    comes later (the CPU can run ahead of the GPU; a step ends when both have done its work). `bounds`, when
    given, receives each step's (step, replayed start, replayed end, the CPU's replayed arrival at the next step)."""
    recorded = _recorded(trace, device, prep, durations, steps)
    recorded_busy, recorded_done = recorded.busy, recorded.done
    placed = pl.DataFrame({"idx": list(new_start), "new_ts": list(new_start.values()),
                           "new_end": [new_end[i] for i in new_start]},
                          schema={"idx": pl.UInt32, "new_ts": pl.Float64, "new_end": pl.Float64})
    work = placed.join(prep.gpu.select("idx", "step"), on="idx", how="left")
    gpu_done = {s: e for s, e in work.group_by("step").agg(pl.col("new_end").max()).iter_rows() if s is not None}
    busy = {s: b for s, b in busy_us(work.rename({"new_ts": "ts", "new_end": "end"})
                                       .with_columns(pl.lit(device).alias("device")), ["step"])
            .select("step", "busy_us").iter_rows() if s is not None}
    numbers = steps["step"].to_list()
    starts, ends = steps["ts"].to_list(), steps["end"].to_list()
    spent_before = clock.overheads_before([*starts, ends[-1]])  # one search for all steps
    cpu_new = [t - spent - clock.saved for t, spent in zip([*starts, ends[-1]], spent_before, strict=True)]
    # Work queued before the first step (the warm-up step's tail) delays the first step's GPU work but is not
    # part of it.
    first_own = work.filter(pl.col("step").is_not_null())["new_ts"].min()
    backlog = (work.filter(pl.col("step").is_null() & (pl.col("new_ts") <= first_own))["new_end"].max()
               if first_own is not None else None)
    previous_end = cpu_new[0]
    backlog_us = max(0.0, float(backlog) - cpu_new[0]) if backlog is not None else 0.0
    # The same backlog as recorded: the first step's bound leaves it out too, or a first step behind the warm-up's
    # queue was bounded by the queue (2.0 ms replayed for a 1.2 ms step).
    recorded_backlog_us = recorded.backlog_us
    # The same chain of step ends on the recorded times: what the replay gives with no cost taken away, and so
    # the most a step can last once the profiler's cost is gone.
    recorded_end = starts[0]
    rows = []
    raw_start = cpu_new[0]
    for i, step in enumerate(numbers):
        # A step is over when the CPU reaches the next step and the GPU has finished this step's work. Step ends
        # never go back, so the steps' lengths add up to the replayed window.
        # Work queued before the window (backlog_us of it past the window's start) is not the steps' own: their
        # GPU ends move back by it.
        gpu_end = gpu_done.get(step, previous_end + backlog_us) - backlog_us
        step_end = max(cpu_new[i + 1], gpu_end, previous_end)
        gpu_busy = max(busy.get(step, 0.0), recorded_busy.get(step, 0.0))
        est = max(step_end - previous_end, gpu_busy)
        if bounds is not None:
            # On the placement's own clock, the backlog not taken away: the path walks placed work.
            raw_end = max(cpu_new[i + 1], gpu_done.get(step, raw_start), raw_start)
            bounds.append((step, raw_start, raw_end, cpu_new[i + 1]))
            raw_start = raw_end
        previous_end = step_end
        # As recorded, a step lasts its CPU window or its GPU work, whichever is longer (Trace.step_table's
        # step_us): a GPU-bound step's CPU marker ends long before its kernels do.
        recorded = max(ends[i] - starts[i], gpu_busy)
        # Taking the profiler's cost away never lengthens a step: where the replay's placement comes out longer
        # (a latency or dependency it misreads), the step as recorded bounds it.
        cpu_span = (starts[i + 1] if i + 1 < len(starts) else ends[-1]) - starts[i]
        chained = max(starts[i] + cpu_span, recorded_done.get(step, recorded_end), recorded_end)
        bound = chained - recorded_end
        if i == 0 and recorded_backlog_us:
            # The first step less the queue before it (later steps keep the recorded chain: never longer).
            bound = min(bound, max(cpu_span, recorded_done.get(step, starts[0]) - recorded_backlog_us - starts[0]))
        est = min(est, max(gpu_busy, bound))
        window = (recorded_end, chained)
        recorded_end = chained
        rows.append({"step": step, "device": device, "recorded_us": recorded, "est_step_us": est,
                     "window_ts": window[0], "window_end": window[1],
                     # The CPU's own time for the step without the profiler (syncs waiting as replayed).
                     "cpu_us": cpu_new[i + 1] - cpu_new[i],
                     "gpu_busy_us": gpu_busy, "est_idle_us": max(0.0, est - gpu_busy),
                     # No more than the CPU time between this step's start and the next's: where the costs charge
                     # more (another host, another profiler), the profiler cannot have spent it.
                     "profiler_cpu_us": min(spent_before[i + 1] - spent_before[i], max(0.0, cpu_span))})
    return pl.DataFrame(rows, schema={"step": pl.Int64, "device": pl.Int64, "recorded_us": pl.Float64,
                                      "est_step_us": pl.Float64, "window_ts": pl.Float64, "window_end": pl.Float64,
                                      "cpu_us": pl.Float64, "gpu_busy_us": pl.Float64,
                                      "est_idle_us": pl.Float64, "profiler_cpu_us": pl.Float64})
