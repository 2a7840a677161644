"""The comparison table of `attntrace run`, built from the traces it wrote (no torch needed): time, useful
FLOP/s against the device's peak for the precision used, estimated memory traffic against its HBM peak,
the profiler's own cost, and a verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attntrace.model.flops import attended_pairs, attention_flops, op_bytes
from attntrace.model.peaks import device_peaks

__all__ = ["analyse_run", "attended_pairs", "attention_flops", "op_bytes", "peak_for", "table_rows"]


def precision(dtype: str, tf32: bool) -> str:
    """Which peak a run's matmuls are held to: the 16-bit tensor-core one, TF32, or plain FP32."""
    return dtype if dtype in ("bf16", "fp16") else ("tf32" if tf32 else "fp32")


def peak_for(environment: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The peak used for % peak and % HBM, and which one it is; `tflops` None with a reason when unknown."""
    gpu = environment.get("gpu")
    if not gpu:
        return {"device": None, "precision": None, "tflops": None, "hbm_tbs": None,
                "reason": "no peak for a CPU run"}
    entry = device_peaks(gpu)
    kind = precision(dtype, bool(environment.get("tf32_matmul")))
    if entry is None:
        return {"device": gpu, "precision": kind, "tflops": None, "hbm_tbs": None,
                "reason": f"unknown device {gpu!r}: add it to attntrace/peaks.toml"}
    return {"device": entry["name"], "precision": kind, "tflops": entry.get(kind), "hbm_tbs": entry.get("hbm_tbs"),
            "reason": None}


def bytes_per_step(trace: Any) -> float | None:
    """Estimated bytes moved per step by the ops that launched GPU work, or None when ops without recorded
    shapes (compiled graphs, Triton launches) hold more than a tenth of the GPU time."""
    gpu = trace.gpu_linked
    gpu = gpu.filter(gpu["step"].is_not_null())
    if not gpu.height or not trace.has_shapes:
        return None
    names = trace.op_names
    known_us = unknown_us = 0.0
    total = 0
    seen: dict[int, int | None] = {}
    for op, dur in zip(gpu["op"].to_list(), gpu["dur"].to_list(), strict=True):
        if op is not None and op not in seen:
            dims, types, _ = trace.op_input(op)
            seen[op] = op_bytes(names[op], dims, types)
            total += seen[op] or 0
        if op is not None and seen[op] is not None:
            known_us += dur or 0.0
        else:
            unknown_us += dur or 0.0
    if unknown_us > 0.1 * (known_us + unknown_us):
        return None
    steps = gpu["step"].n_unique()
    return total / steps


# --- the table ------------------------------------------------------------------------------------
def table_rows(results: list[dict[str, Any]], flops: float, peak: dict[str, Any],
               on_gpu: bool = True) -> list[dict[str, Any]]:
    """One row per variant from its run result and trace numbers (per step = one call). On the CPU there
    are no kernels: time, throughput and speed-up come from the timed run without the profiler."""

    def time_ms(r: dict[str, Any]) -> float | None:
        return r["numbers"].get("gpu_ms") if on_gpu else r.get("event_ms")

    baseline = next((time_ms(r) for r in results if r["name"] == "naive" and r["status"] == "ok"), None)
    ridge = peak["tflops"] / peak["hbm_tbs"] if peak.get("tflops") and peak.get("hbm_tbs") else None
    rows = []
    for r in results:
        n = r["numbers"]
        if r["status"] != "ok" or not n:
            rows.append({"variant": r["name"], "status": f"{r['status']}: {r['reason']}"})
            continue
        ms = time_ms(r)
        tflops = flops / (ms * 1e-3) / 1e12 if ms else None
        moved = n.get("bytes") if on_gpu else None
        # Bandwidth is the measure of a memory-bound variant: fewer useful FLOPs per byte than the device's
        # ridge point (all of them when the device is unknown).
        memory_bound = bool(moved and (ridge is None or flops / moved < ridge))
        tbs = moved / (ms * 1e-3) / 1e12 if memory_bound and ms else None
        profiled = n.get("gpu_ms") if on_gpu else n.get("cpu_ms")
        rows.append({
            "variant": r["name"],
            "kernels": n.get("kernels") if on_gpu else None,
            "gpu_ms": n.get("gpu_ms") if on_gpu else None,
            "event_ms": r.get("event_ms"),
            "cpu_ms": n.get("cpu_ms"),
            "copies": n.get("copies") if on_gpu else None,
            "tflops": tflops,
            "peak_pct": 100.0 * tflops / peak["tflops"] if tflops and peak.get("tflops") else None,
            "tbs": tbs,
            "hbm_pct": 100.0 * tbs / peak["hbm_tbs"] if tbs and peak.get("hbm_tbs") else None,
            "profiler_x": profiled / r["event_ms"] if profiled and r.get("event_ms") else None,
            "speedup": baseline / ms if baseline and ms else None,
            "findings": n.get("findings"),
            "status": "ok",
        })
    return rows


def headers(backward: bool) -> dict[str, str]:
    """Column titles, named by what a step measured: one forward, or one forward plus backward."""
    unit = "fwd+bwd" if backward else "fwd"
    return {"variant": "variant", "kernels": f"kernels/{unit}", "gpu_ms": f"GPU ms/{unit}",
            "event_ms": f"timed ms/{unit}", "cpu_ms": f"CPU ms/{unit}", "copies": "copies", "tflops": "TFLOP/s",
            "peak_pct": "% peak", "tbs": "TB/s", "hbm_pct": "% HBM", "profiler_x": "profiler x",
            "speedup": "vs naive", "findings": "findings", "status": "status"}


def _cell(key: str, value: Any) -> Any:
    if value is None:
        return "-"
    if key in ("speedup", "profiler_x"):
        return f"{value:.2f}x"
    if key in ("kernels", "copies") and float(value).is_integer():
        return str(int(value))
    if isinstance(value, float):
        if key.endswith("_ms"):
            return f"{value:.3f}"
        if key in ("tflops", "tbs"):
            return f"{value:.3g}" if value < 10 else f"{value:.1f}"
        return f"{value:.1f}"
    return value


def render(rows: list[dict[str, Any]], backward: bool = False) -> str:
    """The table, without the columns that hold nothing in this run (kernels and GPU time on the CPU)."""
    from tabulate import tabulate

    titles = headers(backward)
    keys = [k for k in titles if k in ("variant", "status") or any(row.get(k) is not None for row in rows)]
    body = [[_cell(k, row.get(k)) for k in keys] for row in rows]
    return tabulate(body, headers=[titles[k] for k in keys], tablefmt="simple", disable_numparse=True)


def peak_line(report: dict[str, Any]) -> str:
    peak = report["peak"]
    if peak.get("tflops") is None:
        return f"peak: {peak['reason']}"
    hbm = f", HBM {peak['hbm_tbs']} TB/s" if peak.get("hbm_tbs") else ""
    return f"peak: {peak['device']}, {peak['precision']} {peak['tflops']} TFLOP/s{hbm} (dense, datasheet)"


def verdict(report: dict[str, Any]) -> str:
    """The fastest variant that passed the float64 check, and its speed-up over naive (or the slowest)."""
    on_gpu = report["config"]["device"] == "cuda"
    unit = "fwd+bwd" if report["config"]["backward"] else "fwd"
    timed = [(row["gpu_ms"] if on_gpu else row["event_ms"], row["variant"]) for row in report["table"]
             if row.get("status") == "ok" and (row.get("gpu_ms") if on_gpu else row.get("event_ms"))]
    if not timed:
        return "verdict: no variant ran and passed its check"
    best_ms, best = min(timed)
    naive = next((ms for ms, name in timed if name == "naive"), None)
    if best == "naive" or len(timed) == 1:
        return f"verdict: {best} is fastest at {best_ms:.3f} ms per {unit}"
    against, slow_ms = ("naive", naive) if naive else max(timed, key=lambda t: t[0])[::-1]
    return f"verdict: {best} is fastest at {best_ms:.3f} ms per {unit}, {slow_ms / best_ms:.2f}x faster than {against}"


def cpu_timing_note(report: dict[str, Any]) -> str | None:
    """On a CPU, what the timings are worth: at these sizes a variant's time is a few ms of a shared, clock-scaled
    CPU, and the profiled over timed ratio swung from 0.12x to 47.85x in one run (run --from-trace --device cpu at a
    real model's shapes): said beside the table rather than the figures stated flatly."""
    if report["config"]["device"] == "cuda":
        return None
    ratios = [row["profiler_x"] for row in report["table"] if row.get("profiler_x")]
    spread = f" (profiler x {min(ratios):.2f}x-{max(ratios):.2f}x here)" if len(ratios) > 1 else ""
    return ("note: CPU timings at these sizes are noise" + spread + ": read the table for which variants run and "
            "pass the float64 check, not for their speed; time them on a GPU")


def header_line(report: dict[str, Any]) -> str:
    config, env = report["config"], report["environment"]
    s = config["shape"]
    kv_heads = s.get("kv_heads") or s["heads"]
    q = s.get("query_len") or s["seq"]
    sizes = f"B={s['batch']} H={s['heads']}" + (f" KV heads={kv_heads}" if kv_heads != s["heads"] else "")
    sizes += f" S={s['seq']}" if q == s["seq"] else f" queries={q} KV len={s['seq']}"
    sizes += f" D={s['head_dim']}"
    extra = [f"window {s['window']}"] if s.get("window") else []
    if s.get("lengths"):
        extra.append(f"lengths {min(s['lengths'])}..{max(s['lengths'])}")
    mask = "causal" if config["causal"] else "full"
    return " | ".join([env.get("gpu") or env.get("cpu") or "cpu", f"torch {env['torch']}", config["dtype"],
                       config.get("scenario", "dense"), sizes, mask, *extra,
                       "fwd+bwd" if config["backward"] else "fwd"])


def analyse_run(meta: dict[str, Any], results: list[dict[str, Any]], lint: bool) -> dict[str, Any]:
    """run.json: the config, the environment, each variant's result with numbers read back from its trace
    (a path relative to the run's output directory), and the comparison table."""
    from attntrace.model.loading import load
    from attntrace.model.summary import step_means, summarize

    variants = []
    for result in results:
        entry = dict(result)
        if entry.get("trace"):
            trace = load(str(Path(meta["config"]["out_dir"]) / entry["trace"]))
            summary = summarize(trace)
            means = step_means(summary)
            entry["numbers"] = {
                "kernels": means.get("kernels"),
                "gpu_ms": means.get("gpu_busy_us", 0.0) / 1e3,
                "cpu_ms": means.get("cpu_us", 0.0) / 1e3,
                "copies": means.get("memcpy"),
                "launches": means.get("launches"),
                "bytes": bytes_per_step(trace) if trace.has_gpu else None,
                "attention_backends": summary["attention_backends"],
                "top_kernel": summary["top_kernels"][0]["name"] if summary["top_kernels"] else None,
            }
            if lint:
                entry["numbers"]["findings"] = finding_counts(trace)
        variants.append(entry)
    config = meta["config"]
    flops = attention_flops(config["shape"], config["causal"], config["backward"])
    peak = peak_for(meta["environment"], config["dtype"])
    return {**meta, "flops_per_step": flops, "peak": peak, "peak_tflops": peak["tflops"], "variants": variants,
            "table": table_rows(variants, flops, peak, on_gpu=config["device"] == "cuda")}


def finding_counts(trace: Any) -> str:
    """The findings column of the run table: causes by severity ("2W 1I"), or "none"; a cause's consequences
    are inside it, not counted beside it."""
    from attntrace.report.engine import lint_trace

    report = lint_trace(trace)
    counts = {s: sum(1 for f in report.findings if f["severity"] == s and "cause" not in f)
              for s in ("error", "warning", "info")}
    return " ".join(f"{n}{s[0].upper()}" for s, n in counts.items() if n) or "none"
