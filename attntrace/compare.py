"""The comparison table of `attntrace run`, built from the traces it wrote (no torch needed)."""

from __future__ import annotations

from typing import Any

# Dense bf16/fp16 tensor-core peak in TFLOP/s (vendor datasheets, without sparsity), matched on the
# name torch reports. Longest key first so that "H100 PCIe" wins over "H100".
PEAK_TFLOPS = {
    "H200": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "H800": 989.0, "GH200": 989.0,
    "B200": 2250.0, "B100": 1750.0, "A100": 312.0, "A800": 312.0, "A10G": 70.0, "A10": 125.0, "A30": 165.0,
    "A40": 150.0, "L40S": 362.0, "L40": 181.0, "L4": 121.0, "RTX 4090": 165.0, "RTX 3090": 71.0,
    "V100": 125.0, "T4": 65.0, "MI300X": 1307.0, "MI250X": 383.0, "MI250": 362.0,
}


def peak_tflops(gpu_name: str | None) -> float | None:
    if not gpu_name:
        return None
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key in gpu_name:
            return PEAK_TFLOPS[key]
    return None


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool, backward: bool) -> float:
    """Useful FLOPs of one call: two S x S x D matmuls forward (halved when causal, as FlashAttention counts
    them), and 2.5x that again for the backward."""
    forward = 4.0 * batch * heads * seq * seq * head_dim / (2 if causal else 1)
    return forward * (3.5 if backward else 1.0)


def table_rows(results: list[dict[str, Any]], flops: float, peak: float | None,
               on_gpu: bool = True) -> list[dict[str, Any]]:
    """One row per variant from its run result and trace numbers (per step = per forward). On the CPU there
    are no kernels: time, throughput and speed-up come from the wall-clock timing instead."""

    def time_ms(r: dict[str, Any]) -> float | None:
        return r["numbers"].get("gpu_ms") if on_gpu else r.get("event_ms")

    baseline = next((time_ms(r) for r in results if r["name"] == "naive" and r["numbers"]), None)
    rows = []
    for r in results:
        n = r["numbers"]
        if r["status"] != "ok" or not n:
            rows.append({"variant": r["name"], "status": f"{r['status']}: {r['reason']}"})
            continue
        ms = time_ms(r)
        tflops = flops / (ms * 1e-3) / 1e12 if ms else None
        rows.append({
            "variant": r["name"],
            "kernels": n.get("kernels") if on_gpu else None,
            "gpu_ms": n.get("gpu_ms") if on_gpu else None,
            "event_ms": r.get("event_ms"),
            "cpu_ms": n.get("cpu_ms"),
            "copies": n.get("copies") if on_gpu else None,
            "tflops": tflops,
            "peak_pct": 100.0 * tflops / peak if tflops and peak else None,
            "speedup": baseline / ms if baseline and ms else None,
            "findings": n.get("findings"),
            "status": "ok",
        })
    return rows


HEADERS = {"variant": "variant", "kernels": "kernels/fwd", "gpu_ms": "GPU ms/fwd", "event_ms": "event ms",
           "cpu_ms": "CPU ms/fwd", "copies": "copies", "tflops": "TFLOP/s", "peak_pct": "% peak",
           "speedup": "vs naive", "findings": "findings", "status": "status"}


def render(rows: list[dict[str, Any]]) -> str:
    from tabulate import tabulate

    def cell(key: str, value: Any) -> Any:
        if value is None:
            return "-"
        if key == "speedup":
            return f"{value:.2f}x"
        if key == "kernels" and float(value).is_integer():
            return str(int(value))
        if isinstance(value, float):
            return f"{value:.3f}" if key.endswith("_ms") else f"{value:.1f}"
        return value

    body = [[cell(k, row.get(k)) for k in HEADERS] for row in rows]
    return tabulate(body, headers=list(HEADERS.values()), tablefmt="simple", disable_numparse=True)


def analyse_run(meta: dict[str, Any], results: list[dict[str, Any]], lint: bool) -> dict[str, Any]:
    """run.json: the config, the environment, each variant's result with numbers read back from its trace
    (a path relative to the run's output directory), and the comparison table."""
    from pathlib import Path

    from attntrace.loading import load
    from attntrace.summary import step_means, summarize

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
                "attention_backends": summary["attention_backends"],
                "top_kernel": summary["top_kernels"][0]["name"] if summary["top_kernels"] else None,
            }
            if lint:
                entry["numbers"]["findings"] = _finding_counts(trace)
        variants.append(entry)
    shape = meta["config"]["shape"]
    flops = attention_flops(shape["batch"], shape["heads"], shape["seq"], shape["head_dim"],
                            meta["config"]["causal"], meta["config"]["backward"])
    peak = peak_tflops(meta["environment"].get("gpu"))
    return {**meta, "flops_per_step": flops, "peak_tflops": peak, "variants": variants,
            "table": table_rows(variants, flops, peak, on_gpu=meta["config"]["device"] == "cuda")}


def _finding_counts(trace: Any) -> str:
    from attntrace.lint import lint_trace

    report = lint_trace(trace)
    counts = {s: sum(1 for f in report.findings if f["severity"] == s) for s in ("error", "warning", "info")}
    return " ".join(f"{n}{s[0].upper()}" for s, n in counts.items() if n) or "none"
