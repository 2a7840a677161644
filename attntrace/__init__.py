"""attntrace: capture and lint PyTorch profiler traces of attention.

The Python API (loaded on first use, so that `import attntrace` stays light):

    report = attntrace.lint("traces/", select=["AT1"], settings={"AT101.min_bytes": 1 << 20})
    report.findings          # the causes, typed Findings sorted by severity then impact (.consequences inside)
    report.to_json()         # the JSON report of `attntrace lint --format json`
    report.to_polars()       # one row per cause and per consequence
    attntrace.summarize("run.pt.trace.json.gz")
    torch.profiler.profile(..., on_trace_ready=attntrace.on_trace_ready("traces/", fail_on="warning"))
    attntrace.profile(...)   # torch.profiler.profile that also times the steps without the profiler (imports torch)
"""

from __future__ import annotations

__version__ = "0.1.0"

_API = {"lint": "attntrace.api", "summarize": "attntrace.api", "Report": "attntrace.api", "Finding": "attntrace.api",
        "Summary": "attntrace.api", "TraceResult": "attntrace.api", "TraceReadError": "attntrace.api",
        "ConfigError": "attntrace.api",
        "on_trace_ready": "attntrace.hook", "FindingsError": "attntrace.hook", "whatif": "attntrace.api",
        "profile": "attntrace.capture.measured"}
__all__ = ["ConfigError", "Finding", "FindingsError", "Report", "Summary", "TraceReadError", "TraceResult",
           "__version__", "lint", "on_trace_ready", "profile", "summarize", "whatif"]


def __getattr__(name: str) -> object:  # no typing import: Ctrl-C at start-up must land in our handler
    from importlib import import_module

    if name in _API:
        return getattr(import_module(_API[name]), name)
    raise AttributeError(f"module 'attntrace' has no attribute {name!r}")
