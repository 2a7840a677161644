"""The Python API behind `import attntrace`: lint and summarise traces from a notebook or a script. The
CLI is a thin layer over it; the report it returns is the JSON report model (schema_version 1) with typed
views on top."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import orjson

from attntrace.checks.config import ConfigError as ConfigError  # bad settings or config: part of the API
from attntrace.checks.config import Settings
from attntrace.formats import FORMATS, output

T = TypeVar("T")

SEVERITIES = ("error", "warning", "info")
FAIL_ON_LEVELS = (*SEVERITIES, "never")
PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class Finding:
    """One finding of the report. `extra` holds fields that later versions add (device, rank, baseline...)."""

    rule: str
    name: str
    severity: str
    trace: str
    message: str
    where: dict[str, Any]
    evidence: dict[str, Any]
    impact: dict[str, Any]
    fix: str
    fingerprint: str
    extra: dict[str, Any] = field(default_factory=dict)

    FIELDS = ("rule", "name", "severity", "trace", "message", "where", "evidence", "impact", "fix", "fingerprint")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        return cls(**{k: data[k] for k in cls.FIELDS}, extra={k: v for k, v in data.items() if k not in cls.FIELDS})

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.FIELDS}, **self.extra}

    @property
    def gpu_us_per_step(self) -> float:
        return float(self.impact.get("gpu_us_per_step") or 0.0)

    @property
    def share_of_step(self) -> float:
        return float(self.impact.get("share_of_step") or 0.0)

    @property
    def op_chain(self) -> str | None:
        return self.where.get("op_chain")

    @property
    def kernel(self) -> str | None:
        return self.where.get("kernel")

    @property
    def steps(self) -> list[int]:
        return list(self.where.get("steps") or [])

    @property
    def consequences(self) -> list[Finding]:
        """What this cause's fix also removes (findings of other rules, counted in this one's impact)."""
        return [Finding.from_dict(c) for c in self.extra.get("consequences") or ()]

    def and_consequences(self) -> list[Finding]:
        return [self, *self.consequences]

    @property
    def source(self) -> str | None:
        """file:line of the user's code that caused it, when the trace has Python stacks."""
        src = self.where.get("source")
        return f"{src['file']}:{src['line']}" if src else None


@dataclass(frozen=True)
class TraceResult:
    """One input of the report: what was read, or why it could not be."""

    path: str
    device: str | None
    steps: int
    events: int
    summary: dict[str, Any] | None
    error: dict[str, Any] | None
    incomplete: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


