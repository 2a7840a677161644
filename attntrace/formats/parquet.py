"""`lint --format parquet`: one row per cause and per consequence of each trace, for a fleet dashboard. The
columns are a stable contract (README): add columns, never rename or retype them."""

from __future__ import annotations

import io
from typing import Any

import orjson
import polars as pl

from attntrace.model.identity import job_label
from attntrace.report import all_findings

COLUMNS: dict[str, Any] = {
    "job": pl.String,  # the trace's name with digit runs folded: the same for every rank of one job
    "trace": pl.String,
    "rank": pl.Int64,
    "device": pl.Int64,
    "device_name": pl.String,
    "rule": pl.String,
    "name": pl.String,
    "severity": pl.String,
    "fingerprint": pl.String,
    "message": pl.String,
    "op_chain": pl.String,
    "kernel": pl.String,
    "steps": pl.List(pl.Int64),
    "gpu_us_per_step": pl.Float64,
    "share_of_step": pl.Float64,
    "subsumed_by": pl.String,
    "cause": pl.String,  # the fingerprint of the cause this finding is a consequence of
    "baseline": pl.String,
    "evidence": pl.String,  # JSON
    "ranks": pl.String,  # JSON: on K of N ranks with the impact's spread, when findings are grouped by rank
    "fix": pl.String,
    "source": pl.String,  # file:line of the user's code, when the trace has Python stacks
}


def rows(report: dict[str, Any]) -> pl.DataFrame:
    out = []
    for f in all_findings(report):
        where = f.get("where", {})
        steps = where.get("steps")
        out.append({
            "job": job_label(f["trace"]), "trace": f["trace"], "rank": where.get("rank"),
            "device": where.get("device"), "device_name": where.get("device_name"), "rule": f["rule"],
            "name": f["name"], "severity": f["severity"], "fingerprint": f["fingerprint"], "message": f["message"],
            "op_chain": where.get("op_chain"), "kernel": where.get("kernel"),
            "steps": [s for s in steps if isinstance(s, int)] if isinstance(steps, list) else None,
            "gpu_us_per_step": f["impact"]["gpu_us_per_step"], "share_of_step": f["impact"]["share_of_step"],
            "subsumed_by": f.get("subsumed_by"), "cause": f.get("cause"), "baseline": f.get("baseline"),
            "evidence": orjson.dumps(f.get("evidence"), option=orjson.OPT_SORT_KEYS).decode(),
            "ranks": orjson.dumps(f["ranks"], option=orjson.OPT_SORT_KEYS).decode() if f.get("ranks") else None,
            "fix": f["fix"],
            "source": f"{where['source']['file']}:{where['source']['line']}" if where.get("source") else None,
        })
    return pl.DataFrame(out, schema=COLUMNS, orient="row") if out else pl.DataFrame(schema=COLUMNS)


def render(report: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    # No statistics with timestamps and a fixed compression: the same report gives the same bytes.
    rows(report).write_parquet(buffer, compression="zstd", statistics=False)
    return buffer.getvalue()
