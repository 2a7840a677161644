"""How `lint --jobs 2` scales in the number of files: N small traces (two steps each, about 1 KB, as a sweep's
ranks and steps give) in one directory, linted whole; prints the wall time and the peak resident memory of the
process tree (the CLI and its workers, sampled every 20 ms from /proc).

    python bench/bench_many_files_batching.py [N=10000] [--jobs 2]"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def small_trace(index: int) -> dict:
    """Two ProfilerSteps of 1 ms, a launch and a kernel in each (about 1 KB of JSON)."""
    events = []
    for step in range(2):
        t = 1000.0 * step
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step + 1}", "pid": 1, "tid": 1, "ts": t,
             "dur": 900},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 10, "dur": 30},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 20,
             "dur": 5, "args": {"correlation": 2 * index + step + 1}},
            {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": t + 40, "dur": 400,
             "args": {"correlation": 2 * index + step + 1, "device": 0, "stream": 7}}]
    return {"traceEvents": events}


def write_traces(folder: Path, count: int) -> None:
    for i in range(count):
        (folder / f"rank{i:05d}.json").write_text(json.dumps(small_trace(i)))


def tree_rss(root: int) -> int:
    """Resident bytes of `root` and its descendants now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/statm") as fh:
                total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("count", type=int, nargs="?", default=10000)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "traces"
        folder.mkdir()
        write_traces(folder, args.count)
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "attntrace", "lint", "--jobs", str(args.jobs), "--format",
                                 "json", "-o", str(Path(tmp) / "report.json"), str(folder)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.02)
        wall = time.perf_counter() - start
        err = proc.stderr.read().decode() if proc.stderr else ""
        report = json.loads((Path(tmp) / "report.json").read_text())
        traces = len(report.get("traces", []))
        print(f"{args.count} files, --jobs {args.jobs}: {wall:.1f} s wall, peak RSS {peak / 2**20:.0f} MiB "
              f"(process tree), exit {proc.returncode}, {traces} traces in the report")
        if err.strip():
            print("stderr:", err.strip().splitlines()[-1][:200])


if __name__ == "__main__":
    main()
