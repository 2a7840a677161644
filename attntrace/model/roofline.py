"""How close to the hardware a trace runs: every GPU op's FLOPs and bytes (flops.py) against its device's roofs
(peaks.toml), per op class and per op signature, and per step MFU, HFU and coverage (the share of GPU time whose
ops have a model), with the ops that have none listed by time.

An op is the innermost CPU op that launched GPU work; its time is the sum of its kernels' durations. Where that op
has no formula, the nearest op above it that has one and holds no other modelled op takes its kernels (so that
no FLOPs are counted twice). Memcpy and memset events carry their own byte counts."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from attntrace.model import Trace, flops, taxonomy
from attntrace.model.peaks import device_peaks

PRECISIONS = ("bf16", "fp16", "fp8", "tf32", "fp32")
LOOK_UP = 4  # ops above an unmodelled launching op searched for a model
TOP_OPS = 100  # op signatures kept (the plot's points; tables show the first few)
TOP_UNMODELLED = 10
CLOCK_US = 1e-3  # a nanosecond: the finest time a trace's clock tells; a call that took less has no time to judge
CLASS_ORDER = ("gemm", "conv", "attention", "elementwise", "reduction", "norm", "copy", "communication",
               "transfer", "unmodelled")


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)


@dataclass
class Roofs:
    """A device's roofs: TFLOP/s per precision and HBM TB/s, the measured ones where peaks.toml has them."""
    name: str | None
    datasheet: dict[str, float]
    roof: dict[str, float]
    hbm_tbs: float | None
    source: str | None
    measured_source: str | None

    @classmethod
    def of(cls, gpu_name: str | None) -> Roofs:
        entry = device_peaks(gpu_name)
        if entry is None:
            return cls(None, {}, {}, None, None, None)
        datasheet = {p: float(entry[p]) for p in PRECISIONS if entry.get(p)}
        roof = {p: float(entry.get(f"measured_{p}") or v) for p, v in datasheet.items()}
        hbm = entry.get("measured_hbm_tbs") or entry.get("hbm_tbs")
        return cls(entry["name"], datasheet, roof, float(hbm) if hbm else None, entry.get("source"),
                   entry.get("measured_source"))

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.name, "tflops": self.roof, "hbm_tbs": self.hbm_tbs, "datasheet_tflops": self.datasheet,
                "source": self.source, "measured_source": self.measured_source}


@dataclass
class OpCall:
    """One modelled op's run: its cost, where it ran and its GPU time."""
    op: int | None
    name: str
    cost: flops.Cost
    precision: str | None
    step: int | None
    device: int | None
    us: float = 0.0
    kernels: dict[str, float] = field(default_factory=dict)


def bound(cost_flops: float, cost_bytes: float, precision: str | None, roofs: Roofs) -> tuple[str | None, float | None]:
    """(compute or memory, the time in us the op takes at that roof), None where the device's roof is unknown."""
    peak = roofs.roof.get(precision or "") if cost_flops else None
    compute_us = cost_flops / (peak * 1e12) * 1e6 if peak else None
    memory_us = cost_bytes / (roofs.hbm_tbs * 1e12) * 1e6 if roofs.hbm_tbs and cost_bytes else None
    if cost_flops and compute_us is None:
        return None, None  # FLOPs at a precision this device has no roof for: no verdict
    if compute_us is None and memory_us is None:
        return None, None
    if memory_us is None or (compute_us is not None and compute_us >= memory_us):
        return "compute", compute_us
    return "memory", memory_us


