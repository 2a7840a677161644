"""Benchmark: `attntrace lint DIR --jobs 2 --format json` on a directory of N small traces (issue 43: 10,000
traces of two steps, about 1 KB each, took 725 s on 2 cores; 200 of them cost 21.8 s of CPU against 6.3 s at
fd095e3). Reports the whole process tree's wall and CPU time, the CPU per file, and the peak resident memory of
its largest process.

Each small trace is cut from a real sample (the low-occupancy kernel workload, an H200 capture): its header, and
from each of its first two steps the step annotation, the first aten op, the first kernel launch and the kernel
that launch ran (2.3 KB). File k is shifted by k steps in time and ids, as successive captures of a sweep would be.

Run: python bench/bench_many_files.py [--files 200 10000] [--jobs 2] [--tree DIR] [--timeout 600]
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
from process_cost import whole_tree_cost

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "sample_traces/workloads/low_occupancy_kernel.pt.trace.json.gz"


def small_trace(source: Path = SOURCE) -> dict[str, Any]:
    """Two steps of the source, each one op, one launch and one kernel."""
    doc = orjson.loads(gzip.decompress(source.read_bytes()))
    events = doc["traceEvents"]
    steps = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    kept: list[dict[str, Any]] = []  # no process and thread names: they were most of the bytes
    for step in steps[:2]:
        inside = sorted((e for e in events if e.get("ph") == "X" and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]),
                        key=lambda e: e["ts"])
        op = next(e for e in inside if e.get("cat") == "cpu_op")
        launch = next(e for e in inside if e.get("cat") == "cuda_runtime" and "Launch" in e.get("name", ""))
        correlation = launch["args"]["correlation"]
        kernel = next(e for e in events if e.get("cat") == "kernel" and e["args"].get("correlation") == correlation)
        kept += [step, op, launch, kernel]
    doc["traceEvents"] = kept
    return doc


def write_traces(folder: Path, count: int) -> int:
    """`count` small traces in `folder`; returns the size of one."""
    doc = small_trace()
    timed = [e for e in doc["traceEvents"] if "ts" in e]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000.0
    size = 0
    for k in range(count):
        events = []
        for event in doc["traceEvents"]:
            event = dict(event)
            if "ts" in event:
                event["ts"] += k * span
            if isinstance(event.get("args"), dict):
                event["args"] = {key: value + k * 100_000 if key in ("External id", "correlation")
                                 and isinstance(value, int) else value for key, value in event["args"].items()}
            if str(event.get("name", "")).startswith("ProfilerStep#"):
                event["name"] = f"ProfilerStep#{int(event['name'][13:]) + 2 * k}"
            events.append(event)
        data = orjson.dumps({**doc, "traceEvents": events})
        (folder / f"rank{k:05d}.pt.trace.json").write_bytes(data)
        size = len(data)
    return size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, nargs="+", default=[200])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each; the least CPU time is shown")
    parser.add_argument("--tree", type=Path, help="measure the attntrace package in this source tree (e.g. a "
                        "worktree of an older commit) instead of this one")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--keep", type=Path, help="write the traces under this directory and reuse them")
    args = parser.parse_args()
    env = {**os.environ, **({"PYTHONPATH": str(args.tree.resolve())} if args.tree else {})}
    print(f"{'files':>6} {'KB each':>7} {'wall s':>7} {'CPU s':>7} {'CPU ms/file':>11} {'peak MiB':>8}  ended")
    with tempfile.TemporaryDirectory() as tmp:
        for count in args.files:
            folder = (args.keep or Path(tmp)) / f"small_{count}"
            if not folder.exists() or len(list(folder.iterdir())) != count:
                folder.mkdir(parents=True, exist_ok=True)
                write_traces(folder, count)
            size = (folder / "rank00000.pt.trace.json").stat().st_size
            argv = [sys.executable, "-m", "attntrace", "lint", str(folder), "--jobs", str(args.jobs), "--format",
                    "json", "--output", os.devnull, "--fail-on", "never"]
            runs = [whole_tree_cost(argv, args.timeout, cwd=Path("/") if args.tree else ROOT, env=env)
                    for _ in range(args.repeats)]
            best = min(runs, key=lambda r: r.cpu if r.cpu == r.cpu else float("inf"))
            print(f"{count:6d} {size / 1e3:7.1f} {best.wall:7.1f} {best.cpu:7.1f} {1e3 * best.cpu / count:11.1f} "
                  f"{best.peak / 2**20:8.0f}  {best.ended}", flush=True)


if __name__ == "__main__":
    main()
