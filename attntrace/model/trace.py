"""The one view of a trace that rules, summaries and diffs use: tables, links, op tree, steps and devices."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import polars as pl

from attntrace.model import links, optree, taxonomy
from attntrace.model.intervals import busy_us
from attntrace.model.measured import Calibration, Measured, Spread, calibrate, scaled, spread_for
from attntrace.model.plain import collect_plain
from attntrace.model.replay import INDUCTOR_KERNEL_OP, Change, ProfilerCosts, Replay, replay
from attntrace.model.steps import STEP_NAME, Steps, assign, find_steps
from attntrace.model.whatif import WallSaving, sample_steps, wall_savings
from attntrace.read.decoding import decode_raw
from attntrace.read.events import Args
from attntrace.read.raw import FileIdentity

if TYPE_CHECKING:
    from attntrace.model.tables import OpInputs

PY_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>[0-9]+)\): (?P<function>.+)$")
# Frames that are not the user's code: the interpreter, torch and installed libraries.
LIBRARY_FRAMES = r"^<|torch/|site-packages/|dist-packages/|click/|contextlib|threading\.py|runpy"
# Real op stacks are tens of ops deep. Ops that share one start time nest by containment into one chain as long
# as the thread (a clock that stood still): each op's kept chain is cut to its innermost ops, or keeping every
# op's chain would take memory quadratic in that length (a 24 MB trace of such ops peaked at 3 GB).
MAX_OP_DEPTH = 128
AMD_VENDOR = re.compile(r"AMD|Instinct|Radeon|gfx\d", re.IGNORECASE)
# How far before the CPU call that launched it a GPU event may seem to start: the GPU's clock is mapped onto the
# CPU's, and none of 157 Kineto traces of the corpus and samples had one start before its launch at all.
CLOCK_SLACK_US = 1.0


@dataclass(frozen=True)
class TraceMeta:
    devices: list[dict[str, Any]]
    flags: dict[str, bool]
    versions: dict[str, Any]
    distributed: dict[str, Any] | None
    dropped_events: int
    notes: list[str] = field(default_factory=list)
    incomplete: bool = False
    measured: Measured | None = None  # the steps timed without the profiler in the capturing run (model/measured.py)
    profiler: str = "torch.profiler"  # the tool that recorded the trace: "nsys" for an Nsight Systems export
    file: FileIdentity | None = None  # the regular file read, as it was then: what reads it again checks it is

    def device(self, index: int | None) -> dict[str, Any]:
        """Properties of a GPU by index; the first one when the index is unknown."""
        for props in self.devices:
            if props.get("id") == index:
                return props
        return self.devices[0] if self.devices else {}

    @property
    def rank(self) -> int | None:
        rank = (self.distributed or {}).get("rank")
        # A rank past 64 bits is no rank (and no JSON output could carry it).
        valid = isinstance(rank, int) and not isinstance(rank, bool) and -(2**63) <= rank < 2**63
        return rank if valid else None

    def vendor(self, index: int | None) -> str:
        """nvidia, amd or unknown: occupancy limits and launch APIs differ by vendor."""
        props = self.device(index)
        name = str(props.get("name") or "")
        if AMD_VENDOR.search(name) or "gcnArchName" in props or self.versions.get("hip_runtime_version"):
            return "amd"
        if "computeMajor" in props or "NVIDIA" in name or "Tesla" in name or "Quadro" in name:
            return "nvidia"
        return "unknown"


def _shared_strings(column: pl.Series) -> list[str]:
    """A text column as a list whose equal values are one str object: a million ops have a few thousand
    names, and a str per row took 30 MB more."""
    if column.null_count():
        return column.to_list()
    values = column.unique(maintain_order=True).to_list()
    return list(map(values.__getitem__, column.cast(pl.Enum(values)).to_physical().to_list()))


def _same_thread(row: dict[str, Any]) -> pl.Expr:
    """Events of an op's process and thread. Compared as text: a table's pid or tid is text where one of its
    events has a text pid ("Spans"), and the op's table and the Python events' table need not agree."""
    return ((pl.col("pid").cast(pl.String) == str(row["pid"]))
            & (pl.col("tid").cast(pl.String) == str(row["tid"])))


def _decoded(args: Args) -> tuple[Any, Any, Any]:
    return (_as_dims(decode_raw(args.input_dims)), _as_types(decode_raw(args.input_types)),
            _as_list(decode_raw(args.concrete_inputs)))


def _as_list(value: Any) -> list[Any] | None:
    return value if isinstance(value, list) else None


def _as_types(value: Any) -> list[str] | None:
    """Input type as a list of type names: an element that is not text (a list, a number) is an unknown type,
    "", as PyTorch writes for inputs that are not tensors; rules look the names up."""
    if not isinstance(value, list):
        return None
    return [t if isinstance(t, str) else "" for t in value]


def _is_dim(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def _as_dims(value: Any) -> list[Any] | None:
    """Input Dims as a list of shapes (lists): writers that put an integer where a shape goes ("Input Dims": 5,
    or [2, 3]) get each integer as a one-dimensional shape, anything else as an empty one (unknown), and so
    does a shape with a size past 64 bits, which no tensor has and no report could write."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [[value]] if _is_dim(value) else [[]]
    if not isinstance(value, list):
        return None
    return [_as_shape(d) if isinstance(d, list) else [d] if _is_dim(d) else [] for d in value]


