"""Command line: parses options and calls the library. Exit codes: 0 clean, 1 findings at or above
--fail-on (or a regression for diff), 2 bad usage or an unreadable input."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import math
import os
import signal
import sys
import warnings
from collections.abc import Iterable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import click
import orjson

from attntrace import __version__
from attntrace.formats import FORMATS
from attntrace.formats.printable import escaped as _escaped
from attntrace.formats.printable import printable as _printable
from attntrace.formats.printable import shown as _shown
from attntrace.install import pip_install
from attntrace.model.loading import SKIPPED, InputError, load, map_inputs

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


EXIT_INTERRUPTED = 128 + signal.SIGINT  # the shell's status for a process stopped by Ctrl-C
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # and for one whose reader went away (| head -1)


def _emit(text: str | bytes, output: str | None, inputs: Iterable[str] = ()) -> None:
    """The command's result to stdout, or to the file `output` (never one of `inputs`, the traces it read)."""
    data = text.encode("utf-8", "backslashreplace") if isinstance(text, str) else text
    if output in (None, "-"):
        if sys.stdout is None:  # started with stdout closed (>&-)
            context = click.get_current_context(silent=True)
            writes_files = context is not None and any(p.name == "output" for p in context.command.params)
            raise click.ClickException("stdout is closed: " + ("give --output FILE" if writes_files
                                                               else "send it to a file (> FILE)"))
        # Under PYTHONUNBUFFERED stdout.buffer is a raw file, whose write may take only part of the data (a pipe
        # whose reader left); write the rest until it is all out or the write fails (one line, in _Group.invoke).
        view = memoryview(data)
        while view:
            written = sys.stdout.buffer.write(view)
            view = view[written if written is not None else len(view):]
        sys.stdout.buffer.flush()
        return
    from attntrace.formats.output import write_bytes

    try:
        write_bytes(output, data, inputs)
    except OSError as exc:
        raise click.ClickException(f"{_shown(output)}: cannot write output ({exc.strerror or exc})") from exc


def _with_files_behind(read: list[str], given: Iterable[str]) -> list[str]:
    """What a run read, for the outputs that must not replace it, with the files behind reported paths: a file
    name that is not UTF-8 is reported with \\xNN escapes, which name no file (an output given that name replaced
    the trace). The inputs are found again to map them; only when some reported path has an escape."""
    if not any("\\" in path for path in read):
        return read
    from attntrace.model.loading import display_path
    from attntrace.read import discover
    from attntrace.read.sources import is_url

    shown = set(read)
    local = [path for path in given if path != "-" and not is_url(path)]
    behind = [item[0] for item in discover(local) if isinstance(item, tuple)]
    return [*read, *(path for path in behind if path not in shown and display_path(path) in shown)]


def _distinct_outputs(targets: dict[str, str | None]) -> None:
    """Two outputs named at one file would leave only the last one written."""
    seen: dict[str, str] = {}
    for option, target in targets.items():
        if target in (None, "-"):
            continue
        real = os.path.realpath(target)
        if real in seen:
            raise click.UsageError(f"{seen[real]} and {option} name the same file ({_shown(target)})")
        seen[real] = option


