"""Benchmark: `attntrace lint` on a trace whose events all share one timestamp, beside the same events at distinct
timestamps (issue 43: 60k events at one `ts` took 14.1 s of CPU against 1.6 s distinct; the goal is at most 2x at
any count, 1M included).

Both traces repeat the GPT-2 training sample (14k events) until they hold about N events, with External ids,
correlation ids, flow ids and step numbers shifted so that every copy stays linked like the original. In the
"one" trace every timestamp is the same (a stopped clock: durations kept, so ops nest by containment and launches
tie with each other); in the "frozen" trace every duration is the same too (so ops tie in start and end); in the
"ops" trace only the CPU ops share one start (they nest in one chain as deep as their number, and the launches
after it, at their own times, look for their op in it); in the "distinct" trace each copy follows the previous one
in time.

Run: python bench/bench_shared_ts.py [--events 60000 120000 1000000] [--repeats 1] [--tree DIR] [--timeout 300]
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
from process_cost import Cost, whole_tree_cost

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "sample_traces/workloads/gpt2_eager_train.pt.trace.json.gz"
T0 = 1_000_000.0
FROZEN_DUR = 1.0
CLOCKS = ("distinct", "one", "frozen", "ops")
ID_KEYS = ("External id", "external id", "correlation", "Ev Idx")


def _copy(event: dict[str, Any], k: int, span: float, id_span: int, step_span: int, clock: str) -> dict[str, Any]:
    out = dict(event)
    if isinstance(out.get("ts"), (int, float)):
        alone = clock == "distinct" or (clock == "ops" and event.get("cat") != "cpu_op")
        out["ts"] = event["ts"] + k * span if alone else T0
    if clock == "frozen" and isinstance(out.get("dur"), (int, float)):
        out["dur"] = FROZEN_DUR
    if isinstance(out.get("id"), int):
        out["id"] = event["id"] + k * id_span
    name = out.get("name", "")
    if isinstance(name, str) and name.startswith("ProfilerStep#") and name[13:].isdigit():
        out["name"] = f"ProfilerStep#{int(name[13:]) + k * step_span}"
    if isinstance(event.get("args"), dict):
        args = dict(event["args"])
        for key in ID_KEYS:
            if isinstance(args.get(key), int) and args[key] > 0:
                args[key] += k * id_span
        out["args"] = args
    return out


def build(events: int, clock: str, out: Path, source: Path = SOURCE) -> int:
    """Write a trace of about `events` events (the source repeated) to `out`; returns the events written."""
    doc = orjson.loads(gzip.decompress(source.read_bytes()))
    meta = [e for e in doc["traceEvents"] if e.get("ph") == "M"]
    body = [e for e in doc["traceEvents"] if e.get("ph") != "M"]
    timed = [e for e in body if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000.0
    id_span = 1 + max(max([e.get("id", 0) if isinstance(e.get("id"), int) else 0]
                          + [v for k, v in e.get("args", {}).items() if k in ID_KEYS and isinstance(v, int)])
                      for e in body)
    numbers = [int(e["name"][13:]) for e in body
               if str(e.get("name", "")).startswith("ProfilerStep#") and e["name"][13:].isdigit()]
    step_span = max(numbers) - min(numbers) + 1 if numbers else 0
    copies = max(1, round(events / len(body)))
    doc["traceEvents"] = ["@@EVENTS@@"]
    prefix, suffix = orjson.dumps(doc).split(b'"@@EVENTS@@"')
    with out.open("wb") as fh:
        fh.write(prefix)
        fh.write(b",".join(map(orjson.dumps, meta)))
        for k in range(copies):
            fh.write(b",")
            fh.write(b",".join(orjson.dumps(_copy(e, k, span, id_span, step_span, clock)) for e in body))
        fh.write(suffix)
    return len(meta) + copies * len(body)


def lint_cost(path: Path, tree: Path | None, timeout: float) -> Cost:
    """Whole-process `lint` of one trace, its worker processes included."""
    env = {**os.environ, **({"PYTHONPATH": str(tree.resolve())} if tree else {})}
    argv = [sys.executable, "-m", "attntrace", "lint", str(path), "--format", "json", "--output", os.devnull,
            "--fail-on", "never", "--jobs", "1"]
    return whole_tree_cost(argv, timeout, cwd=Path("/") if tree else ROOT, env=env)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, nargs="+", default=[60_000, 120_000, 1_000_000])
    parser.add_argument("--clocks", nargs="+", choices=CLOCKS, default=list(CLOCKS),
                        help="distinct: each copy after the last; one: every ts the same; frozen: every ts and every "
                        "dur the same (a clock that did not move); the first is the one the others are measured by")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each; the least CPU time is shown")
    parser.add_argument("--tree", type=Path, help="measure the attntrace package in this source tree (e.g. a "
                        "worktree of an older commit) instead of this one")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--keep", type=Path, help="write the traces into this directory and reuse them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"{'events':>9} {'timestamps':>10} {'MB':>6} {'wall s':>7} {'CPU s':>7} {'peak MiB':>8}  ended")
        for count in args.events:
            cpu_of: dict[str, float] = {}
            for kind in args.clocks:
                path = folder / f"shared_ts_{kind}_{count}.json"
                if not path.exists():
                    written = build(count, kind, path)
                    path.with_suffix(".count").write_text(str(written))
                written = int(path.with_suffix(".count").read_text())
                runs = [lint_cost(path, args.tree, args.timeout) for _ in range(args.repeats)]
                best = min(runs, key=lambda r: r.cpu)
                cpu_of[kind] = best.cpu
                print(f"{written:9d} {kind:>10} {path.stat().st_size / 1e6:6.1f} {best.wall:7.2f} {best.cpu:7.2f} "
                      f"{best.peak / 2**20:8.0f}  {best.ended}", flush=True)
            for kind in args.clocks[1:]:
                print(f"{'':9} {kind} / {args.clocks[0]} CPU: {cpu_of[kind] / cpu_of[args.clocks[0]]:.2f}x "
                      "(goal <= 2x)", flush=True)


if __name__ == "__main__":
    main()