class _Collector:
    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.names = trace.op_names
        self.tax = taxonomy.load()
        distributed = trace.meta.distributed or {}
        size = distributed.get("world_size")
        self.ranks = size if isinstance(size, int) and not isinstance(size, bool) and size > 1 else None
        self.costs: dict[int, flops.Cost | None] = {}

    def cost(self, op: int) -> flops.Cost | None:
        if op not in self.costs:
            dims, types, concrete = self.trace.op_input(op)
            self.costs[op] = flops.op_cost(self.names[op], dims, types, concrete, self.ranks,
                                           self.trace.op_strides(op))
        return self.costs[op]

    def cost_all(self, ops: list[int]) -> None:
        """The costs of many ops, each distinct (name, recorded inputs) decoded and counted once."""
        wanted = [op for op in ops if op not in self.costs]
        for op, first in zip(wanted, self.trace.op_args.representatives(wanted, self.names), strict=True):
            self.costs[op] = self.cost(first)

    def owners(self, launching: list[int]) -> dict[int, int | None]:
        """Each launching op's modelled owner: itself, or the nearest op above with a model that holds no other
        modelled launching op."""
        self.cost_all(launching)
        owner: dict[int, int | None] = {op: op if self.cost(op) is not None else None for op in launching}
        missing = [o for o, found in owner.items() if found is None]
        held: set[int] = set()  # ops above a modelled launching op: their FLOPs are counted below them
        for op, found in owner.items() if missing else ():
            if found is not None:
                held.update(self.trace.op_ancestors(op)[:-1])
        candidates = {op: self.trace.op_ancestors(op)[:-1][::-1][:LOOK_UP] for op in missing}
        # Every candidate's cost in one pass: an op at a time was one gather each (0.3 s on a generate() trace).
        self.cost_all(sorted({parent for above in candidates.values() for parent in above}))
        for op, above in candidates.items():
            for parent in above:
                if parent in held:
                    break
                if self.cost(parent) is not None:
                    owner[op] = parent
                    break
        return owner


def _precision(cost: flops.Cost, kernels: dict[str, float], classes: dict[str, str | None]) -> str | None:
    """fp32 FLOPs run at TF32 when a kernel says so (the taxonomy's TF32 class, or the name)."""
    if cost.precision != "fp32" or cost.kind not in ("gemm", "conv", "attention"):
        return cost.precision
    if any(classes.get(k) == "gemm_tf32" or "tf32" in k.lower() for k in kernels):
        return "tf32"
    return "fp32"


def collect(trace: Trace) -> tuple[list[OpCall], pl.DataFrame]:
    """The modelled op runs, and the GPU events (with their step, device and `call` index, null when no model
    covers them) they were made of; once per trace (lint's roofline and AT601 both ask)."""
    if "_roofline_calls" not in trace.__dict__:
        trace.__dict__["_roofline_calls"] = _collect(trace)
    return trace.__dict__["_roofline_calls"]


def _collect(trace: Trace) -> tuple[list[OpCall], pl.DataFrame]:
    gpu = trace.gpu_linked
    if trace.has_step_markers and gpu["step"].is_not_null().any():
        gpu = gpu.filter(pl.col("step").is_not_null())
    gpu = gpu.select("idx", "name", "kind", "cls", "group", "ts", "end", "dur", "bytes", "op", "step", "device")
    collector = _Collector(trace)
    launching = sorted(set(gpu.filter(pl.col("kind") == "kernel")["op"].drop_nulls().to_list()))
    owner = collector.owners(launching)
    calls: list[OpCall] = []
    by_key: dict[tuple[Any, ...], int] = {}
    call_of: list[int | None] = []
    for name, kind, dur, size, op, step, device in gpu.select(
            "name", "kind", "dur", "bytes", "op", "step", "device").iter_rows():
        dur = dur or 0.0
        if kind in ("memcpy", "memset"):
            cost = _transfer_cost(name, kind, size)
            if cost is None:
                call_of.append(None)
                continue
            calls.append(OpCall(None, name, cost, None, step, device, dur, {name: dur}))
            call_of.append(len(calls) - 1)
            continue
        modelled = owner.get(op) if op is not None else None
        if modelled is None:
            call_of.append(None)
            continue
        key = (modelled, step, device)
        at = by_key.get(key)
        if at is None:
            cost = collector.cost(modelled)
            assert cost is not None
            calls.append(OpCall(modelled, collector.names[modelled], cost, None, step, device))
            at = by_key[key] = len(calls) - 1
        call = calls[at]
        call.us += dur
        call.kernels[name] = call.kernels.get(name, 0.0) + dur
        call_of.append(at)
    classes = dict(gpu.select("name", "cls").unique("name").iter_rows())
    for call in calls:
        call.cost = flops.with_list_itemsize(call.cost, call.kernels)
        call.precision = _precision(call.cost, call.kernels, classes)
    return calls, gpu.with_columns(pl.Series("call", call_of, dtype=pl.Int64))