class Report:
    """The result of `attntrace.lint`: `traces`, `findings` (typed, sorted by severity then impact),
    `skipped` rules, and the same JSON as `attntrace lint --format json` from `to_json()`."""

    def __init__(self, data: dict[str, Any], timelines: dict[str, dict[str, Any]] | None = None,
                 fail_on: str = "warning", warnings: list[str] | None = None) -> None:
        self.data = data
        self.timelines = timelines or {}
        self.fail_on = fail_on  # the settings' --fail-on, which exit_code() judges by default
        self.warnings = warnings or []  # one line each, about the run's inputs rather than a trace (--measured)

    @property
    def traces(self) -> list[TraceResult]:
        return [TraceResult(t["path"], t["device"], t["steps"], t["events"], t["summary"], t["error"],
                            bool(t.get("incomplete"))) for t in self.data["traces"]]

    @property
    def findings(self) -> list[Finding]:
        """The causes, one per change a user can make; what follows from each is in its `consequences`."""
        return [Finding.from_dict(f) for f in self.data["findings"]]

    @property
    def skipped(self) -> list[dict[str, Any]]:
        return list(self.data["skipped"])

    @property
    def errors(self) -> list[TraceResult]:
        return [t for t in self.traces if not t.ok]

    def at_or_above(self, severity: str) -> list[Finding]:
        """Findings at or above a severity ("never" gives none); against a baseline, only new ones."""
        if severity == "never":
            return []
        if severity not in SEVERITIES:  # was "tuple.index(x): x not in tuple"
            raise ValueError(f"severity must be one of {', '.join(SEVERITIES)} or never, not {severity!r}")
        limit = SEVERITIES.index(severity)
        return [f for f in self.findings if SEVERITIES.index(f.severity) <= limit
                and f.extra.get("baseline", "new") == "new"]

    def exit_code(self, fail_on: str | None = None) -> int:
        """The CLI's exit code: 2 for an unreadable input, 1 for findings at or above fail_on (by default the
        settings' fail-on), else 0."""
        from attntrace.report.engine import exit_code

        # Checked before the inputs' errors decide it: a bad level was 2 with an unreadable input and raised
        # without one; a list was "unhashable type".
        if fail_on is not None and not isinstance(fail_on, str):
            raise TypeError(f"fail_on is a level's name ({', '.join(FAIL_ON_LEVELS)}), not {fail_on!r:.60}")
        if fail_on is not None and fail_on not in FAIL_ON_LEVELS:
            raise ValueError(f"fail_on must be one of {', '.join(FAIL_ON_LEVELS)}, not {fail_on!r:.60}")
        return exit_code(self.data, fail_on or self.fail_on)

    def render(self, fmt: str = "text", colour: bool = False) -> bytes:
        """The report as `attntrace lint --format FMT` writes it: text (with ANSI colour when asked), json, sarif,
        github, markdown, html (needs the html extra) or parquet."""
        if fmt == "json":
            # Bytes as orjson writes them: a str between (to_json) was two more copies of a report that grows with
            # the number of traces.
            return orjson.dumps(self.data, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
        if fmt == "sarif":
            from attntrace.checks.catalog import load_rules
            from attntrace.formats import sarif

            return orjson.dumps(sarif.render(self.data, load_rules()), option=orjson.OPT_INDENT_2) + b"\n"
        if fmt == "github":
            from attntrace.formats import github

            return github.render(self.data).encode("utf-8", "backslashreplace")
        if fmt == "markdown":
            from attntrace.formats import markdown
            from attntrace.formats.printable import printable

            return markdown.render(printable(self.data)).encode("utf-8", "backslashreplace")
        if fmt == "html":
            return self.to_html().encode("utf-8", "backslashreplace")
        if fmt == "parquet":
            from attntrace.formats import parquet

            return parquet.render(self.data)
        if fmt == "text":
            from attntrace.formats.printable import printable
            from attntrace.formats.text import render

            return render(printable(self.data), colour).encode("utf-8", "backslashreplace")
        raise ValueError(f"no such format: {fmt!r} (one of {', '.join(FORMATS)})")

    def baseline(self) -> bytes:
        """The findings as a baseline file (`attntrace lint --write-baseline`)."""
        from attntrace.report import baseline

        return baseline.dump(self.data)

    def to_dict(self) -> dict[str, Any]:
        return self.data

    def to_json(self) -> str:
        """The JSON report, byte for byte what `attntrace lint --format json` writes."""
        return self.render("json").decode()

    def to_polars(self) -> Any:
        """One row per cause and per consequence (`findings` holds the causes, each with its consequences), the
        columns of `attntrace lint --format parquet` (README): job, trace, rank,
        device, rule, severity, message, op_chain, kernel, steps, impact, subsumed_by, baseline, evidence as
        JSON text, fix, source."""
        from attntrace.formats import parquet

        return parquet.rows(self.data)

    def to_html(self, title: str = "attntrace lint") -> str:
        """The page of `attntrace lint --format html` (needs the html extra: plotly)."""
        from attntrace.formats import html

        return html.lint_page(self.data, self.timelines, title)

    def _repr_html_(self) -> str:
        return self.to_html()

    def __repr__(self) -> str:
        counts = self.data["summary"]["findings"]
        return (f"<Report {self.data['summary']['traces']} trace(s), {self.data['summary']['errors']} unreadable, "
                f"{counts['error']} error, {counts['warning']} warning, {counts['info']} info>")


@dataclass(frozen=True)
class Summary:
    """`attntrace summary` of one trace: the headline numbers typed, everything in `data`."""

    path: str
    device: str | None
    steps: int
    gpu_busy_us: float
    kernels: int
    memcpy: int
    launches: int
    attention_backends: list[str]
    data: dict[str, Any]

    def to_polars(self) -> Any:
        """One row per step (step, cpu_us, gpu_busy_us, kernels, memcpy, memset, kernel_us, launches,
        launch_cpu_us)."""
        import polars as pl

        return pl.DataFrame(self.data.get("per_step") or [])


class TraceReadError(ValueError):
    """A trace that cannot be read; the message is one line naming the file."""


class RunFileError(ValueError):
    """A baseline or measured-run file given to `lint` that cannot be used; the message is one line naming it."""


def build_settings(select: str | Iterable[str] | None = None, ignore: str | Iterable[str] | None = None,
                   settings: Settings | Mapping[str, Any] | None = None, fail_on: str | None = None,
                   config: PathLike | None = None) -> Settings:
    """Settings from the arguments, then `config` (a TOML file or pyproject.toml), then rule defaults.
    `settings` maps "RULE.param" or "RULE" -> {param: value}, e.g. {"AT101.min_bytes": 1 << 20}."""
    from attntrace.checks import config as cfg
    from attntrace.checks.catalog import load_rules

    if isinstance(settings, Settings):
        return settings
    if settings is not None and not isinstance(settings, Mapping):  # settings=[1] was an AttributeError
        raise TypeError(f"settings must map 'RULE.param' to a value, not {type(settings).__name__}")
    if config is not None and not isinstance(config, str | bytes | os.PathLike):
        raise TypeError(f"config must be a path, not {type(config).__name__}")
    config = os.fsdecode(config) if config is not None else None  # a bytes path, as `paths` takes
    if config is not None and not config:  # an unset variable, which named no file: it was ignored
        raise cfg.ConfigError("config: an empty path")
    file_config = cfg.read_config_file(Path(config)) if config is not None else {}
    overrides: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (file_config.get("rules") or {}).items()}
    for key, value in (settings or {}).items():
        if not isinstance(key, str):
            raise TypeError(f"settings keys are 'RULE.param' or 'RULE' text, not {key!r}")
        rule, dot, param = key.partition(".")
        if dot:
            overrides.setdefault(rule, {})[param] = value
        elif isinstance(value, Mapping):
            overrides.setdefault(rule, {}).update(value)
        else:
            raise cfg.ConfigError(f"settings: {key!r} must be RULE.param or map a rule to its parameters")
    return cfg.build(load_rules(), {**file_config, "rules": overrides}, str(config or "settings"),
                     _tokens(select), _tokens(ignore), [], fail_on)