class GivenPath(click.Path):
    """A path option that refuses an empty value: --annotate "" wrote into the working directory (Path("") is
    "."), and --write-baseline "" and --config "" were ignored without a word."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and not value:
            self.fail("an empty path (give a file name)", param, ctx)
        return super().convert(value, param, ctx)


class ByteSize(click.ParamType):
    name = "SIZE"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        from attntrace.checks.catalog import parse_size

        try:
            size = parse_size(value)
        except (ValueError, OverflowError):
            self.fail(f"{value!r} is not a size such as 512M or 16G", param, ctx)
        if size <= 0:
            self.fail(f"{value!r}: the size must be more than 0", param, ctx)
        return size


def _read_options(max_size: int | None, salvage: bool) -> Any:
    from attntrace.read import DEFAULT_MAX_BYTES, ReadOptions

    return ReadOptions(max_size or DEFAULT_MAX_BYTES, salvage)


READ_OPTIONS = [
    click.option("--max-size", type=ByteSize(), default=None,
                 help="Refuse a trace larger than this once decompressed (e.g. 4G).  [default: 16G or the "
                      "memory available, whichever is less]"),
    click.option("--salvage", is_flag=True,
                 help="Analyse the complete events of a cut-off trace instead of refusing it; the report says "
                      "it is incomplete."),
]


def read_options(command: Any) -> Any:
    for option in reversed(READ_OPTIONS):
        command = option(command)
    return command


def _error(line: str) -> None:
    click.echo(f"error: {_shown(line)}", err=True)


def _one_terminal() -> bool:
    """Whether stdout and stderr both go to a terminal, where a line on each is seen twice."""
    try:
        return bool(sys.stdout and sys.stderr and sys.stdout.isatty() and sys.stderr.isatty())
    except (OSError, ValueError):  # closed or detached streams
        return False


SUGGEST_RATIO = 0.6  # difflib's default cutoff, over the names without their dashes


def _one_line(self: click.ClickException, file: Any = None) -> None:
    """An error as one printable line, like every other error (click prints a usage error's usage and a hint
    above it, and a message as given: a path or config key with a newline in it split it in two)."""
    where = (f" (see '{self.ctx.command_path} --help')"
             if isinstance(self, click.UsageError) and self.ctx is not None else "")
    if isinstance(self, click.NoSuchOption) and self.possibilities:
        # click matches whole option strings, where the shared "--" counts: --bogus was told "Did you mean
        # '--jobs'?". Only names alike without it are suggested.
        from difflib import SequenceMatcher

        self.possibilities = [p for p in self.possibilities if SequenceMatcher(
            None, self.option_name.lstrip("-"), p.lstrip("-")).ratio() >= SUGGEST_RATIO]
    # "error:", as every other error line starts: a CI step greps for one prefix.
    click.echo(f"error: {_shown(self.format_message())}{where}", err=True)


class _Group(click.Group):
    def main(self, *args: Any, **kwargs: Any) -> Any:
        # click's own usage errors already exit 2; ClickException defaults to 1, which means "findings" here.
        click.ClickException.exit_code = EXIT_ERROR
        click.ClickException.show = _one_line  # type: ignore[method-assign]
        click.UsageError.show = _one_line  # type: ignore[method-assign]
        try:  # --version and --help write while the arguments are parsed, before invoke
            return super().main(*args, **kwargs)
        except OSError as exc:
            _unwritable(exc)

    def invoke(self, ctx: click.Context) -> Any:
        # click turns Ctrl-C into "Aborted!" and exit 1, which CI reads as findings, and a closed pipe into
        # exit 1 too; answer both as the Unix tools do.
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)
        except OSError as exc:
            _unwritable(exc)


def _unwritable(exc: OSError) -> NoReturn:
    """Output that cannot be written (a full disk, stdout on /dev/full): one line and exit 2, not a traceback; a
    reader that went away (a closed pipe): the exit code Unix tools give."""
    closed = exc.errno == errno.EPIPE and _stdout_closed()  # asked before stdout is pointed elsewhere
    _quiet_stdout()  # the flush at exit would fail again
    if closed:
        sys.exit(EXIT_BROKEN_PIPE)
    _error(f"{exc.filename or 'stdout'}: {exc.strerror or exc}")
    sys.exit(EXIT_ERROR)


def _stdout_closed() -> bool:
    """Whether the reader of stdout has gone (a pipe reports an error on its write end then)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)
        return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so that the flush at exit does not raise again on the closed pipe."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # (no stdout at all: nothing to quiet)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="attntrace")
def main() -> None:
    """Capture and lint PyTorch profiler traces of attention."""


# --- summary --------------------------------------------------------------------------------------
def _summarize_path(path: str, options: Any, settings: Any, ops: bool = False) -> dict[str, Any]:
    from attntrace.model.roofline import analyse
    from attntrace.report.engine import summarize_trace

    trace = load(path, options)
    return {"path": trace.path, **summarize_trace(trace, settings, with_path=True),
            **({"roofline": analyse(trace)} if ops else {})}


@main.command(short_help="Per-step numbers of traces: GPU busy, kernels, copies.")
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--output", "-o", type=GivenPath(), help="Write the report to this file instead of stdout.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=min(4, os.cpu_count() or 1), show_default=True,
              help="Traces read in parallel.")
@click.option("--config", "config_path", type=GivenPath(dir_okay=False),
              help="A TOML file of settings; its [tool.attntrace.profiler_cost] is used as lint uses it "
                   "(default: the nearest pyproject.toml's).")
@click.option("--ops", is_flag=True,
              help="The roofline: MFU, coverage, op classes and top ops against the device's roofs.")
