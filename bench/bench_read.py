"""Benchmark: read + model throughput and peak memory on a large trace, end-to-end lint time, and the wall
time of `attntrace summary` on a small trace.

The large trace is built by repeating the steps of a real sample trace (GPT-2 training, H200), with
timestamps, step numbers, External ids, correlation ids and flow ids shifted so that every copy stays
linked like the original. Run: python bench/bench_read.py [--mb 200]
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "sample_traces/workloads/gpt2_eager_train.pt.trace.json.gz"
SMALL = ROOT / "sample_traces/bf16_causal_fwd/naive.pt.trace.json.gz"

MEASURE = """
import gc, resource, sys, time
from attntrace import model, reader
from attntrace.lint import lint_trace
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
trace = model.build(reader.read(sys.argv[1]))
trace.gpu_linked  # the links and step attribution are part of the model
t1 = time.perf_counter()
model_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
report = lint_trace(trace)
t2 = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(t1 - t0, t2 - t0, base * 1024, peak * 1024, len(report.findings), model_peak * 1024)
"""


def build_large(target_mb: int, out: Path) -> int:
    doc = orjson.loads(gzip.decompress(SOURCE.read_bytes()))
    events = doc["traceEvents"]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000.0
    id_span = 1 + max(max(e.get("args", {}).get("External id", 0), e.get("args", {}).get("correlation", 0),
                          e.get("id", 0) if isinstance(e.get("id"), int) else 0) for e in events)
    steps = sum(1 for e in events
                if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation")
    one_copy = len(orjson.dumps(events, option=orjson.OPT_INDENT_2))
    copies = max(1, target_mb * 2**20 // one_copy)
    out_events = [e for e in events if e.get("ph") == "M"]
    for k in range(copies):
        for e in events:
            if e.get("ph") == "M":
                continue
            e2 = dict(e)
            if "ts" in e2:
                e2["ts"] = e["ts"] + k * span
            if isinstance(e2.get("id"), int):
                e2["id"] = e["id"] + k * id_span
            name = e2.get("name", "")
            if isinstance(name, str) and name.startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{int(name.split('#')[1]) + k * steps}"
            if "args" in e:
                args = dict(e["args"])
                for key in ("External id", "correlation"):
                    if isinstance(args.get(key), int) and args[key] > 0:
                        args[key] += k * id_span
                e2["args"] = args
            out_events.append(e2)
    doc["traceEvents"] = out_events
    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    out.write_bytes(data)
    return len(data)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--build", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        build_large(args.mb, Path(args.build))
        return
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.pt.trace.json"
        # Built in a child process: a parent holding the trace would inflate the children's peak RSS.
        subprocess.run([sys.executable, __file__, "--mb", str(args.mb), "--build", str(big)], check=True)
        size = big.stat().st_size
        runs = []
        for _ in range(args.repeats):
            line = subprocess.run([sys.executable, "-c", MEASURE, str(big)], check=True, capture_output=True,
                                  text=True).stdout.split()
            runs.append([float(x) for x in line])
        read_s = statistics.median(r[0] for r in runs)
        lint_s = statistics.median(r[1] for r in runs)
        peak = max(r[3] for r in runs)
        model_peak = max(r[5] for r in runs)
        peak_over_base = max(r[3] - r[2] for r in runs)
        print(f"large trace: {size / 2**20:.0f} MiB uncompressed, {args.repeats} runs (median)")
        print(f"  read + model: {read_s:.2f} s = {size / 1e6 / read_s:.0f} MB/s = {size / 2**20 / read_s:.0f} MiB/s"
              "   (goal >= 150 MB/s)")
        print(f"  lint end to end: {lint_s:.2f} s = {size / 1e6 / lint_s:.0f} MB/s = {size / 2**20 / lint_s:.0f} MiB/s")
        print(f"  peak RSS after read + model: {model_peak / 2**20:.0f} MiB = {model_peak / size:.2f}x the trace "
              "(goal <= 2.5x)")
        print(f"  peak RSS after lint: {peak / 2**20:.0f} MiB = {peak / size:.2f}x the trace "
              f"({peak_over_base / 2**20:.0f} MiB above the interpreter and imports)")
    walls = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "attntrace", "summary", str(SMALL)], check=True, capture_output=True)
        walls.append(time.perf_counter() - t0)
    print(f"attntrace summary on a small trace ({SMALL.stat().st_size / 1024:.0f} KiB gz): "
          f"median {statistics.median(walls):.3f} s wall over 5 runs (goal < 0.5 s)")


if __name__ == "__main__":
    main()