def _transfer_cost(name: str, kind: str, size: Any) -> flops.Cost | None:
    """A memcpy or memset from its own byte count: device-to-device reads and writes HBM, a memset writes it,
    host transfers cross PCIe or NVLink-C2C (no HBM roof)."""
    if not isinstance(size, int) or size <= 0:
        return None
    if kind == "memset":
        return flops.Cost("copy", 0.0, 0.0, float(size), None, f"memset {size} B")
    if "DtoD" in name or "Device -> Device" in name:
        return flops.Cost("copy", 0.0, 0.0, 2.0 * size, None, f"DtoD {size} B")
    return flops.Cost("transfer", 0.0, 0.0, float(size), None, f"{name.split(' ')[1] if ' ' in name else name} "
                                                               f"{size} B")


def _rates(us: float, fl: float, moved: float, at_bound: float | None) -> dict[str, Any]:
    seconds = us * 1e-6
    return {"tflops": _r(fl / seconds / 1e12) if seconds and fl else None,
            "tbs": _r(moved / seconds / 1e12, 4) if seconds and moved else None,
            "intensity": _r(fl / moved, 2) if moved and fl else None,
            "bound_us": _r(at_bound) if at_bound is not None else None,
            "share_of_bound": _r(at_bound / us) if at_bound is not None and us else None,
            "headroom_us": _r(us - at_bound) if at_bound is not None else None}


def analyse(trace: Trace) -> dict[str, Any] | None:
    """`traces[].roofline` (README "Roofline"): None for a trace without GPU work."""
    if not trace.has_gpu:
        return None
    calls, gpu = collect(trace)
    device = trace.devices[0] if trace.devices else None
    roofs = Roofs.of(trace.device_name(device))
    steps = sorted({s for s in gpu["step"].to_list() if s is not None}) or [None]
    n_steps = len(steps)
    total_us = float(gpu["dur"].sum() or 0.0)
    covered_us = float(gpu.filter(pl.col("call").is_not_null())["dur"].sum() or 0.0)
    # Host transfers cross PCIe or NVLink-C2C, whose bandwidth peaks.toml does not hold: bytes, no bound.
    bounds = [bound(c.cost.hw_flops, c.cost.bytes, c.precision, roofs) if c.cost.kind != "transfer" else (None, None)
              for c in calls]
    # A call whose kernels took no time (durations a broken writer left negative or NaN, read as 0, or under the
    # nanosecond a trace's clock can tell) has nothing to hold against its roof: its bound alone read as a headroom
    # of minus the bound.
    bounds = [(verdict, at_us if call.us >= CLOCK_US else None)
              for call, (verdict, at_us) in zip(calls, bounds, strict=True)]

    classes: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for call, (_, at_us) in zip(calls, bounds, strict=True):
        row = classes[call.cost.kind]
        row["us"] += call.us
        row["flops"] += call.cost.hw_flops
        row["bytes"] += call.cost.bytes
        row["calls"] += 1
        if at_us is not None:
            row["bound_us"] += at_us
            row["judged_us"] += call.us
    unmodelled_us = total_us - covered_us
    class_rows = []
    for kind in [k for k in CLASS_ORDER if k in classes]:
        row = classes[kind]
        rates = _rates(row["us"], row["flops"], row["bytes"], row["bound_us"] if row["judged_us"] else None)
        if row["judged_us"] and row["judged_us"] < row["us"]:  # share over the ops that have a roof only
            rates["share_of_bound"] = _r(row["bound_us"] / row["judged_us"])
            rates["headroom_us"] = _r((row["judged_us"] - row["bound_us"]) / n_steps)
        elif rates["headroom_us"] is not None:
            rates["headroom_us"] = _r(rates["headroom_us"] / n_steps)
        if rates["bound_us"] is not None:
            rates["bound_us"] = _r(row["bound_us"] / n_steps)
        class_rows.append({"class": kind, "us_per_step": _r(row["us"] / n_steps),
                           "share_of_gpu": _r(row["us"] / total_us) if total_us else None,
                           "calls_per_step": _r(row["calls"] / n_steps), "flops_per_step": row["flops"] / n_steps,
                           "bytes_per_step": row["bytes"] / n_steps, **rates})
    if unmodelled_us > 0:
        class_rows.append({"class": "unmodelled", "us_per_step": _r(unmodelled_us / n_steps),
                           "share_of_gpu": _r(unmodelled_us / total_us) if total_us else None})
    return {
        "device": roofs.as_dict(),
        "coverage": _r(covered_us / total_us) if total_us else None,
        "gpu_us_per_step": _r(total_us / n_steps),
        **_step_figures(trace, calls, gpu, roofs),
        "classes": class_rows,
        "ops": _op_rows(calls, bounds, n_steps, total_us, roofs),
        "unmodelled": _unmodelled(trace, gpu, n_steps, total_us),
    }