@read_options
def summary(paths: tuple[str, ...], fmt: str, output: str | None, jobs: int, config_path: str | None,
            ops: bool, max_size: int | None, salvage: bool) -> None:
    """Per-trace and per-step numbers: GPU busy, CPU time, kernels, copies, launches, top kernels,
    tensor-core share of GEMM time, attention backends."""
    from attntrace.formats.summary_text import summary_table

    settings = _settings(None, None, (), None, config_path)
    work = partial(_summarize_path, options=_read_options(max_size, salvage), settings=settings, ops=ops)
    results = [r for r in map_inputs(list(paths), work, jobs)
               if not (isinstance(r, InputError) and r.kind == SKIPPED)]
    errors = [r for r in results if isinstance(r, InputError)]
    for err in errors:
        _error(err.line())
    ok = [r for r in results if not isinstance(r, InputError)]
    read = _with_files_behind([*paths, *(s["path"] for s in ok), *([config_path] if config_path else [])], paths)
    if fmt == "json":
        doc = {"traces": ok, "errors": [{"path": e.path, "kind": e.kind, "message": e.message} for e in errors]}
        _emit(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n", output, read)
    else:
        from attntrace.formats.roofline_text import roofline_tables

        shown = [_printable(s) for s in ok]  # op and kernel names escaped, as the summary's are
        tables = [summary_table(s) + (f"\n{roofline_tables(s['roofline'])}" if ops else "") for s in shown]
        _emit("\n\n".join(tables) + ("\n" if ok else ""), output, read)
    sys.exit(EXIT_ERROR if errors else EXIT_OK)


# --- run ------------------------------------------------------------------------------------------
def _speedups(values: tuple[str, ...]) -> dict[str, float]:
    from attntrace.model.whatif import is_speedup

    out = {}
    for value in values:
        name, _, factor = value.partition("=")
        try:
            if not name.strip():  # "=2" asked for "no kernels of class  in this trace"
                raise ValueError(value)
            out[name.strip()] = float(factor)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not CLASS=FACTOR (e.g. gemm_fp32_simt=4)",
                                     param_hint="--speedup") from None
        if not is_speedup(out[name.strip()]):  # nan made a step of 0.037 ms out of 1.2 ms; 0.5 "saved 0.000"
            raise click.BadParameter(f"{value!r}: the factor must be a finite number of 1 or more (how many times "
                                     "faster, e.g. gemm_fp32_simt=4)", param_hint="--speedup")
    return out


@main.command(short_help="Replay a trace's steps with a change: what the step would gain.")
@click.argument("path")
@click.option("--speedup", multiple=True, metavar="CLASS=FACTOR",
              help="Kernels of this class or group (rules/taxonomy.toml) run FACTOR times faster. Repeatable.")
@click.option("--drop-syncs", is_flag=True, help="Host syncs no longer wait for the GPU.")
@click.option("--pin-copies", is_flag=True, help="Copies from pageable memory become pinned and asynchronous.")
@click.option("--graph", is_flag=True, help="Each stretch of launches between syncs runs as one CUDA graph.")
@click.option("--offload-loader", is_flag=True,
              help="The main thread no longer waits for the data loader (workers prepare batches ahead).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--config", "config_path", type=GivenPath(dir_okay=False),
              help="A TOML file whose [tool.attntrace.profiler_cost] replays the step, as lint's --config.")
@read_options
def whatif(path: str, speedup: tuple[str, ...], drop_syncs: bool, pin_copies: bool, graph: bool,
           offload_loader: bool, fmt: str, config_path: str | None, max_size: int | None, salvage: bool) -> None:
    """Replay PATH's steps without the profiler, before and after a change, per device: the step's wall time and
    what its critical path spends it on. A finding's wall saving is one such replay."""
    from attntrace.api import TraceReadError
    from attntrace.api import whatif as run_whatif
    from attntrace.formats.summary_text import whatif_text

    # As lint's and summary's: --config or the nearest pyproject.toml, a bad one being one line (exit 2).
    settings = _settings(None, None, (), None, config_path)
    try:
        result = run_whatif(path, speedup=_speedups(speedup), drop_syncs=drop_syncs, pin_copies=pin_copies,
                            graph=graph, offload_loader=offload_loader, settings=settings, max_size=max_size,
                            salvage=salvage)
    except (TraceReadError, ValueError) as exc:
        _error(str(exc))
        sys.exit(EXIT_ERROR)
    if fmt == "json":
        _emit(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n", None, [path])
    else:
        _emit(whatif_text(_printable(result)) + "\n", None, [path])
    sys.exit(EXIT_OK)


@main.command(short_help="Profile each attention implementation and compare.")
@click.option("--variants", default="all", show_default=True,
              help="Comma-separated variant names, or all (those that fit the scenario).")
@click.option("--batch", type=int, default=None, help="Sequences per call.  [default: 4 on cuda, 1 on cpu]")
@click.option("--heads", type=int, default=None, help="Query heads.  [default: 16 on cuda, 2 on cpu]")
@click.option("--kv-heads", type=int, default=None,
              help="Key/value heads: fewer than --heads is grouped-query attention, 1 is multi-query.")
@click.option("--seq", "--kv-len", "seq", type=int, default=None,
              help="Sequence length; the KV cache length with --query-len.  [default: 2048 on cuda, 128 on cpu]")
@click.option("--query-len", type=int, default=None,
              help="Queries per sequence, the last positions of it: 1 for decode with a KV cache.")
@click.option("--window", type=int, default=None, help="Causal sliding window: each query sees its last N keys.")
@click.option("--varlen", is_flag=True,
              help="Variable lengths (a quarter of --seq up to all of it): padded batch vs jagged tensors.")
@click.option("--head-dim", type=int, default=64, show_default=True, help="Features per head (D).")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True,
              help="Precision of q, k and v.")
