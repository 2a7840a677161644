"""AT302 host-sync: the CPU waits for the GPU inside a step."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.checks.base import Context, fmt_us

BLOCKING = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "hipDeviceSynchronize",
            "hipStreamSynchronize", "hipEventSynchronize")


def _idle_after(ctx: Context, syncs: pl.DataFrame) -> list[float | None]:
    """GPU idle from the last GPU activity before each sync returned to the first one after it; None when
    the trace ends before the GPU runs again."""
    gpu = ctx.trace.gpu.select("ts", "end")
    if not gpu.height:
        return [None] * syncs.height
    keyed = syncs.select(pl.col("end").alias("t")).with_row_index("row")
    before = keyed.sort("t").join_asof(gpu.sort("end").select(pl.col("end").alias("prev")), left_on="t",
                                       right_on="prev", strategy="backward")
    after = keyed.sort("t").join_asof(gpu.sort("ts").select(pl.col("ts").alias("next")), left_on="t",
                                      right_on="next", strategy="forward")
    joined = before.join(after.select("row", "next"), on="row").sort("row")
    return [None if n is None else max(0.0, n - (p if p is not None else n))
            for p, n in joined.select("prev", "next").iter_rows()]


def _cause(chain: str) -> str:
    if "aten::item" in chain or "_local_scalar_dense" in chain:
        return "a .item() (or a Python bool/int/float) of a CUDA tensor"
    if any(op in chain for op in ("aten::to", "aten::_to_copy", "aten::copy_")):
        return "a blocking copy between host and device (.to()/.cpu()/.cuda() with pageable memory)"
    if chain.startswith("(no op"):
        return "a synchronize call outside any op (torch.cuda.synchronize() or an event wait)"
    innermost = chain.split(" > ")[-1]
    if not innermost.startswith("aten::"):
        return f"a synchronize call (torch.cuda.synchronize() or an event wait) inside {innermost}"
    return f"{innermost} waiting for the GPU"


def check(ctx: Context) -> list[dict[str, Any]]:
    syncs = ctx.trace.launches_linked.filter(pl.col("step").is_not_null() & pl.col("name").is_in(list(BLOCKING)))
    if not syncs.height:
        return []
    syncs = syncs.with_columns(pl.Series("idle_us", _idle_after(ctx, syncs), dtype=pl.Float64))
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in syncs.iter_rows(named=True):
        chain = " > ".join(ctx.trace.op_chain(row["op"])) or "(no op: a direct runtime call)"
        groups.setdefault(chain, []).append(row)
    findings = []
    for chain, rows in sorted(groups.items()):
        per_step = len(rows) / ctx.step_count
        idle_per_step = sum(r["idle_us"] or 0.0 for r in rows) / ctx.step_count
        if idle_per_step < ctx.params["min_idle_us"]:
            continue
        apis = sorted({r["name"] for r in rows})
        cause = _cause(chain)
        findings.append(ctx.finding(
            op=rows[0]["op"],
            key=chain,
            message=(f"{per_step:g} host sync(s) per step from {cause}, via {chain} ({', '.join(apis)}); the GPU then "
                     f"idles {fmt_us(idle_per_step)} per step waiting for the next launch"),
            where={"op_chain": chain, "kernel": None, "steps": sorted({r["step"] for r in rows})},
            evidence={"syncs_per_step": per_step, "apis": apis, "cpu_wait_us_per_step":
                      sum(r["dur"] for r in rows) / ctx.step_count, "gpu_idle_us_after_each":
                      [r["idle_us"] for r in sorted(rows, key=lambda r: r["ts"])],
                      "gpu_idle_us_per_step": idle_per_step},
            gpu_us_per_step=idle_per_step,
            fix=ctx.rule.docs["fix"],
        ))
    return findings