def _op_rows(calls: list[OpCall], bounds: list[tuple[str | None, float | None]], n_steps: int, total_us: float,
             roofs: Roofs) -> list[dict[str, Any]]:
    """Op signatures (name, shapes, precision) by GPU time: one point of the roofline each."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for call, (verdict, at_us) in zip(calls, bounds, strict=True):
        key = (call.name, call.cost.shape, call.precision, call.cost.kind)
        row = groups.setdefault(key, {"us": 0.0, "flops": 0.0, "model_flops": 0.0, "bytes": 0.0, "calls": 0,
                                      "bound": verdict, "bound_us": 0.0 if at_us is not None else None,
                                      "kernels": defaultdict(float)})
        row["us"] += call.us
        row["flops"] += call.cost.hw_flops
        row["model_flops"] += call.cost.flops
        row["bytes"] += call.cost.bytes
        row["calls"] += 1
        if at_us is not None and row["bound_us"] is not None:
            row["bound_us"] += at_us
        for kernel, us in call.kernels.items():
            row["kernels"][kernel] += us
    out = []
    for (name, shape, precision, kind), row in groups.items():
        rates = _rates(row["us"], row["flops"], row["bytes"], row["bound_us"])
        roof = roofs.roof.get(precision or "") if row["flops"] else None
        out.append({"op": name, "class": kind, "shape": shape, "precision": precision,
                    "calls_per_step": _r(row["calls"] / n_steps), "us_per_step": _r(row["us"] / n_steps),
                    "share_of_gpu": _r(row["us"] / total_us) if total_us else None,
                    "flops_per_call": row["flops"] / row["calls"],
                    "model_flops_per_call": row["model_flops"] / row["calls"],
                    "bytes_per_call": row["bytes"] / row["calls"], "bound": row["bound"],
                    "roof_tflops": roof, **rates,
                    "bound_us": _r(row["bound_us"] / n_steps) if row["bound_us"] is not None else None,
                    "headroom_us": _r((row["us"] - row["bound_us"]) / n_steps) if row["bound_us"] is not None
                    else None,
                    "kernel": max(row["kernels"], key=lambda k: (row["kernels"][k], k))})
    out.sort(key=lambda r: (-r["us_per_step"], r["op"], r["shape"]))
    return out[:TOP_OPS]


def _unmodelled(trace: Trace, gpu: pl.DataFrame, n_steps: int, total_us: float) -> list[dict[str, Any]]:
    """GPU time no model covers, by launching op (the kernel's name when no op launched it), and why."""
    names, cats = trace.op_names, trace.op_cats
    rest = gpu.filter(pl.col("call").is_null())
    if not rest.height:
        return []
    shapes = trace.has_shapes
    rows: dict[str, list[Any]] = {}
    for name, op, dur in rest.select("name", "op", "dur").iter_rows():
        outside = op is not None and cats[op] == "user_annotation"  # launched in a step or range, under no op
        label = names[op] if op is not None and not outside else f"kernel {name[:80]}"
        if op is None:
            why = "no launching op in the trace"
        elif outside:
            why = f"launched under {names[op][:40]}, outside any op (a Triton launcher or CUDA graph)"
        elif not shapes:
            why = "no input shapes (record_shapes off)"
        elif trace.op_input(op)[0] is None:
            why = "this op has no recorded shapes"
        else:
            why = "no formula for this op or these shapes"
        row = rows.setdefault(label, [0.0, why, defaultdict(float)])
        row[0] += dur or 0.0
        row[2][name] += dur or 0.0
    ordered = sorted(rows.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_UNMODELLED]
    return [{"op": label, "us_per_step": _r(us / n_steps), "share_of_gpu": _r(us / total_us) if total_us else None,
             "reason": why, "kernel": max(kernels, key=lambda k: (kernels[k], k))}
            for label, (us, why, kernels) in ordered]


def _step_figures(trace: Trace, calls: list[OpCall], gpu: pl.DataFrame, roofs: Roofs) -> dict[str, Any]:
    """Per step and device: model and hardware FLOPs, MFU and HFU against the datasheet peak of the precision
    that holds most FLOPs, and coverage; the medians over the steady steps."""
    by_precision: dict[str, float] = defaultdict(float)
    for call in calls:
        if call.precision and call.cost.flops:
            by_precision[call.precision] += call.cost.flops
    precision = max(by_precision, key=lambda p: (by_precision[p], p)) if by_precision else None
    peak = roofs.datasheet.get(precision or "")
    step_us = {(s, d): us for s, d, us in trace.step_table.select("step", "device", "step_us").iter_rows()} \
        if trace.has_step_markers else {}
    # The step as it would run without the profiler (model/replay.py): the MFU the program itself reaches.
    est_us = {(s, d): us for s, d, us in trace.replay.table.select("step", "device", "est_step_us").iter_rows()} \
        if trace.has_step_markers and trace.replay.table.height else {}
    model: dict[tuple[Any, Any], float] = defaultdict(float)
    hardware: dict[tuple[Any, Any], float] = defaultdict(float)
    for call in calls:
        model[(call.step, call.device)] += call.cost.flops
        hardware[(call.step, call.device)] += call.cost.hw_flops
    totals = gpu.group_by("step", "device").agg(pl.col("dur").sum().alias("us"),
                                                pl.col("dur").filter(pl.col("call").is_not_null()).sum().alias("known"))
    rows = []
    for step, device, us, known in totals.sort(["step", "device"], nulls_last=True).iter_rows():
        wall = step_us.get((step, device))
        if wall is None and not trace.has_step_markers:  # no steps: the device's span of GPU work is the window
            span = gpu.filter(pl.col("device") == device) if device is not None else gpu
            wall = float(span["end"].max() - span["ts"].min()) if span.height else None
        denominator = wall * 1e-6 * peak * 1e12 if wall and peak else None
        est = est_us.get((step, device))
        rows.append({"step": step, "device": device, "step_us": _r(wall), "est_step_us": _r(est),
                     "model_flops": model.get((step, device), 0.0), "hw_flops": hardware.get((step, device), 0.0),
                     "mfu": _r(model.get((step, device), 0.0) / denominator, 4) if denominator else None,
                     "hfu": _r(hardware.get((step, device), 0.0) / denominator, 4) if denominator else None,
                     "mfu_est": _r(model.get((step, device), 0.0) / (est * 1e-6 * peak * 1e12), 4)
                     if est and peak else None,
                     "coverage": _r(known / us) if us else None})
    steady = set(trace.steady_steps)
    chosen = [r for r in rows if r["step"] in steady] or rows

    def median(key: str) -> float | None:
        values = [r[key] for r in chosen if r[key] is not None]
        return _r(statistics.median(values), 4) if values else None

    return {"mfu": median("mfu"), "hfu": median("hfu"), "mfu_est": median("mfu_est"), "mfu_precision": precision,
            "mfu_peak_tflops": peak, "per_step": rows}
