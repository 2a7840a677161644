"""Recompute the trace-derived numbers and table of a run.json from its traces, keeping what only the GPU
could measure (correctness error, CUDA-event timing). Used when the analysis improves after a capture:

    python tools/reanalyse_run.py sample_traces/bf16_causal_fwd/run.json
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

from attntrace.report.compare import analyse_run, render

MEASURED = ("name", "description", "status", "reason", "rel_error", "event_ms", "trace", "detail", "warnings")

for arg in sys.argv[1:]:
    path = Path(arg)
    run = orjson.loads(path.read_bytes())
    run["config"]["out_dir"] = str(path.parent)
    results = [{k: v.get(k) for k in MEASURED} | {"numbers": {}} for v in run["variants"]]
    for result in results:
        if result["trace"]:
            result["trace"] = Path(result["trace"]).name
    report = analyse_run({"config": run["config"], "environment": run["environment"]}, results, lint=True)
    report["config"]["out_dir"] = "."
    path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    print(path)
    print(render(report["table"], report["config"]["backward"]))
