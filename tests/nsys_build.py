"""Nsight Systems SQLite exports made here, in the real schema (the CREATE TABLE statements of
tests/data/nsys/mock.sqlite, an nsys 2026.1 export, and NVTX_EVENTS's of h100_2gpu_1s.sqlite, a 2026.2 one) with
the rows a test chooses."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from conftest import DATA

SCHEMA_FROM = DATA / "nsys" / "mock.sqlite"
NVTX_SCHEMA_FROM = DATA / "nsys" / "h100_2gpu_1s.sqlite"  # mock.sqlite has no NVTX_EVENTS table
PID = 4242
TID = 4243
GLOBAL_TID = (1 << 56) | (PID << 24) | TID  # nsys's serialized GlobalId: pid in bits 24-47, tid in bits 0-23
LAUNCH = "cudaLaunchKernel_v7000"
FP32_GEMM = ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_"
             "execute_kernel__5x_cublas")
TF32_GEMM = ("sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_"
             "execute_kernel__5x_cublas")
ELEMENTWISE = ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, "
               "std::array<char *, (unsigned long)3>>(int, T2, T3)")
# An H100 SXM as nsys writes it in TARGET_INFO_GPU.
H100 = {"vmId": 0, "id": 0, "name": "NVIDIA H100 80GB HBM3", "totalMemory": 85_520_809_984, "smCount": 132,
        "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxRegistersPerBlock": 65536,
        "maxRegistersPerSm": 65536, "threadsPerWarp": 32, "maxWarpsPerSm": 64, "maxBlocksPerSm": 32,
        "maxShmemPerBlock": 49152, "maxShmemPerBlockOptin": 232448, "maxShmemPerSm": 233472}


@dataclass
class Kernel:
    name: str
    start_us: float
    dur_us: float
    registers: int = 32
    block: int = 256
    grid: int = 1024
    shared: int = 0
    launch_at_us: float | None = None  # when its cudaLaunchKernel starts (None: 5 us before the kernel)


@dataclass
class Export:
    kernels: list[Kernel] = field(default_factory=list)
    ranges: list[tuple[str, float, float]] = field(default_factory=list)  # NVTX text, start us, end us
    device: dict[str, object] | None = field(default_factory=lambda: dict(H100))

    def write(self, path: Path) -> Path:
        source = sqlite3.connect(f"file:{SCHEMA_FROM}?mode=ro", uri=True)
        tables = [row[0] for row in source.execute("SELECT sql FROM sqlite_master WHERE type = 'table'")]
        meta = source.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall()
        source.close()
        with sqlite3.connect(f"file:{NVTX_SCHEMA_FROM}?mode=ro", uri=True) as nvtx:
            tables += [row[0] for row in nvtx.execute("SELECT sql FROM sqlite_master WHERE name = 'NVTX_EVENTS'")]
        out = sqlite3.connect(path)
        for sql in tables:
            out.execute(sql)
        out.executemany("INSERT INTO META_DATA_EXPORT (name, value) VALUES (?, ?)", meta)
        strings: dict[str, int] = {}

        def string(text: str) -> int:
            return strings.setdefault(text, len(strings) + 1)

        if self.device:
            columns = ", ".join(self.device)
            marks = ", ".join("?" * len(self.device))
            out.execute(f"INSERT INTO TARGET_INFO_GPU ({columns}) VALUES ({marks})", list(self.device.values()))
        base = 1_000_000_000  # ns: exports keep the session's clock
        for correlation, k in enumerate(self.kernels, start=1):
            start = base + int(k.start_us * 1000)
            launch = base + int(((k.launch_at_us if k.launch_at_us is not None else k.start_us - 5.0)) * 1000)
            out.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, "
                        "nameId, returnValue) VALUES (?, ?, 0, ?, ?, ?, 0)",
                        (launch, launch + 3000, GLOBAL_TID, correlation, string(LAUNCH)))
            out.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
                "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, "
                "blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) "
                "VALUES (?, ?, 0, 1, 7, ?, ?, ?, ?, ?, ?, 1, 1, ?, 1, 1, ?, 0, 0, 0, ?)",
                (start, start + int(k.dur_us * 1000), correlation, GLOBAL_TID >> 24 << 24, string(k.name),
                 string(k.name.split("(")[0][-60:]), k.registers, k.grid, k.block, k.shared, correlation))
        for text, start_us, end_us in self.ranges:
            out.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
                        (base + int(start_us * 1000), base + int(end_us * 1000), text, GLOBAL_TID))
        out.executemany("INSERT INTO StringIds (id, value) VALUES (?, ?)", [(i, s) for s, i in strings.items()])
        out.commit()
        out.close()
        return path
