"""`attntrace.on_trace_ready(dir, fail_on=...)`: a torch.profiler hook that exports each trace as
tensorboard_trace_handler does, lints it at once, prints the findings to stderr and, with fail_on, raises
FindingsError so that a test of the user's model fails on a new hidden copy. It never imports torch: the
profiler object it is given exports itself."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from attntrace.api import Finding, Report, build_settings, lint


class FindingsError(AssertionError):
    """Findings at or above fail_on in a trace the hook wrote; `findings` and `report` hold them."""

    def __init__(self, path: str, findings: list[Finding], report: Report) -> None:
        self.path, self.findings, self.report = path, findings, report
        listed = "; ".join(f"{f.rule} {f.severity}: {f.message}" for f in findings[:5])
        more = f" (and {len(findings) - 5} more)" if len(findings) > 5 else ""
        super().__init__(f"{path}: {len(findings)} finding(s): {listed}{more}")


class TraceHook:
    """The callable handed to torch.profiler.profile(on_trace_ready=...). `reports` keeps every report."""

    def __init__(self, dir_name: str, fail_on: str, worker_name: str | None, use_gzip: bool,
                 select: str | Iterable[str] | None, ignore: str | Iterable[str] | None,
                 settings: Mapping[str, Any] | None, quiet: bool) -> None:
        self.dir_name, self.fail_on, self.use_gzip, self.quiet = dir_name, fail_on, use_gzip, quiet
        self.worker_name = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        self.select, self.ignore, self.settings = select, ignore, settings
        self.reports: list[Report] = []
        self.hinted = False

    def __call__(self, prof: Any) -> None:
        os.makedirs(self.dir_name, exist_ok=True)
        # The same file name as torch.profiler.tensorboard_trace_handler, so TensorBoard finds the traces.
        name = f"{self.worker_name}.{time.time_ns()}.pt.trace.json" + (".gz" if self.use_gzip else "")
        path = os.path.join(self.dir_name, name)
        prof.export_chrome_trace(path)
        report = lint(path, self.select, self.ignore, self.settings, timelines=False)
        self.reports.append(report)
        if not self.quiet:
            from attntrace.formats.text import render

            sys.stderr.write(render(report.data, colour=sys.stderr.isatty()))
            # attntrace.profile keeps the steps it timed with the profiler off in the trace (`measured`); a plain
            # torch.profiler.profile times none, and the step without the profiler is then an estimate.
            if getattr(prof, "measured", None) is None and not self.hinted:
                self.hinted = True
                sys.stderr.write("attntrace: the step without the profiler is estimated; profile with "
                                 "attntrace.profile(...) (the same arguments) to have it measured\n")
        failing = report.at_or_above(self.fail_on)
        if failing:
            raise FindingsError(path, failing, report)


def on_trace_ready(dir_name: str | os.PathLike[str], fail_on: str = "never", *, worker_name: str | None = None,
                   use_gzip: bool = False, select: str | Iterable[str] | None = None,
                   ignore: str | Iterable[str] | None = None, settings: Mapping[str, Any] | None = None,
                   quiet: bool = False) -> Callable[[Any], None]:
    """A torch.profiler `on_trace_ready` hook: export to dir_name, lint, print findings to stderr, and raise
    FindingsError when a finding is at or above fail_on ("error", "warning", "info"; "never" only prints)."""
    if fail_on not in ("error", "warning", "info", "never"):
        raise ValueError(f"fail_on must be error, warning, info or never, not {fail_on!r}")
    # Checked now, not at the first trace after the profiled run (select=["AT999"] failed only then).
    build_settings(select, ignore, settings)
    return TraceHook(os.fspath(dir_name), fail_on, worker_name, use_gzip, select, ignore, settings, quiet)
