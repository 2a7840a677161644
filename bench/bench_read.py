"""Benchmark: `attntrace lint` and `attntrace summary` as a user runs them (whole process, timed by
/usr/bin/time) on a large real-derived trace, beside a bare `orjson.loads` of the same file; the time per stage;
and the wall time of `attntrace lint` on a small trace.

The large trace repeats a real training trace that has every event kind kept (memory instant events, flows,
steps): by default Kineto's ResNet-50 sample from the corpus (17% memory events), else the GPT-2 sample trace.
Timestamps, External ids, correlation ids, flow ids and step numbers are shifted so that every copy stays
linked like the original and the steps continue one after another (ProfilerStep#1..#6, #7..#12, ...). It is
written in PyTorch's compact layout (`},{`, no whitespace) and, with --layout indented, two-space indented.

Run: python bench/bench_read.py [--mb 210] [--layout compact|indented] [--lean] [--repeats 3] [--source TRACE] [--curve]
     [--cpu]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
from process_cost import as_installed, whole_tree_cost

ROOT = Path(__file__).resolve().parent.parent
CORPUS_SOURCE = Path("/work/shared/corpus/wild/pytorch__kineto/tb_plugin/samples/resnet50_num_workers_0/"
                     "worker0.1623143566756.pt.trace.json.gz")
FALLBACK_SOURCE = ROOT / "sample_traces/workloads/gpt2_eager_train.pt.trace.json.gz"
SMALL = ROOT / "sample_traces/bf16_causal_fwd/naive.pt.trace.json.gz"
PYTHON = sys.executable

# The stages of one run, in one process, after imports (the whole-process figures are taken separately).
STAGES = """
import json, resource, sys, time
t = [time.perf_counter()]
from attntrace import read
from attntrace.read import workers
workers.warm_up_for(sys.argv[1:2], read.CHUNK_BYTES)  # as the CLI does: the server imports while this does
from attntrace import model
from attntrace.report import engine
from attntrace.model import summary
t.append(time.perf_counter())
raw = read.read(sys.argv[1])
t.append(time.perf_counter())
trace = model.build(raw)
t.append(time.perf_counter())
trace.gpu_linked; trace.step_table
t.append(time.perf_counter())
summary.summarize(trace)
t.append(time.perf_counter())
report = engine.lint_trace(trace)
t.append(time.perf_counter())
names = ["import", "read + cut", "decode + tables + kernel classes", "links + steps", "summary", "rules"]
print(json.dumps({n: b - a for n, a, b in zip(names, t, t[1:])}))
"""

ORJSON = """
import gc, sys, time
import orjson
gc.disable()
data = open(sys.argv[1], "rb").read()
t0 = time.perf_counter()
orjson.loads(data)
print(time.perf_counter() - t0)
"""


def _shift(event: dict[str, Any], k: int, span: float, id_span: int, step_span: int) -> dict[str, Any]:
    out = dict(event)
    if isinstance(out.get("ts"), (int, float)):
        out["ts"] = event["ts"] + k * span
    if isinstance(out.get("id"), int):
        out["id"] = event["id"] + k * id_span
    name = out.get("name", "")
    if isinstance(name, str) and name.startswith("ProfilerStep#") and name[13:].isdigit():
        out["name"] = f"ProfilerStep#{int(name[13:]) + k * step_span}"
    if isinstance(event.get("args"), dict):
        args = dict(event["args"])
        for key in ("External id", "external id", "correlation", "Ev Idx"):
            if isinstance(args.get(key), int) and args[key] > 0:
                args[key] += k * id_span
        out["args"] = args
    return out


# What a trace captured without record_shapes, with_stack or with_modules lacks: its events are small.
LEAN_DROPPED_ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs", "Call stack", "Module Hierarchy",
                     "Ev Idx", "Sequence number", "Fwd thread id", "Record function id")


def build_large(source: Path, target_mb: int, layout: str, out: Path, lean: bool = False) -> dict[str, Any]:
    """Write the large trace one copy of the source's events at a time (a 1.4 GB trace's events held at once
    as Python objects would take over 10 GB)."""
    doc = orjson.loads(gzip.decompress(source.read_bytes()))
    events = doc["traceEvents"]
    if lean:
        for e in events:
            if isinstance(e.get("args"), dict):
                e["args"] = {k: v for k, v in e["args"].items() if k not in LEAN_DROPPED_ARGS}
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000.0
    id_span = 1 + max(max(e.get("args", {}).get("External id", 0), e.get("args", {}).get("correlation", 0),
                          e.get("args", {}).get("Ev Idx", 0),
                          e.get("id", 0) if isinstance(e.get("id"), int) else 0) for e in events)
    numbers = [int(e["name"][13:]) for e in events
               if str(e.get("name", "")).startswith("ProfilerStep#") and e["name"][13:].isdigit()]
    step_span = max(numbers) - min(numbers) + 1 if numbers else 0
    indented = layout == "indented"
    option = orjson.OPT_INDENT_2 if indented else 0
    one_copy = len(orjson.dumps(events, option=option))
    copies = max(1, round(target_mb * 1e6 / one_copy))
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]

    def dumped(batch: list[dict[str, Any]]) -> bytes:
        """The events as orjson writes them inside the document's list (indented: two levels deep)."""
        if not indented:
            return b",".join(map(orjson.dumps, batch))
        return b",".join(b"\n    " + orjson.dumps(e, option=option).replace(b"\n", b"\n    ") for e in batch)

    doc["traceEvents"] = ["@@EVENTS@@"]
    marker = b'"@@EVENTS@@"'
    prefix, suffix = orjson.dumps(doc, option=option).split(marker)
    kinds = {"events": len(meta) + copies * len(body),
             "memory": copies * sum(1 for e in body if e.get("ph") == "i" and e.get("name") == "[memory]"),
             "flows": copies * sum(1 for e in body if e.get("ph") in ("s", "f", "t")),
             "steps": copies * sum(1 for e in body if str(e.get("name", "")).startswith("ProfilerStep#")
                                   and e.get("cat") in ("cpu_op", "user_annotation", "Operator")),
             "copies": copies}
    with out.open("wb") as fh:
        # orjson's indented list opens with "[" + newline + indent: the marker stood after that indent.
        fh.write(prefix.rstrip(b" \n") if indented else prefix)
        fh.write(dumped(meta))
        for k in range(copies):
            fh.write(b"," if meta or k else b"")
            fh.write(dumped([_shift(e, k, span, id_span, step_span) for e in body]))
        fh.write(b"\n  " + suffix.lstrip(b" \n") if indented else suffix)
    return kinds