def _tokens(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    # b"AT1" was read as numbers ("not 65"); a mapping as its keys.
    if isinstance(value, bytes | Mapping) or not isinstance(value, str | Iterable):
        raise TypeError(f"rules are selected by text or a list of texts, not {type(value).__name__}")
    items = value.split(",") if isinstance(value, str) else list(value)
    odd = [v for v in items if not isinstance(v, str)]
    if odd:  # select=[101] or [None] was "'int' object has no attribute 'strip'"
        raise TypeError(f"rules are named by text (an id, a name or a prefix), not {odd[0]!r}")
    return [v.strip() for v in items if v.strip()]


@dataclass
class _Linted:
    """What one worker returns for one trace: its report part and, when asked, its timeline."""

    report: Any  # lint.TraceReport
    timeline: dict[str, Any] | None


def _lint_one(path: str, settings: Settings, options: Any, timelines: bool, annotate: dict[str, str] | None
              ) -> _Linted:
    from attntrace.model.loading import load
    from attntrace.report.engine import lint_trace

    trace = load(path, options)
    part = lint_trace(trace, settings)
    if annotate is not None:
        from attntrace.formats import annotate as annotator
        from attntrace.read.errors import TraceError

        try:
            annotator.write(path, annotate[path], trace, part.findings)
        except TraceError as exc:
            # The copy could not be written; the trace was read and linted, and its findings stay in the report
            # (they were dropped with it, and the trace counted as unreadable). The run still exits 2.
            part.info["annotate_error"] = exc.message
    timeline = None
    if timelines:
        from attntrace.report import timeline as tl

        timeline = tl.build(trace, part.findings)
    return _Linted(part, timeline)


GROUPS = ("auto", "ranks", "none")  # lint's `group`, as `attntrace lint --group`


def _paths(paths: PathLike | Iterable[PathLike]) -> list[str]:
    """Paths as text: str, os.PathLike or bytes (a bytes path was iterated as numbers: "expected str, bytes or
    os.PathLike object, not int")."""
    if isinstance(paths, str | bytes | os.PathLike):
        return [_path(paths)]
    if not isinstance(paths, Iterable):  # lint(None) was "'NoneType' object is not iterable"
        raise TypeError(f"paths must be a path or paths (str, bytes, os.PathLike), not {type(paths).__name__}")
    return [_path(p) for p in paths]


def _path(path: Any) -> str:
    if not isinstance(path, str | bytes | os.PathLike):
        raise TypeError(f"a path must be str, bytes or os.PathLike, not {type(path).__name__}")
    return os.fsdecode(path)


def _flags(**given: Any) -> None:
    """Each on/off argument a bool: salvage="no" was read as on, and drop_syncs="x" as a change asked for."""
    for name, value in given.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, not {value!r:.60}")


def _max_size(value: int | None) -> int | None:
    """max_size as given: None for the default, else a whole number of bytes above 0 (0 meant the default, and a
    negative one made every trace unreadable)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"max_size must be a number of bytes above 0, not {value!r}")
    return value


def lint(paths: PathLike | Iterable[PathLike], select: str | Iterable[str] | None = None,
         ignore: str | Iterable[str] | None = None, settings: Settings | Mapping[str, Any] | None = None, *,
         fail_on: str | None = None, config: PathLike | None = None, jobs: int = 1, max_size: int | None = None,
         salvage: bool = False, annotate: PathLike | None = None, keep: Iterable[PathLike] = (),
         timelines: bool = True, progress: Callable[[str, int], None] | None = None, runner: Any = None,
         group: str = "auto", baseline: PathLike | None = None, measured: PathLike | None = None) -> Report:
    """Lint trace files or directories and return the report.

    select/ignore: rule ids, names or prefixes ("AT1", "hidden-copy"), as a list or comma-separated.
    settings: rule parameters, {"AT101.min_bytes": 1 << 20} or {"AT101": {"min_bytes": 1 << 20}}.
    config: a TOML file of settings ([tool.attntrace] in a pyproject.toml); none is read unless given.
    annotate: write each trace with its findings on the timeline there (see `attntrace lint --annotate`).
    keep: files the annotated copies must not replace, beside the inputs (the run's config, baseline...).
    timelines: keep each trace's per-step GPU timeline for the HTML report (cheap next to reading).
    progress: called with (path, bytes) as each input is done.
    runner: where the traces are linted (attntrace.distributed.runner for a Dask cluster); here by default.
    group: "ranks" reports one job's rank traces as one verdict, "auto" (as the CLI) when the inputs look like
    one (ranks), "none" one finding per trace.
    baseline: a baseline file (`--write-baseline`): each finding is marked new or known, and the entries gone
    are listed as fixed; only new findings count for the exit code.
    measured: the run.json of `attntrace run --from-trace` on these traces: the attention findings it measured
    take the measured saving as their impact (`report.warnings` says which measured findings matched none).
    Unreadable inputs do not raise: they are in `report.errors`, and the others are still analysed. A baseline or
    measured file that cannot be used raises RunFileError, before any trace is read; arguments the command line
    would refuse (no path, an unknown group, max_size of 0 or less) raise ValueError or TypeError."""
    from attntrace.model.loading import InputError, map_inputs
    from attntrace.read import DEFAULT_MAX_BYTES, ReadOptions, input_roots
    from attntrace.report import engine

    if not isinstance(group, str) or group not in GROUPS:
        raise ValueError(f"group must be one of {', '.join(GROUPS)}, not {group!r:.60}")
    _flags(salvage=salvage, timelines=timelines)
    if runner is not None and not callable(runner):  # runner="local" was "'str' object is not callable"
        raise TypeError(f"runner must be a function (attntrace.distributed.runner(scheduler)), not {runner!r:.60}")
    if isinstance(keep, str | bytes) or not isinstance(keep, Iterable):
        raise TypeError(f"keep must be a list of paths, not {keep!r:.60}")
    if isinstance(jobs, bool) or not isinstance(jobs, int):
        raise TypeError(f"jobs must be a whole number, not {jobs!r}")
    if jobs < 1:  # as --jobs
        raise ValueError(f"jobs must be 1 or more, not {jobs}")
    chosen = build_settings(select, ignore, settings, fail_on, config)
    names = _paths(paths)
    if not names:  # as the command line, which needs a path: a CI script's empty glob passed with nothing linted
        raise ValueError("no paths given: name trace files, directories, patterns or URLs")
    # Bytes paths as `paths` takes them (b'bl.json' was read as the text "b'bl.json'"); an empty one names no file.
    baseline, measured = (_path(p) if p is not None else None for p in (baseline, measured))
    for option, given in (("baseline", baseline), ("measured", measured), ("annotate", annotate)):
        if given is not None and not os.fspath(given):
            raise ValueError(f"{option}: an empty path (give a file name)")
    known = _read_baseline(baseline) if baseline is not None else None
    measured_run = _read_measured(measured) if measured is not None else None
    targets = None
    if annotate is not None:
        from attntrace.formats.annotate import targets_for

        kept = [_path(p) for p in (*keep, *([config] if config else []))]
        targets = targets_for(names, _path(annotate), kept)
        output.expect(targets.values())  # the workers write them: an interrupted run removes what they leave
    options = ReadOptions(_max_size(max_size) or DEFAULT_MAX_BYTES, salvage, input_roots(names))
    work = partial(_lint_one, settings=chosen, options=options, timelines=timelines, annotate=targets)
    parts: list[Any] = []
    views: dict[str, dict[str, Any]] = {}
    for result in map_inputs(names, work, jobs, runner):
        if isinstance(result, _Linted):
            parts.append(result.report)
            if result.timeline is not None:
                views[result.report.path] = result.timeline
        else:
            parts.append(result)
        if progress is not None:
            path = result.report.path if isinstance(result, _Linted) else result.path
            progress(path, _size(path) if not isinstance(result, InputError) else 0)
    from attntrace.report import ranks

    data = ranks.group(engine.assemble(parts), parts, group)
    warnings = []
    if measured_run is not None:
        warnings += _apply_measured(data, measured_run, measured)  # type: ignore[arg-type]
    if known is not None:
        from attntrace.report import baseline as baselines

        baselines.apply(data, known, baseline)  # type: ignore[arg-type]
    return Report(data, views, chosen.fail_on, warnings)


def _read_baseline(path: str) -> dict[str, dict[str, Any]]:
    from attntrace.report import baseline as baselines

    try:
        return baselines.load(path)
    except baselines.BaselineError as exc:
        raise RunFileError(str(exc)) from None


def _read_measured(path: str) -> dict[str, Any]:
    from attntrace.capture import fromtrace

    try:
        return fromtrace.read_measured(path)
    except fromtrace.MeasuredError as exc:
        raise RunFileError(str(exc)) from None


def _apply_measured(data: dict[str, Any], measured: dict[str, Any], path: str) -> list[str]:
    """Measured savings in place of the assumed ones; a line for the measured findings that matched none, and one
    for those whose saving is more than the whole step."""
    from attntrace.capture import fromtrace

    _, unmatched, too_large = fromtrace.apply_measured(data, measured, path)
    lines = []
    if unmatched:
        rules = sorted({str(measured["findings"][key].get("rule")) for key in unmatched})
        lines.append(f"{path}: {len(unmatched)} measured finding(s) ({', '.join(rules)}) match no finding of these "
                     "traces: their impact stays assumed (run `attntrace run --from-trace` on them again)")
    if too_large:
        rules = sorted({str(measured["findings"][key].get("rule")) for key in too_large})
        lines.append(f"{path}: {len(too_large)} measured saving(s) ({', '.join(rules)}) larger than the whole step "
                     "of the trace not applied: their impact stays assumed (measure this trace's program)")
    return lines


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def summarize(path: PathLike, *, max_size: int | None = None, salvage: bool = False,
              config: PathLike | None = None) -> Summary:
    """`attntrace summary` of one trace. Raises TraceReadError (one line, naming the file) when it cannot
    be read. config: a TOML file whose [tool.attntrace.profiler_cost] costs replay the step, as lint's `config`."""
    from attntrace.model.loading import load
    from attntrace.read import DEFAULT_MAX_BYTES, ReadOptions
    from attntrace.report.engine import summarize_trace

    name = _path(path)
    _flags(salvage=salvage)
    settings = build_settings(config=config)
    options = ReadOptions(_max_size(max_size) or DEFAULT_MAX_BYTES, salvage)
    # guarded, as lint's inputs are: JSON nested 10,000 deep or a full memory is this file's one line too.
    data = _one_line_on_failure(name, lambda p: {"path": name, **summarize_trace(load(p, options), settings,
                                                                                 with_path=True)})
    return Summary(name, data.get("device"), int(data.get("steps") or 0), float(data.get("gpu_busy_us") or 0.0),
                   int(data.get("kernels") or 0), int(data.get("memcpy") or 0), int(data.get("launches") or 0),
                   list(data.get("attention_backends") or []), data)


def write_run_report(out_dir: Path, run: dict[str, Any], lint_traces: bool = True) -> Path:
    """DIR/report.html of `attntrace run` (needs the html extra): the comparison as table and charts and, unless
    `lint_traces` is off, each trace the run wrote linted, with its timeline and findings."""
    from attntrace.formats.html import run_report_page

    traces = [str(Path(out_dir) / v["trace"]) for v in run.get("variants", []) if v.get("trace")]
    linted = lint(traces, fail_on="never") if lint_traces and traces else None
    page = run_report_page(run, linted.data if linted else None, linted.timelines if linted else None)
    target = Path(out_dir) / "report.html"
    target.write_text(page, encoding="utf-8")
    return target


def _one_line_on_failure(name: str, work: Callable[[str], T]) -> T:
    """`work` on one trace, whose failure to be read (or any other) is a TraceReadError of one line naming it."""
    from attntrace.model.loading import InputError, guarded

    result = guarded(name, work)
    if isinstance(result, InputError):
        raise TraceReadError(f"{name}: {result.message}")
    return result


def whatif(path: PathLike, *, speedup: dict[str, float] | None = None, drop_syncs: bool = False,
           pin_copies: bool = False, graph: bool = False, offload_loader: bool = False,
           config: PathLike | None = None, max_size: int | None = None, salvage: bool = False,
           settings: Settings | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`attntrace whatif`: the trace's steps replayed without the profiler, before and after a change (kernel
    classes `speedup`-times faster, host syncs dropped, pageable copies pinned, launches graphed), per device, with
    the critical path before. settings: built already (the command line's, from --config or the nearest
    pyproject.toml), in place of `config`. Raises TraceReadError (one line) when the trace cannot be read,
    ValueError for a class the trace does not have."""
    from attntrace.model.critical_path import summarize as summarize_paths
    from attntrace.model.loading import load
    from attntrace.model.whatif import as_json, change_for, describe, kernel_classes
    from attntrace.read import DEFAULT_MAX_BYTES, ReadOptions
    from attntrace.report.engine import summarize_trace

    name = _path(path)
    _flags(drop_syncs=drop_syncs, pin_copies=pin_copies, graph=graph, offload_loader=offload_loader, salvage=salvage)
    # A str was iterated ("class 2, =, e, g, m"), a number key joined as text.
    if speedup is not None and (not isinstance(speedup, Mapping) or not all(isinstance(k, str) for k in speedup)):
        raise TypeError(f"speedup must be a mapping of kernel class name to factor ({{'gemm': 4}}), not "
                        f"{speedup!r:.60}")
    # A mapping of rule parameters, as lint takes, not only Settings built already (a dict was "internal error
    # (AttributeError ...); please report it", blamed on the trace).
    settings = settings if isinstance(settings, Settings) else build_settings(settings=settings, config=config)
    options = ReadOptions(_max_size(max_size) or DEFAULT_MAX_BYTES, salvage)

    def read_and_summarize(given: str) -> tuple[Any, dict[str, Any]]:
        trace = load(given, options)
        return trace, summarize_trace(trace, settings)

    trace, summary = _one_line_on_failure(name, read_and_summarize)
    unknown = sorted(set(speedup or {}) - set(kernel_classes(trace)))
    if unknown:
        raise ValueError(f"{name}: no kernels of class {', '.join(unknown)} in this trace (it has: "
                         f"{', '.join(kernel_classes(trace)) or 'none'})")
    if trace.replay.reason:
        raise ValueError(f"{name}: cannot replay the steps ({trace.replay.reason})")
    change = change_for(trace, speedup, drop_syncs, pin_copies, graph, offload_loader)
    before = summarize_paths(trace.judged_paths(trace.critical_path))
    after = summarize_paths(trace.judged_paths(trace.whatif_replay(change)))
    return {"path": name, "incomplete": trace.meta.incomplete, "change": describe(change),
            "devices": as_json(trace.whatif(change)),
            "critical_path_before": before, "critical_path_after": after, "profiler": summary["profiler"]}
