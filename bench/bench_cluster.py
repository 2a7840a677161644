"""Benchmark: `attntrace lint --scheduler local:W` over N hard-linked copies of the large benchmark trace, as
a user runs it (whole process, cluster start-up included); prints MB/s in all and per worker.

Run: python bench/bench_cluster.py [--mb 200] [--copies 8 64] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_read import build_large


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--copies", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp, "source.pt.trace.json")
        size = build_large(args.mb, source)
        print(f"trace: {size / 1e6:.0f} MB uncompressed; {os.cpu_count()} cores")
        print("copies workers   wall_s   MB/s  MB/s/worker")
        for copies in args.copies:
            folder = Path(tmp, f"job{copies}")
            folder.mkdir()
            for rank in range(copies):
                os.link(source, folder / f"rank{rank}.pt.trace.json")
            for workers in args.workers:
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "attntrace", "lint", str(folder), "--scheduler",
                                f"local:{workers}", "--format", "json", "--output", os.devnull, "--fail-on",
                                "never"], check=True)
                wall = time.perf_counter() - start
                rate = copies * size / 1e6 / wall
                print(f"{copies:6d} {workers:7d} {wall:8.1f} {rate:6.1f} {rate / workers:12.1f}", flush=True)


if __name__ == "__main__":
    main()