# cwd and env of the measured processes (--tree); compiled bytecode kept, as an installed package has it.
RUN: dict[str, Any] = {"env": as_installed()}


def timed(argv: list[str]) -> tuple[float, int, str]:
    """Wall seconds and peak RSS (bytes) of a whole process, from /usr/bin/time; and its stdout."""
    done = subprocess.run(["/usr/bin/time", "-f", "@@ %e %M", *argv], capture_output=True, text=True, check=False,
                          **RUN)
    line = [x for x in done.stderr.splitlines() if x.startswith("@@ ")][-1].split()
    return float(line[1]), int(line[2]) * 1024, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=210, help="size of the large trace in MB (1e6 bytes)")
    parser.add_argument("--layout", choices=["compact", "indented"], default="compact")
    parser.add_argument("--lean", action="store_true", help="small events: the source's args without shapes, "
                        "stacks or module names (a trace captured without record_shapes and with_stack)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--source", type=Path, default=CORPUS_SOURCE if CORPUS_SOURCE.exists() else FALLBACK_SOURCE)
    parser.add_argument("--keep", type=Path, help="build the trace here and keep it (reused when it exists)")
    parser.add_argument("--small", type=Path, default=SMALL, help="the small trace timed for lint's start-up")
    parser.add_argument("--tree", type=Path, help="measure the attntrace package in this source tree (e.g. a "
                        "`git archive` of an older commit) instead of the installed one")
    parser.add_argument("--no-stages", action="store_true", help="skip the in-process time per stage")
    parser.add_argument("--only-curve", action="store_true", help="the read stage's curve alone (implies --curve)")
    parser.add_argument("--curve", action="store_true", help="time the read stage (read + decode + tables) with 1, "
                        "2, 4, ... processes up to the cores here (ATTNTRACE_READ_WORKERS)")
    parser.add_argument("--cpu", action="store_true", help="also the CPU time (user + system) of the whole process "
                        "tree, read workers included, of lint and of the bare orjson.loads: the figure to compare on "
                        "a machine that is not quiet, where wall times are not")
    parser.add_argument("--build", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        print(json.dumps(build_large(args.source, args.mb, args.layout, Path(args.build), args.lean)))
        return
    if args.tree:
        # Run from "/" so that the current directory cannot shadow the tree given.
        RUN.update(cwd="/", env={**RUN["env"], "PYTHONPATH": str(args.tree.resolve())})
    with tempfile.TemporaryDirectory() as tmp:
        big = args.keep.resolve() if args.keep else Path(tmp) / "big.pt.trace.json"
        facts = big.with_name(big.name + ".kinds")
        if not big.exists() or not facts.exists():
            # Built in a child process: the builder's memory must not sit beside the measured runs.
            facts.write_text(subprocess.run(
                [PYTHON, __file__, "--mb", str(args.mb), "--layout", args.layout, "--source", str(args.source),
                 *(["--lean"] if args.lean else []), "--build", str(big)],
                check=True, capture_output=True, text=True).stdout)
        kinds: dict[str, Any] = json.loads(facts.read_text())
        size = big.stat().st_size
        print(f"large trace: {size / 1e6:.0f} MB, {args.layout} layout{', lean events' if args.lean else ''}, "
              f"from {args.source.name} {kinds}")
        print(f"machine: {os.cpu_count()} cores, {_machine()}")
        if args.only_curve:
            read_curve(big, args.repeats)
            return
        rows: dict[str, list[tuple[float, int]]] = {"lint": [], "summary": [], "orjson": []}
        loads: list[float] = []
        # One run first, so that every measured one finds the compiled bytecode a user's install has.
        timed([PYTHON, "-m", "attntrace", "lint", str(args.small), "--format", "json", "--output", os.devnull,
               "--fail-on", "never"])
        for _ in range(args.repeats):
            rows["lint"].append(timed([PYTHON, "-m", "attntrace", "lint", str(big), "--format", "json",
                                       "--output", os.devnull, "--fail-on", "never", "--jobs", "1"])[:2])
            rows["summary"].append(timed([PYTHON, "-m", "attntrace", "summary", str(big), "--format", "json"])[:2])
            wall, peak, out = timed([PYTHON, "-c", ORJSON, str(big)])
            rows["orjson"].append((wall, peak))
            loads.append(float(out))
        bare = statistics.median(loads)
        print(f"  bare orjson.loads (gc off): {bare:.2f} s for the call, "
              f"{statistics.median(w for w, _ in rows['orjson']):.2f} s whole process, "
              f"peak {max(p for _, p in rows['orjson']) / size:.2f}x")
        for what in ("lint", "summary"):
            wall = statistics.median(w for w, _ in rows[what])
            peak = max(p for _, p in rows[what])
            print(f"  attntrace {what:8s} whole process: {wall:.2f} s = {size / 1e6 / wall:.0f} MB/s, "
                  f"{kinds.get('events', 0) / wall / 1e3:.0f}k events/s, peak {peak / 2**20:.0f} MiB = "
                  f"{peak / size:.2f}x the file, {wall / bare:.2f}x orjson.loads   "
                  "(issue 43's goals: <= 1.5x orjson.loads, peak < 2x the file)")
        if args.cpu:
            cpu_of = {what: min(whole_tree_cost(argv, cwd=RUN.get("cwd"), env=RUN.get("env")).cpu
                                for _ in range(args.repeats))
                      for what, argv in (("lint", [PYTHON, "-m", "attntrace", "lint", str(big), "--format", "json",
                                                   "--output", os.devnull, "--fail-on", "never", "--jobs", "1"]),
                                         ("orjson", [PYTHON, "-c", ORJSON, str(big)]))}
            print(f"  CPU (whole process tree, least of {args.repeats}): lint {cpu_of['lint']:.2f} s, bare "
                  f"orjson.loads process {cpu_of['orjson']:.2f} s = {cpu_of['lint'] / cpu_of['orjson']:.2f}x")
        if args.curve:
            read_curve(big, args.repeats)
        if not args.no_stages:
            stages = [json.loads(subprocess.run([PYTHON, "-c", STAGES, str(big)], check=True, capture_output=True,
                                                text=True, **RUN).stdout) for _ in range(args.repeats)]
            print("  stages (in one process, median): " + ", ".join(
                f"{name} {statistics.median(s[name] for s in stages):.2f} s" for name in stages[0]))
    walls = sorted(timed([PYTHON, "-m", "attntrace", "lint", str(args.small.resolve()), "--fail-on", "never"])[0]
                   for _ in range(5))
    print(f"attntrace lint on a small trace ({args.small.stat().st_size / 1024:.0f} KiB gz): "
          f"median {walls[2]:.3f} s wall "
          "over 5 runs (goal <= 0.3 s)")


def read_curve(big: Path, repeats: int) -> None:
    """The read stage's wall time with N processes decoding one trace, its speed-up over one and the speed-up
    per process (goal: at least 0.6 x N)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    counts = sorted({n for n in (1, 2, 4, 8, 16, 32, 64) if n <= cores} | {cores})
    times: dict[int, float] = {}
    for n in counts:
        env = {**RUN.get("env", os.environ), "ATTNTRACE_READ_WORKERS": str(n)}
        runs = [json.loads(subprocess.run([PYTHON, "-c", STAGES, str(big)], check=True, capture_output=True,
                                          text=True, cwd=RUN.get("cwd"), env=env).stdout) for _ in range(repeats)]
        times[n] = statistics.median(r["read + cut"] + r["decode + tables + kernel classes"] for r in runs)
    print("  read stage (read + cut + decode + tables) by processes decoding one trace:")
    for n in counts:
        speedup = times[1] / times[n]
        print(f"    {n:3d} processes: {times[n]:.2f} s, {speedup:.2f}x one process = {speedup / n:.2f} x N")


def _machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    main()