def _as_shape(shape: list[Any]) -> list[Any]:
    """A shape kept, or [] (unknown). Plain integers, the common case, are checked by their least and greatest
    (a call per size was most of AT101's time on a 185 MB trace with shapes)."""
    if all(type(x) is int for x in shape):
        return shape if not shape or (min(shape) >= -(2**63) and max(shape) < 2**63) else []
    return shape if all(_is_dim(x) or isinstance(x, list) for x in shape) else []


@dataclass
class Trace:
    path: str
    size: int
    meta: TraceMeta
    ops: pl.DataFrame  # cpu_op and user_annotation: idx, name, cat, pid, tid, ts, dur, end, external_id, ...
    launches: pl.DataFrame  # runtime and driver calls: ..., correlation, external_id, api_kind, is_launch
    gpu: pl.DataFrame  # kernels, memcpys, memsets: ..., kind, cls, group, correlation, device, stream, launch config
    gpu_annotations: pl.DataFrame
    flows: pl.DataFrame
    op_args: OpInputs  # each op's args, in ops-table order, for its raw input fields
    python: pl.DataFrame  # python_function frames (with_stack): name "file.py(line): func", pid, tid, ts, end
    label: str = ""  # the trace's identity across runs (model/identity.py); its file name's when not set
    # Kept as rules ask: each op's ancestor chain, each op's decoded inputs, and results several rules use (AT102's
    # unfused attention chains, which AT101 also reads), keyed by the function and its parameters.
    _ancestors: dict[int, tuple[int, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _inputs: dict[int, tuple[Any, Any, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)
    shared: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    # --- steps ------------------------------------------------------------------------------------
    @cached_property
    def step_info(self) -> Steps:
        return find_steps(self.ops, self.op_parent, self.launches, self.gpu)

    @property
    def steps(self) -> pl.DataFrame:
        """Step windows: pid (null for the whole-trace window), step, ts, end, capture."""
        return self.step_info.windows

    @property
    def has_step_markers(self) -> bool:
        """The trace shows its steps (ProfilerStep markers, or iterations inferred from recurring markers)."""
        return self.step_info.marked and bool(self.steps.height)

    @cached_property
    def device_process(self) -> dict[int, str]:
        """Each device's driving process (the one that launched most of its work)."""
        linked = self.gpu_linked.filter(pl.col("launch_pid").is_not_null() & pl.col("device").is_not_null())
        counts = linked.group_by("device", "launch_pid").len().sort(["device", "len", "launch_pid"],
                                                                     descending=[False, True, False])
        return {int(d): str(p) for d, p in counts.unique("device", keep="first").select("device", "launch_pid")
                .iter_rows()}

    @cached_property
    def step_table(self) -> pl.DataFrame:
        """One row per step and device that worked in it (a step where no device worked: one row, the first
        device's): step, device, cpu_us (the step's CPU window), gpu_busy_us (union of the
        device's streams), compute_us, comm_us, overlap_us (compute and communication at once), kernels,
        memcpy, memset, kernel_us, compute_kernel_us (union of the kernels that are not communication: no copies, no
        memsets), launches, launch_cpu_us, capture, and step_us = max(cpu_us, gpu_busy_us)."""
        windows = self.steps
        gpu = self.gpu_linked.filter(pl.col("step").is_not_null())
        devices = sorted(int(d) for d in gpu["device"].drop_nulls().unique().to_list())
        # A row for each device that worked in the step, and one (the first device's) for a step where none did.
        # (Every step times every device was 2.5M rows and 4 GB for 5,000 steps on 500 devices that each worked
        # in one step.)
        worked = gpu.select("step", pl.col("device").cast(pl.Int64)).drop_nulls().unique()
        idle = (windows.select("step").unique().join(worked.select("step").unique(), on="step", how="anti")
                .with_columns(pl.lit(devices[0] if devices else None, dtype=pl.Int64).alias("device")))
        rows = pl.concat([worked, idle]).lazy()
        cpu = self._cpu_windows(windows, rows)
        comm = gpu["group"] == taxonomy.COMMUNICATION
        keys = ["step", "device"]
        total = busy_us(gpu, ["step"]).rename({"busy_us": "gpu_busy_us"})
        compute = busy_us(gpu.filter(~comm), ["step"]).rename({"busy_us": "compute_us"})
        communication = busy_us(gpu.filter(comm), ["step"]).rename({"busy_us": "comm_us"})
        # A copy-bound step's compute is its kernels: 920 ms of host copies a second hid 39 ms of FP32 GEMMs, 87%
        # of the kernels' time, behind "4% of compute".
        kernels = busy_us(gpu.filter(~comm & (pl.col("kind") == "kernel")), ["step"]).rename(
            {"busy_us": "compute_kernel_us"})
        counts = gpu.lazy().group_by(keys).agg(
            (pl.col("kind") == "kernel").sum().alias("kernels"),
            (pl.col("kind") == "memcpy").sum().alias("memcpy"),
            (pl.col("kind") == "memset").sum().alias("memset"),
            pl.col("dur").filter(pl.col("kind") == "kernel").sum().alias("kernel_us"))
        launches = (self.launches_on_devices.lazy().filter(pl.col("is_launch") & pl.col("step").is_not_null())
                    .group_by(keys).agg(pl.len().alias("launches"), pl.col("dur").sum().alias("launch_cpu_us")))
        # One query for the joins and columns: a query's fixed cost is most of a small trace's time, and these
        # were a dozen of them per trace.
        table = rows.join(cpu, on=keys, how="left", nulls_equal=True)
        for part in (total.lazy(), compute.lazy(), communication.lazy(), kernels.lazy(), counts, launches):
            table = table.join(part.with_columns(pl.col("device").cast(pl.Int64)), on=keys, how="left",
                               nulls_equal=True)
        return collect_plain(table.with_columns(
            pl.col("cpu_us", "gpu_busy_us", "compute_us", "comm_us", "kernel_us", "compute_kernel_us", "launch_cpu_us")
            .cast(pl.Float64).fill_null(0.0),
            pl.col("kernels", "memcpy", "memset", "launches").fill_null(0).cast(pl.Int64),
            pl.col("capture").fill_null(False),
        ).with_columns(
            (pl.col("compute_us") + pl.col("comm_us") - pl.col("gpu_busy_us")).clip(lower_bound=0.0)
            .alias("overlap_us"),
            pl.max_horizontal("cpu_us", "gpu_busy_us").alias("step_us"),
        ).select("step", "device", "cpu_us", "gpu_busy_us", "compute_us", "comm_us", "overlap_us", "kernels",
                 "memcpy", "memset", "kernel_us", "compute_kernel_us", "launches", "launch_cpu_us", "capture", "step_us"
                 ).sort(keys, nulls_last=True))

    def _cpu_windows(self, windows: pl.DataFrame, rows: pl.LazyFrame) -> pl.LazyFrame:
        """The CPU window of each (step, device): that of the device's driving process, else the step's first."""
        spans = windows.lazy().select("pid", "step", (pl.col("end") - pl.col("ts")).alias("cpu_us"), "capture")
        owner = pl.LazyFrame({"device": list(self.device_process), "pid": list(self.device_process.values())},
                             schema={"device": pl.Int64, "pid": pl.String})
        own = rows.join(owner, on="device", how="left").join(spans, on=["pid", "step"], how="left")
        first = spans.unique("step", keep="first", maintain_order=True).select(
            "step", pl.col("cpu_us").alias("any_us"), pl.col("capture").alias("any_capture"))
        return (own.join(first, on="step", how="left")
                .select("step", "device", pl.coalesce("cpu_us", "any_us").alias("cpu_us"),
                        pl.coalesce("capture", "any_capture").alias("capture")))

    @property
    def _profiler_costs(self) -> ProfilerCosts:
        costs = self.shared.get("profiler_costs")
        return costs if isinstance(costs, ProfilerCosts) else ProfilerCosts.default()

    @cached_property
    def estimate(self) -> Replay:
        """The steady steps replayed without the profiler's own CPU cost (model/replay.py), with the per-event
        costs the caller set in `shared["profiler_costs"]` (the config's), else the measured defaults: the estimate,
        whether or not the trace carries a measured step."""
        return replay(self, self._profiler_costs)

    @cached_property
    def calibration(self) -> Calibration | None:
        """The replay fitted to the step measured without the profiler in the capturing run (attntrace.profile),
        where the trace carries one and a replay can be made; None otherwise."""
        measured = self.meta.measured
        if measured is None or measured.step_us is None:
            return None
        return calibrate(self, self._profiler_costs, self.estimate, measured.step_us)

    @cached_property
    def replay(self) -> Replay:
        """The replay the rules judge: calibrated to the measured step where the trace has one, else the estimate."""
        return self.calibration.replay if self.calibration is not None else self.estimate

    @property
    def estimate_spread(self) -> Spread | None:
        """How sure the estimate without the profiler is, from the calibration captures recorded like this trace
        (compiled or eager, with or without stacks); None where the step was measured."""
        if self.calibration is not None:
            return None
        compiled = bool(self.ops.height) and bool(self.ops["name"].str.starts_with(INDUCTOR_KERNEL_OP).any())
        return spread_for(self.estimate.settings, compiled)

    @property
    def step_basis(self) -> str:
        """How the step without the profiler is known: "measured" (in the capturing run) or "estimated"."""
        return "measured" if self.calibration is not None else "estimated"

    @cached_property
    def whatif_steps(self) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        """The steps a what-if replays: up to WHATIF_STEPS steady steps from the middle of the run, with the step
        before them as a lead-in (its queue and clock carry into the first). A replay is a Python loop over every
        GPU event: a sample keeps lint's cost of a finding's what-if small on long traces."""
        return sample_steps(self.replay)

    @cached_property
    def critical_path(self) -> Replay:
        """The sampled steps replayed with each step's critical path (Replay.paths): asked for by summary and
        AT402 only."""
        return replay(self, self._judged_costs, with_path=True, only_steps=self.whatif_steps[0])

    @cached_property
    def whatif_base(self) -> Replay:
        """The sampled steps replayed with no change: what each what-if is held against (no path walk: a rule's
        what-if needs none). The critical path's replay where it was made (summary makes it): the same steps, the
        same placement, the paths besides (the tables matched on 263 sample and corpus traces), and one Python pass
        over the GPU events fewer (0.3 s of a 185 MB trace's lint)."""
        if "critical_path" in self.__dict__:
            return self.critical_path
        return replay(self, self._judged_costs, only_steps=self.whatif_steps[0])

    def whatif(self, change: Change) -> list[WallSaving]:
        """Each device's step without the profiler before and after `change` (model/whatif.py), over the sampled
        steps (their lead-in left out), one replay per change asked for."""
        cache = self.__dict__.setdefault("_whatif", {})
        if change not in cache:
            cache[change] = wall_savings(self.whatif_base, replay(
                self, self._judged_costs, change, only_steps=self.whatif_steps[0]), self.whatif_steps[1])
        return cache[change]

    def judged_paths(self, replayed: Replay) -> list[dict[str, Any]]:
        """A sampled replay's critical paths of the steps a what-if judges: steady, the lead-in left out."""
        judged = self.whatif_steps[1]
        steady = set(zip(self.replay.steady["step"].to_list(), self.replay.steady["device"].to_list(), strict=True))
        return [p for p in replayed.paths
                if (p["step"], p["device"]) in steady and (judged is None or p["step"] in judged)]

    def whatif_replay(self, change: Change) -> Replay:
        """The sampled steps replayed with `change` applied, with each step's critical path (`whatif`'s after)."""
        return replay(self, self._judged_costs, change, with_path=True, only_steps=self.whatif_steps[0])

    @property
    def _judged_costs(self) -> ProfilerCosts:
        """The per-event costs of the replay the rules judge: calibrated to the measured step where there is one, so
        that every what-if inherits the calibration."""
        calibration = self.calibration
        return scaled(self._profiler_costs, calibration.scale) if calibration is not None else self._profiler_costs

    @property
    def profiler_costs_from(self) -> str:
        """Where the replay's per-event costs come from, as summary and AT402 name it."""
        if isinstance(self.shared.get("profiler_costs"), ProfilerCosts):
            return "config"
        refused = self.shared.get("profiler_costs_refused")
        return "defaults (attntrace/profiler_cost.toml)" + (f"; the config's were {refused}" if refused else "")

    @property
    def steady_steps(self) -> list[int]:
        """Step numbers that are not graph captures (a new list each time: the callers' to change)."""
        return list(self._steady_steps)

    @cached_property
    def clock_notes(self) -> list[str]:
        """A note where GPU events start before the CPU call that launched them: the trace's clocks disagree (every
        timestamp negated, a hand-edited or merged trace) or its links are wrong, and what time tells (each launch's
        op, each step's work) is not to be trusted. Its ops' kernels then ran up to 17x past their roofs, with no
        word."""
        linked = self.gpu_linked
        if "launch_ts" not in linked.columns:
            return []
        lead = (linked["launch_ts"] - linked["ts"]).drop_nulls()
        early = lead.filter(lead > CLOCK_SLACK_US)
        if not early.len():
            return []
        # Or the correlation ids link the wrong calls: 16 of an Nsight export's 2,108 "started" up to 0.9 s before
        # a cudaEventDestroy or a cudaStreamWaitEvent.
        return [f"{early.len()} of {lead.len()} GPU event(s) start before the CPU call linked to them as their launch "
                f"(by up to {early.max():.6g} us): the trace's CPU and GPU clocks disagree, or its correlation ids "
                "link the wrong calls; the ops and steps given to those events may be wrong"]

    @cached_property
    def steady_gpu(self) -> pl.DataFrame:
        """GPU activity inside steady-state steps (not graph captures), linked to its launch and op. Kept here, not
        by each rule: a query per rule was a tenth of a small trace's."""
        return self.gpu_linked.filter(pl.col("step").is_in(self._steady_steps))

    @cached_property
    def steady_step_table(self) -> pl.DataFrame:
        """step_table without graph captures."""
        return self.step_table.filter(~pl.col("capture"))

    @cached_property
    def _steady_steps(self) -> tuple[int, ...]:
        # Asked by every rule's context and by the replay: a query each time was a dozen per trace.
        return tuple(sorted(int(s) for s in self.steps.filter(~pl.col("capture"))["step"].unique().to_list()))

    @cached_property
    def steps_per_process(self) -> dict[str | None, int]:
        """Steady-state windows (graph captures left out) of each process that marked steps (None: the whole trace
        as one window), those that launched GPU work where some did: an empty trailing ProfilerStep (49 us after
        a 9 ms step on HTA's MI250 trace) is no step of the program, and halved every count per step."""
        windows = self.steps.filter(~pl.col("capture"))
        worked = (self.gpu_linked.filter(pl.col("step").is_not_null() & pl.col("launch_pid").is_not_null())
                  .select(pl.col("launch_pid").cast(pl.String).alias("pid"), "step").unique())
        counts = (windows.join(worked.with_columns(pl.lit(True).alias("worked")), on=["pid", "step"], how="left")
                  .group_by("pid").agg(pl.len().alias("all"), pl.col("worked").sum().alias("working")))
        return {pid: int(working) or int(n) for pid, n, working in
                counts.sort("pid", nulls_last=True).select("pid", "all", "working").iter_rows()}

    @cached_property
    def step_count(self) -> int:
        """Steps of one process (the one that marked most): the steps a trace shows. Counts "per step" of rows
        from given processes divide by checks.base.Context.steps_in's count instead."""
        return max(1, *self.steps_per_process.values()) if self.steps_per_process else 1

    # --- links ------------------------------------------------------------------------------------
    @cached_property
    def launches_linked(self) -> pl.DataFrame:
        """Launch calls with their step (in their own process's window), launching op and device."""
        frame = assign(self.launches, self.steps)
        frame = frame.with_columns(pl.Series("op", optree.innermost_ops(frame, self.ops, self.op_parent),
                                             dtype=pl.Int64))
        return frame

    @cached_property
    def gpu_linked(self) -> pl.DataFrame:
        """GPU activity with its launch, launching op, launch_pid and step.

        A GPU event takes the step of the CPU call that launched it. One with no recorded launch (work
        queued before profiling began, or a dropped launch) takes the GPU-side ProfilerStep window that it
        starts in; a trace with no launch links at all, or no steps (the whole trace is one window), falls back to
        the CPU step windows."""
        gpu = links.correlation_from_flows(self.gpu, self.flows, self.launches)
        linked = links.link_gpu(gpu, self.launches_linked)
        # With the whole trace as one window, an event whose launch is not in the trace (queued before the capture
        # began: an Nsight Systems export cut to a time range) is still in it.
        if linked["launch"].is_not_null().any() and self.step_info.marked:
            by_time = links.gpu_step_windows(linked, self.gpu_annotations)
        else:
            by_time = assign(linked.drop("launch_step"), self.steps, by_process=False).select(
                "idx", pl.col("step").alias("time_step"))
        return collect_plain(linked.lazy().join(by_time.lazy(), on="idx", how="left")
                             .with_columns(pl.coalesce("launch_step", "time_step").alias("step"))
                             .drop("launch_step", "time_step").sort("idx"))

    @cached_property
    def launches_on_devices(self) -> pl.DataFrame:
        """launches_linked with the device its GPU work ran on; a launch whose work is not in the trace goes to
        its process's device (null when the process drives none or several)."""
        ran_on = (self.gpu_linked.lazy().filter(pl.col("launch").is_not_null())
                  .select(pl.col("launch").alias("idx"), "device").unique("idx", keep="first"))
        by_process: dict[str, list[int]] = {}
        for device, pid in self.device_process.items():
            by_process.setdefault(pid, []).append(device)
        own = pl.LazyFrame({"proc": list(by_process), "proc_device": [d[0] if len(d) == 1 else None
                                                                       for d in by_process.values()]},
                           schema={"proc": pl.String, "proc_device": pl.Int64})
        return collect_plain(self.launches_linked.lazy().join(ran_on, on="idx", how="left")
                             .with_columns(pl.col("pid").cast(pl.String).alias("proc"))
                             .join(own, on="proc", how="left")
                             .with_columns(pl.coalesce(pl.col("device").cast(pl.Int64), "proc_device")
                                           .alias("device"))
                             .drop("proc", "proc_device").sort("idx"))

    # --- op tree ----------------------------------------------------------------------------------
    @cached_property
    def op_parent(self) -> list[int | None]:
        return optree.op_parents(self.ops)

    @cached_property
    def op_children(self) -> optree.Children:
        return optree.op_children(self.ops, self.op_parent)

    def op_ancestors(self, op: int | None) -> list[int]:
        """Op indices from the outermost op down to `op`, without ProfilerStep annotations, at most MAX_OP_DEPTH
        of them (the innermost). Each op's chain is kept: siblings share their parent's (rules ask for tens of
        thousands of ops)."""
        known, names, parent = self._ancestors, self.op_names, self.op_parent
        below: list[int] = []
        chain: tuple[int, ...] = ()
        while op is not None and len(below) < MAX_OP_DEPTH:
            if op in known:
                chain = known[op]
                break
            if STEP_NAME.match(names[op]):
                break
            below.append(op)
            op = parent[op]
        for op in reversed(below):
            chain = known[op] = (*chain, op)[-MAX_OP_DEPTH:]
        return list(chain)

    def op_chain(self, op: int | None) -> list[str]:
        """Names from the outermost op down to `op`, e.g. aten::masked_fill > aten::clone > aten::copy_."""
        names = self.op_names
        return [names[i] for i in self.op_ancestors(op)]

    @cached_property
    def ops_stepped(self) -> pl.DataFrame:
        """The ops with the step they start in."""
        return assign(self.ops, self.steps)

    @cached_property
    def op_names(self) -> list[str]:
        return _shared_strings(self.ops["name"])

    @cached_property
    def op_cats(self) -> list[str]:
        return _shared_strings(self.ops["cat"])

    @cached_property
    def op_pids(self) -> list[str | None]:
        # One str per process, not per op: 148k ops' own strings took 7 MB at a 185 MB trace's peak.
        return _shared_strings(self.ops["pid"].cast(pl.String))

    def op_input(self, op: int) -> tuple[Any, Any, Any]:
        """(Input Dims, Input type, Concrete Inputs) of an op, decoded on demand."""
        found = self._inputs.get(op)
        if found is None:
            found = self._inputs[op] = _decoded(self.op_args[op])
        return found

    def prefetch_inputs(self, ops: Iterable[int | None]) -> None:
        """Decode the input fields of many ops at once, for a rule that will ask for each of them."""
        wanted = sorted({op for op in ops if op is not None} - self._inputs.keys())
        self._inputs.update(zip(wanted, map(_decoded, self.op_args.take(wanted)), strict=True))

    def op_strides(self, op: int) -> list[Any] | None:
        """Input Strides of an op (a stride of 0 is a broadcast dimension), decoded on demand; None where the
        profiler did not record them."""
        return _as_dims(decode_raw(self.op_args[op].input_strides))

    @property
    def has_shapes(self) -> bool:
        return bool(self.meta.flags.get("record_shapes")) or any(a.input_dims for a in self.op_args[:2000])

    def source_of(self, op: int | None) -> dict[str, Any] | None:
        """The user's Python function around an op (innermost frame outside torch and libraries), from the
        trace's Python stacks; None without with_stack. Kineto names a frame by the function's first line."""
        if op is None or not self.python.height:
            return None
        row = self.ops.row(op, named=True)
        frames = self.python.filter(
            _same_thread(row) & (pl.col("ts") <= row["ts"]) & (pl.col("end") >= row["ts"])
            & ~pl.col("name").str.contains(LIBRARY_FRAMES)).sort("ts")
        if not frames.height:
            return None
        match = PY_FRAME.match(frames["name"][-1])
        # A line that no file has (0, or past what a 32-bit line number holds) names no place in the code; its
        # length is asked first (int() refuses 5,000 digits).
        if not match or len(match["line"]) > 10 or not 1 <= int(match["line"]) < 2**31:
            return None
        return {"file": match["file"], "line": int(match["line"]), "function": match["function"]}

    def stack_files(self, op: int | None) -> list[str]:
        """The files of every Python frame around an op, library frames too (with_stack), or of the whole trace
        for no op; [] without stacks."""
        if not self.python.height:
            return []
        if op is None:
            return sorted({m["file"] for m in map(PY_FRAME.match, self.python["name"].unique().to_list()) if m})
        row = self.ops.row(op, named=True)
        names = self.python.filter(
            _same_thread(row) & (pl.col("ts") <= row["ts"]) & (pl.col("end") >= row["ts"]))["name"].to_list()
        return [m["file"] for m in map(PY_FRAME.match, names) if m]

    # --- devices ----------------------------------------------------------------------------------
    @property
    def has_gpu(self) -> bool:
        return self.gpu.height > 0

    @cached_property
    def devices(self) -> list[int]:
        return sorted(int(d) for d in self.gpu["device"].drop_nulls().unique().to_list())

    def device_name(self, index: int | None) -> str | None:
        """The device's name as the trace gives it; None when it gives none, or no text (a hostile trace's number)."""
        name = self.meta.device(index).get("name")
        return name if isinstance(name, str) else None
