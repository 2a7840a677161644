"""Benchmark: `attntrace lint` on a large Nsight Systems SQLite export beside the same events as a Kineto trace,
as a user runs them (whole process, best of --repeats), per event, with the peak memory of each.

Both files hold the same program: steps (ProfilerStep#N ranges), and in each step kernels launched from under an
op (`aten::mm` with emit_nvtx's text in the export, a cpu_op in the Kineto trace), each kernel with its
cudaLaunchKernel and correlation id, in the real schema (the CREATE TABLE statements of tests/data/nsys/mock.sqlite
and NVTX_EVENTS's of h100_2gpu_1s.sqlite). Kernels alternate an FP32 GEMM and an elementwise kernel, so that
rules have work to do.

Run: python bench/bench_nsys.py [--kernels 1000000] [--per-step 1000] [--repeats 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_FROM = ROOT / "tests/data/nsys/mock.sqlite"
NVTX_SCHEMA_FROM = ROOT / "tests/data/nsys/h100_2gpu_1s.sqlite"
PID, TID = 4242, 4243
GLOBAL_TID = (1 << 56) | (PID << 24) | TID
BASE_NS = 1_000_000_000
KERNELS = ["sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_"
           "execute_kernel__5x_cublas",
           "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, "
           "std::array<char *, (unsigned long)3>>(int, T2, T3)"]
KERNEL_EVERY_US = 20  # one op, launch and kernel every 20 us


def _times(kernels: int, per_step: int) -> Iterator[tuple[int, int]]:
    """(index, start in us) of each kernel's op."""
    for i in range(kernels):
        yield i, i * KERNEL_EVERY_US + (i // per_step) * 50


def build_export(path: Path, kernels: int, per_step: int) -> int:
    """The export; returns its number of events (kernels, runtime calls, NVTX ranges)."""
    with sqlite3.connect(f"file:{SCHEMA_FROM}?mode=ro", uri=True) as source:
        tables = [r[0] for r in source.execute("SELECT sql FROM sqlite_master WHERE type = 'table'")]
        meta = source.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall()
    with sqlite3.connect(f"file:{NVTX_SCHEMA_FROM}?mode=ro", uri=True) as source:
        tables += [r[0] for r in source.execute("SELECT sql FROM sqlite_master WHERE name = 'NVTX_EVENTS'")]
    out = sqlite3.connect(path)
    out.execute("PRAGMA journal_mode = OFF")
    out.execute("PRAGMA synchronous = OFF")
    for sql in tables:
        out.execute(sql)
    out.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)", meta)
    out.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "cudaLaunchKernel_v7000"), (2, KERNELS[0]),
                                                            (3, KERNELS[1])])
    out.execute("INSERT INTO TARGET_INFO_GPU (vmId, id, name, computeMajor, computeMinor, smCount, threadsPerWarp, "
                "maxWarpsPerSm, maxRegistersPerSm, maxRegistersPerBlock, maxShmemPerSm, maxShmemPerBlockOptin, "
                "maxThreadsPerBlock) VALUES (0, 0, 'NVIDIA H100 80GB HBM3', 9, 0, 132, 32, 64, 65536, 65536, "
                "233472, 232448, 1024)")
    ns = BASE_NS
    out.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, "
        "returnValue) VALUES (?, ?, 0, ?, ?, 1, 0)",
        ((ns + (t + 2) * 1000, ns + (t + 6) * 1000, GLOBAL_TID, i + 1) for i, t in _times(kernels, per_step)))
    out.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
        "demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, "
        "staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) "
        "VALUES (?, ?, 0, 1, 7, ?, ?, ?, 64, 264, 1, 1, 128, 1, 1, 0, 0, 0, 0, ?)",
        ((ns + (t + 8) * 1000, ns + (t + 18) * 1000, i + 1, 2 + i % 2, 2 + i % 2, i + 1)
         for i, t in _times(kernels, per_step)))
    steps = ((f"ProfilerStep#{s + 1}", s * per_step) for s in range(-(-kernels // per_step)))
    out.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
        ((ns + (first * KERNEL_EVERY_US + (first // per_step) * 50) * 1000,
          ns + ((min(first + per_step, kernels)) * KERNEL_EVERY_US + (first // per_step) * 50) * 1000, name,
          GLOBAL_TID) for name, first in steps))
    out.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
        ((ns + t * 1000, ns + (t + 10) * 1000, f"aten::mm, seq = {i}, op_id = {i + 1}", GLOBAL_TID)
         for i, t in _times(kernels, per_step)))
    out.commit()
    out.close()
    return 2 * kernels + kernels + -(-kernels // per_step)


def build_kineto(path: Path, kernels: int, per_step: int) -> int:
    """The same events as a Kineto trace (PyTorch's compact layout, gzip)."""
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(b'{"schemaVersion":1,"deviceProperties":[{"id":0,"name":"NVIDIA H100 80GB HBM3","computeMajor":9,'
                 b'"computeMinor":0,"numSms":132,"warpSize":32,"maxThreadsPerMultiprocessor":2048,'
                 b'"regsPerMultiprocessor":65536,"sharedMemPerMultiprocessor":233472,"maxThreadsPerBlock":1024}],'
                 b'"traceEvents":[')
        first = True
        for s in range(-(-kernels // per_step)):
            start = s * per_step * KERNEL_EVERY_US + s * 50
            end = min((s + 1) * per_step, kernels) * KERNEL_EVERY_US + s * 50
            fh.write((b"" if first else b",") + orjson.dumps(
                {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "pid": PID, "tid": TID,
                 "ts": start, "dur": end - start, "args": {}}))
            first = False
        batch: list[bytes] = []
        for i, t in _times(kernels, per_step):
            batch.append(orjson.dumps({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID, "tid": TID,
                                       "ts": t, "dur": 10, "args": {"External id": i + 1}}))
            batch.append(orjson.dumps({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID,
                                       "tid": TID, "ts": t + 2, "dur": 4,
                                       "args": {"External id": i + 1, "correlation": i + 1}}))
            batch.append(orjson.dumps({"ph": "X", "cat": "kernel", "name": KERNELS[i % 2], "pid": 0, "tid": 7,
                                       "ts": t + 8, "dur": 10,
                                       "args": {"External id": i + 1, "correlation": i + 1, "device": 0,
                                                "stream": 7, "registers per thread": 64, "shared memory": 0,
                                                "grid": [264, 1, 1], "block": [128, 1, 1]}}))
            if len(batch) > 30_000:
                fh.write(b"," + b",".join(batch))
                batch.clear()
        if batch:
            fh.write(b"," + b",".join(batch))
        fh.write(b"]}")
    return 3 * kernels + -(-kernels // per_step)


def timed_lint(path: Path) -> tuple[float, float]:
    """Wall seconds and peak memory (MB) of `attntrace lint` on one file, in a fresh process."""
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "r = subprocess.run([sys.executable, '-m', 'attntrace', 'lint', sys.argv[1], '--format', 'json', "
            "'--fail-on', 'never', '--jobs', '1'], stdout=subprocess.DEVNULL); "
            "w = time.perf_counter() - t; "
            "print(r.returncode, w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    if out[0] != "0":
        raise SystemExit(f"lint of {path} exited {out[0]}")
    return float(out[1]), float(out[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--per-step", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="write the two files here and keep them")
    args = parser.parse_args()
    where = args.keep or Path(tempfile.mkdtemp(prefix="bench_nsys_"))
    where.mkdir(parents=True, exist_ok=True)
    export, kineto = where / "bench.sqlite", where / "bench.pt.trace.json.gz"
    for stale in (export, kineto):
        stale.unlink(missing_ok=True)
    started = time.perf_counter()
    events = {"nsys": build_export(export, args.kernels, args.per_step),
              "kineto": build_kineto(kineto, args.kernels, args.per_step)}
    took = time.perf_counter() - started
    print(f"built {args.kernels} kernels in {took:.1f} s: {export.stat().st_size / 1e6:.0f} MB export, "
          f"{kineto.stat().st_size / 1e6:.0f} MB gzip Kineto trace", file=sys.stderr)
    results = {}
    for name, path in (("nsys", export), ("kineto", kineto)):
        runs = [timed_lint(path) for _ in range(args.repeats)]
        best = min(r[0] for r in runs)
        results[name] = {"events": events[name], "file_mb": round(path.stat().st_size / 1e6, 1),
                         "best_s": round(best, 2), "us_per_event": round(1e6 * best / events[name], 3),
                         "peak_mb": round(max(r[1] for r in runs))}
    results["nsys_over_kineto_per_event"] = round(results["nsys"]["us_per_event"]
                                                  / results["kineto"]["us_per_event"], 2)
    print(json.dumps({"kernels": args.kernels, "repeats": args.repeats, "cpus": os.cpu_count(), **results}, indent=1))
    if args.keep is None:
        for path in (export, kineto):
            path.unlink()
        where.rmdir()


if __name__ == "__main__":
    main()