@click.option("--causal/--no-causal", default=True, show_default=True)
@click.option("--backward", is_flag=True, help="Profile forward plus backward.")
@click.option("--steps", type=int, default=3, show_default=True, help="Profiled steps (one call each).")
@click.option("--warmup", type=int, default=5, show_default=True, help="Calls before timing (compiles too).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True)
@click.option("--out", "out_dir", type=GivenPath(file_okay=False), default="attntrace-out", show_default=True,
              help="Directory for the traces, run.json and report.html (created; files in it are replaced).")
@click.option("--no-lint", is_flag=True, help="Do not lint the traces written.")
@click.option("--with-stack", is_flag=True, help="Record Python stacks (findings then name your source lines).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--from-trace", "from_trace", metavar="TRACE",
              help="Measure the attention this trace ran, at its own shapes (sites found from record_shapes), "
                   "against every variant here; the shapes, dtype and backward come from the trace.")
@click.option("--plan", is_flag=True, help="With --from-trace: print the sites and their variants, measure nothing "
                                           "(no torch needed).")
@click.option("--sites", "max_sites", type=click.IntRange(min=1), default=None,
              help="With --from-trace: measure only the N sites that take the most GPU time.")
@click.option("--calibrate-profiler", is_flag=True,
              help="Measure what the profiler costs the CPU per recorded event on this machine (small loops with "
                   "and without it) and print them as [tool.attntrace.profiler_cost]; nothing else runs.")
@click.option("--write", "write_costs", is_flag=True,
              help="With --calibrate-profiler: write the costs into the nearest pyproject.toml (created in the "
                   "current directory if none), where lint finds them.")
@click.pass_context
def run(click_ctx: click.Context, variants: str, batch: int | None, heads: int | None, kv_heads: int | None,
        seq: int | None, query_len: int | None, window: int | None, varlen: bool, head_dim: int, dtype: str,
        causal: bool, backward: bool, steps: int, warmup: int, device: str, out_dir: str, no_lint: bool,
        with_stack: bool, fmt: str, from_trace: str | None, plan: bool, max_sites: int | None,
        calibrate_profiler: bool, write_costs: bool) -> None:
    """Profile each attention implementation and compare them (needs torch: the capture extra).

    Exit codes: 0 every variant that ran passed its float64 check; 1 one failed it; 2 bad usage, or every
    requested variant was skipped (with --from-trace: a trace without recorded shapes)."""
    from attntrace.capture import options

    if calibrate_profiler:
        _calibrate_profiler(device, write_costs)
        return
    if write_costs:
        raise click.UsageError("--write goes with --calibrate-profiler")
    if from_trace is not None:
        given = [f"--{name.replace('_', '-')}" for name in ("batch", "heads", "kv_heads", "seq", "query_len",
                                                            "window", "varlen", "head_dim", "dtype", "backward")
                 if click_ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise click.UsageError(f"{', '.join(given)} cannot be used with --from-trace: the trace gives the shapes")
        explicit_causal = click_ctx.get_parameter_source("causal") == click.core.ParameterSource.COMMANDLINE
        _run_from_trace(from_trace, plan, variants, causal if explicit_causal else None, steps, warmup, device,
                        out_dir, no_lint, fmt, max_sites)
        return
    if plan or max_sites is not None:
        raise click.UsageError("--plan and --sites go with --from-trace TRACE")

    small = device == "cpu"
    batch, heads, seq = batch or (1 if small else 4), heads or (2 if small else 16), seq or (128 if small else 2048)
    shape = options.Shape(batch, heads, seq, head_dim, kv_heads, query_len, window,
                          options.varlen_lengths(batch, seq) if varlen else None)
    problem = options.check_shape(shape, causal, backward, steps, warmup)
    if problem:
        raise click.UsageError(problem)
    try:
        names = options.variant_names(variants, shape)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--variants") from exc
    # Arguments are checked above, before torch's import (seconds) below. What torch warns at import (no NumPy)
    # is kept in run.json with the variants' warnings, not printed over the table.
    runner, import_warnings = _capture_module("runner")
    from attntrace.report.compare import analyse_run, cpu_timing_note, header_line, peak_line, render, verdict

    config = runner.RunConfig(names, shape, dtype, causal, backward, steps, warmup, device, Path(out_dir),
                              with_stack)
    from attntrace.formats.progress import run_progress

    try:
        with run_progress(len(config.variants)) as progress:
            meta, results = runner.run(config, progress=progress)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    meta["import_warnings"] = sorted({str(w.message) for w in import_warnings})
    report = analyse_run(meta, [asdict(r) for r in results], lint=not no_lint)
    Path(out_dir, "run.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    page = _write_run_html(Path(out_dir), report, not no_lint)
    if fmt == "json":
        _emit(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n", None)
    else:
        click.echo(header_line(report))
        click.echo(render(report["table"], backward))
        click.echo(peak_line(report))
        click.echo(verdict(report))
        if cpu_timing_note(report):
            click.echo(cpu_timing_note(report))
        warned = sum(len(r.warnings) for r in results) + len(meta["import_warnings"])
        files = f"traces, run.json{' and report.html' if page else ''}"
        click.echo(f"{files} in {out_dir}" + (f" ({warned} PyTorch warnings kept in run.json)" if warned else ""))
    if any(r.status == "failed" for r in results):
        sys.exit(EXIT_FINDINGS)
    if not any(r.status == "ok" for r in results):
        _error("every requested variant was skipped; run.json says why")
        sys.exit(EXIT_ERROR)
    sys.exit(EXIT_OK)


def _calibrate_profiler(device: str, write: bool) -> None:
    """`run --calibrate-profiler`: the per-event costs measured here, printed, and with --write written where lint
    reads its settings (a user's pyproject.toml is changed only when asked)."""
    profiler_cost = _capture_module("profiler_cost")[0]
    from attntrace.checks.config import find_pyproject, write_profiler_costs

    target = find_pyproject(Path.cwd()) or Path.cwd() / "pyproject.toml"
    try:
        result = profiler_cost.measure(device)
    except RuntimeError as exc:  # too noisy to measure: one line, exit 2
        raise click.ClickException(str(exc)) from exc
    text = profiler_cost.to_toml(result)
    click.echo(text.rstrip())
    scope = " (measured on a CPU: lint applies them to CPU traces only)" if device == "cpu" else ""
    if not write:
        click.echo(f"not written: add --write to put them into {target}{scope}")
        return
    try:
        write_profiler_costs(target, text)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"{target}: cannot write the profiler costs ({exc})") from exc
    click.echo(f"written to {target}: attntrace lint run from here judges idle, launch and sync time with them"
               f"{scope}")


def _capture_module(name: str) -> tuple[Any, list[warnings.WarningMessage]]:
    """attntrace.capture.NAME (which imports torch), and what torch warned as it was imported (no NumPy, say):
    kept for run.json, not printed above the one line an error gets or the table."""
    try:
        with warnings.catch_warnings(record=True) as import_warnings:
            warnings.simplefilter("always")
            module = importlib.import_module(f"attntrace.capture.{name}")
    except ImportError as exc:
        raise click.ClickException(f"attntrace run needs torch ({exc}); {pip_install('capture')}") from exc
    return module, import_warnings


def _run_from_trace(path: str, plan_only: bool, variants: str, causal: bool | None, steps: int, warmup: int,
                    device: str, out_dir: str, no_lint: bool, fmt: str, max_sites: int | None) -> None:
    """`run --from-trace`: the plan (no torch), then each site measured here. A trace without recorded shapes
    exits 2: there is nothing to size a measurement by, and a script that goes on to measure should stop."""
    from attntrace.capture import fromtrace
    from attntrace.model.loading import guarded

    if steps < 1 or warmup < 0:
        raise click.UsageError("--steps must be positive, --warmup non-negative")
    trace = guarded(path, load)
    if isinstance(trace, InputError):
        _error(trace.line())
        sys.exit(EXIT_ERROR)
    try:
        doc = fromtrace.plan(trace, variants, causal)
    except fromtrace.NoShapes as exc:
        _error(str(exc))
        sys.exit(EXIT_ERROR)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--variants") from exc
    del trace
    if plan_only or not doc["sites"]:  # nothing to measure is an answer, not an error
        if fmt == "json":
            _emit(orjson.dumps(_escaped(doc), option=orjson.OPT_INDENT_2) + b"\n", None)
        else:
            _emit(fromtrace.render_plan(_printable(doc)) + "\n", None)
        sys.exit(EXIT_OK)
    runner = _capture_module("runner")[0]  # torch, imported here after the plan
    try:
        runner.usable_device(device)  # before --out is made
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    from attntrace.formats.progress import run_progress
    from attntrace.report.compare import cpu_timing_note, header_line, render

    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        result = fromtrace.measure(doc, steps=steps, warmup=warmup, device=device, out_dir=folder,
                                   lint=not no_lint, max_sites=max_sites, progress=run_progress)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    folder.joinpath("run.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    if fmt == "json":
        _emit(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n", None)
    else:
        for site in result["sites"]:
            report = _site_report(folder, site)
            click.echo(f"site {site['id']}: {site['implementation']}, {site['calls_per_step']:g} call(s) per step")
            if report is not None:
                click.echo(header_line(report))
                click.echo(render(report["table"], report["config"]["backward"]))
                if cpu_timing_note(report):
                    click.echo(cpu_timing_note(report))
            click.echo("")
        click.echo(fromtrace.render_measurement(result))
        click.echo(f"traces and run.json per site, and the verdicts in {folder / 'run.json'}")
    statuses = [v["status"] for site in result["sites"] if (r := _site_report(folder, site))
                for v in r["variants"]]
    if "failed" in statuses:
        sys.exit(EXIT_FINDINGS)
    if "ok" not in statuses:
        _error("no variant ran at any site; run.json says why")
        sys.exit(EXIT_ERROR)
    sys.exit(EXIT_OK)


def _site_report(folder: Path, site: dict[str, Any]) -> dict[str, Any] | None:
    if not site.get("run"):
        return None
    report: dict[str, Any] = orjson.loads(folder.joinpath(site["run"]).read_bytes())
    return report


def _write_run_html(out_dir: Path, report: dict[str, Any], lint: bool) -> Path | None:
    """DIR/report.html when the html extra is installed; the run itself does not depend on it."""
    if importlib.util.find_spec("plotly") is None:
        click.echo(f"note: no {out_dir / 'report.html'}: {pip_install('html')} for it", err=True)
        return None
    from attntrace.api import write_run_report

    return write_run_report(out_dir, report, lint)


# --- lint -----------------------------------------------------------------------------------------
def _settings(select: str | None, ignore: str | None, sets: tuple[str, ...], fail_on: str | None,
              config_path: str | None) -> Any:
    from attntrace.checks import config
    from attntrace.checks.catalog import RuleFileError, load_rules

    try:
        rules = load_rules()
        if config_path:
            source = config_path
            file_config = config.read_config_file(Path(config_path))
        else:
            found = config.find_pyproject(Path.cwd())
            source = str(found) if found else "defaults"
            file_config = config.read_config_file(found) if found else {}
        return config.build(rules, file_config, source, _split(select), _split(ignore), list(sets), fail_on)
    except (RuleFileError, config.ConfigError) as exc:
        raise click.ClickException(str(exc)) from exc


def _scheduler(value: str | None) -> str | None:
    if value is None:
        return None
    from attntrace.distributed import SchedulerError, check

    try:
        return check(value)
    except SchedulerError as exc:
        raise click.BadParameter(str(exc)) from exc


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


@main.command(short_help="Lint traces: the causes that make attention slow.")
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="html: one self-contained page with charts (needs the html extra: plotly).")
@click.option("--output", "-o", type=GivenPath(), help="Write the report to this file instead of stdout.")
@click.option("--annotate", "annotate_to", type=GivenPath(), metavar="OUT",
              help="Also write each trace with its findings on the timeline (for Perfetto UI) to OUT: a file for "
                   "one trace, a directory with the same relative names for a directory.")
@click.option("--baseline", "baseline_path", type=GivenPath(dir_okay=False),
              help="Fail only on findings not in this baseline; report known and fixed ones.")
@click.option("--write-baseline", type=GivenPath(dir_okay=False), help="Record the findings as a baseline file.")
@click.option("--select", help="Comma-separated rule ids, names or prefixes to run (default: all).")
@click.option("--ignore", help="Comma-separated rule ids, names or prefixes to skip.")
@click.option("--fail-on", type=click.Choice(["error", "warning", "info", "never"]), default=None,
              help="Exit 1 when a finding is at or above this severity.  [default: warning]")
@click.option("--config", "config_path", type=GivenPath(dir_okay=False), help="A TOML file of settings.")
@click.option("--set", "sets", multiple=True, metavar="RULE.param=VALUE", help="Override a rule parameter.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=min(4, os.cpu_count() or 1), show_default=True,
              help="Traces linted in parallel.")
@click.option("--scheduler", callback=lambda ctx, param, value: _scheduler(value), metavar="tcp://HOST:PORT|local[:N]",
              help="Lint on a Dask cluster, one task per trace (needs the dask extra): an existing "
                   "scheduler's address, or local:N worker processes here. Workers read the traces themselves.")
@click.option("--group", type=click.Choice(["auto", "ranks", "none"]), default="auto", show_default=True,
              help="ranks: report each finding once per job ('on K of N ranks'), with a step-time spread across "
                   "ranks; auto does so when the inputs are the rank traces of one job.")
@click.option("--measured", "measured_path", type=GivenPath(dir_okay=False), metavar="RUN_JSON",
              help="The run.json of `attntrace run --from-trace` on these traces: the attention findings it measured "
                   "(AT102, AT202, AT203) take the measured saving as their impact instead of an assumed speed-up.")
@read_options
def lint(paths: tuple[str, ...], fmt: str, output: str | None, annotate_to: str | None, baseline_path: str | None,
         write_baseline: str | None, select: str | None, ignore: str | None, fail_on: str | None,
         config_path: str | None, sets: tuple[str, ...], jobs: int, scheduler: str | None, group: str,
         measured_path: str | None, max_size: int | None, salvage: bool) -> None:
    """Lint PyTorch profiler traces (files, directories, URLs such as s3://bucket/prefix/, or - for stdin)."""
    from attntrace import api, distributed  # distributed imports Dask only when a scheduler is given
    from attntrace.checks.config import find_pyproject
    from attntrace.formats.progress import file_progress

    settings = _settings(select, ignore, sets, fail_on, config_path)
    _distinct_outputs({"--output": output, "--write-baseline": write_baseline, "--annotate": annotate_to})
    if fmt == "html" and importlib.util.find_spec("plotly") is None:
        from attntrace.formats.html import MISSING_EXTRA

        raise click.ClickException(MISSING_EXTRA)
    if fmt == "parquet" and output in (None, "-") and sys.stdout is not None and sys.stdout.isatty():
        raise click.UsageError("--format parquet writes binary: give --output FILE (or pipe it)")
    runner = distributed.runner(scheduler) if scheduler else None
    # What the run reads beside the traces: no output may replace them.
    side_files = [str(p) for p in (config_path, baseline_path, measured_path, find_pyproject(Path.cwd())) if p]
    with file_progress(list(paths)) as progress:
        try:
            report = api.lint(list(paths), settings=settings, jobs=jobs, max_size=max_size, salvage=salvage,
                              annotate=annotate_to, keep=side_files, timelines=fmt == "html", progress=progress,
                              runner=runner, group=group, baseline=baseline_path, measured=measured_path)
        except (api.RunFileError, distributed.SchedulerError) as exc:
            raise click.ClickException(str(exc)) from exc
        except ValueError as exc:  # --annotate cannot map the inputs to outputs
            raise click.ClickException(str(exc)) from exc
    for line in report.warnings:
        click.echo(f"warning: {_shown(line)}", err=True)
    # On one terminal the text report shows each error already: printed on stderr too, it came twice.
    shown_in_report = fmt == "text" and output in (None, "-") and _one_terminal()
    for trace in report.data["traces"]:
        if trace["error"] and not shown_in_report:
            _error(f"{trace['path']}: {trace['error']['message']}")
        elif trace.get("annotate_error"):
            _error(f"{trace['path']}: --annotate: {trace['annotate_error']} (its findings are in the report)")
    # Everything the run read, none of which an output may replace: the traces, the config and the baseline.
    read = _with_files_behind([*paths, *(t["path"] for t in report.data["traces"]), *side_files], paths)
    unread = sum(bool(t["error"]) for t in report.data["traces"])
    cut = sum(bool(t.get("incomplete")) for t in report.data["traces"])
    if write_baseline and (unread or cut):
        # A baseline without an input's findings, or a cut-off trace's last ones, would call each of them new on the
        # next run: none is written.
        why = ", ".join(w for w in (f"{unread} input(s) could not be read" if unread else "",
                                    f"{cut} input(s) are incomplete (cut off)" if cut else "") if w)
        _error(f"--write-baseline {_shown(write_baseline)}: not written, {why} (fix or leave them out, then write "
               "it again)")
    elif write_baseline:
        _emit(report.baseline(), write_baseline, read)
    colour = fmt == "text" and output in (None, "-") and sys.stdout is not None and sys.stdout.isatty()
    _emit(report.render(fmt, colour), output, read)
    sys.exit(EXIT_ERROR if write_baseline and (unread or cut) else report.exit_code())


RULE_GROUPS = {"AT1xx": "-- memory traffic", "AT2xx": "-- precision and backends",
               "AT3xx": "-- repeated work and syncs", "AT4xx": "-- GPU utilisation", "AT5xx": "-- launch cost",
               "AT6xx": "-- the roofline"}


@main.command(short_help="List the rule catalogue.")
def rules() -> None:
    """List the rule catalogue."""
    from tabulate import tabulate

    from attntrace.checks.catalog import RuleFileError, load_rules

    try:
        catalogue = load_rules()
    except RuleFileError as exc:
        raise click.ClickException(str(exc)) from exc
    rows: list[list[str]] = []
    for r in catalogue.values():
        group = r.id[:3] + "xx"
        if group not in (row[0] for row in rows):
            rows.append([group, RULE_GROUPS.get(group, ""), "", ""])
        rows.append([r.id, r.name, r.severity, r.summary])
    # Through _emit, as every command's result: with stdout closed, one line and exit 2 (click.echo wrote nothing, 0).
    _emit(tabulate(rows, headers=["id", "name", "severity", "detects"], tablefmt="simple") + "\n", None)


@main.command(short_help="Print one rule's documentation and parameters.")
@click.argument("rule")
def explain(rule: str) -> None:
    """Print one rule's documentation and parameters (by id or name)."""
    from attntrace.checks.catalog import RuleFileError, load_rules, resolve

    try:
        catalogue = load_rules()
        hits = resolve(rule, catalogue)
    except (RuleFileError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if len(hits) != 1:
        raise click.ClickException(f"{rule!r} matches {', '.join(hits)}; name one rule")
    r = catalogue[hits[0]]
    lines = [f"{r.id} {r.name} (default severity: {r.severity})", "", r.summary, ""]
    for title, key in (("What it detects", "what"), ("Why it is slow", "why"), ("Example", "example"),
                       ("Fix", "fix")):
        lines += [f"## {title}", r.docs[key], ""]
    if r.parameters:
        lines.append("## Parameters (set with --set RULE.param=VALUE or [tool.attntrace.rules.RULE])")
        lines += [f"- {p.name} = {p.default!r} {p.unit}: {p.description}" for p in r.parameters.values()]
    _emit("\n".join(lines) + "\n", None)


# --- diff -----------------------------------------------------------------------------------------
@main.command(short_help="Compare two traces or directories; gate regressions.")
@click.argument("base")
@click.argument("new")
@click.option("--fail-over", type=click.FloatRange(min=0), default=None, metavar="PCT",
              help="Exit 1 when NEW's step time is more than PCT percent above BASE's, outside the step spread.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--output", "-o", type=GivenPath(), help="Write the comparison to this file instead of stdout.")
@click.option("--config", "config_path", type=GivenPath(dir_okay=False),
              help="A TOML file of settings, as lint's (default: the nearest pyproject.toml).")
@read_options
def diff(base: str, new: str, fail_over: float | None, fmt: str, output: str | None, config_path: str | None,
         max_size: int | None, salvage: bool) -> None:
    """Compare two traces, or two directories of traces matched by name."""
    from attntrace.read.sources import is_url
    from attntrace.report import diff as differ

    if fail_over is not None and not math.isfinite(fail_over):  # inf: a gate that can never fire, shown as none
        raise click.BadParameter(f"must be a finite number, not {fail_over}", param_hint="--fail-over")
    # As lint's and summary's: the config's profiler costs give the step without the profiler they report.
    settings = _settings(None, None, (), None, config_path)
    for path in (base, new):
        if path == "-":
            raise click.ClickException("diff compares files or directories, not stdin ('-')")
        if is_url(path):
            continue
        try:
            missing = not Path(path).exists()
        except OSError as exc:  # a parent directory that cannot be searched
            raise click.ClickException(f"{_shown(path)}: {exc.strerror or exc}") from exc
        if missing:
            raise click.ClickException(f"{_shown(path)}: no such file or directory")
    folders = [path for path in (base, new) if not is_url(path) and Path(path).is_dir()]
    if len(folders) == 1:  # was "DIR: is a directory", as if a folder could not be compared at all
        raise click.ClickException(f"{_shown(folders[0])} is a directory and the other a file: diff compares two "
                                   "traces, or two directories of traces matched by name")
    result = _escaped(differ.compare(base, new, fail_over, _read_options(max_size, salvage), settings))
    shown_in_report = fmt != "json" and output in (None, "-") and _one_terminal()  # as lint's
    for c in result["comparisons"]:
        for line in c["errors"] if not shown_in_report else ():
            _error(line)
    for one_sided in result["unmatched"]:
        if one_sided["error"]:
            _error(one_sided["error"])
    for problem in result["search_errors"]:
        _error(problem)
    read = _with_files_behind([base, new, *(c[side] for c in result["comparisons"] for side in ("base", "new")),
                               *(u[side] for u in result["unmatched"] for side in ("base", "new") if u[side])],
                              [base, new])
    if fmt == "json":
        _emit(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n", output, read)
    else:
        _emit(differ.render(_printable(result)), output, read)
    sys.exit(EXIT_ERROR if result["errors"] else EXIT_FINDINGS if result["regressions"] else EXIT_OK)
