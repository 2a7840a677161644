"""Theoretical occupancy from a kernel's launch configuration and the device's limits.

Kineto's `est. achieved occupancy %` assumes the default 48 KB shared-memory limit per block, so any kernel
using more reports 0, and a failed calculation writes a negative sentinel. This recomputes it the way the
CUDA occupancy calculator does: resident blocks per SM are the least of the warp, register, shared-memory
and block-count limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Max resident blocks per SM by compute capability major version (CUDA programming guide, table of
# technical specifications): 16 on Volta/Turing and Ampere consumer parts, 32 on A100/Hopper.
MAX_BLOCKS_PER_SM = {(7, 0): 32, (7, 5): 16, (8, 0): 32, (8, 6): 16, (8, 7): 16, (8, 9): 24, (9, 0): 32}
REGISTER_ALLOCATION_UNIT = 256  # registers are allocated per warp in units of 256
SHARED_MEMORY_RESERVED_PER_BLOCK = 1024  # the driver reserves 1 KB per block since Ampere


@dataclass(frozen=True)
class Occupancy:
    percent: float
    blocks_per_sm: int
    limited_by: str  # "warps", "registers", "shared memory", "blocks"


def theoretical(device: dict[str, Any], threads_per_block: int, registers_per_thread: int,
                shared_memory_per_block: int) -> Occupancy | None:
    """None when the device properties or launch configuration lack what the calculation needs (a property that
    is not a positive whole number counts as missing: it comes from the trace's writer, whoever that was)."""
    warp_size = _count(device, "warpSize") or 32
    max_threads = _count(device, "maxThreadsPerMultiprocessor")
    regs_per_sm = _count(device, "regsPerMultiprocessor") or _count(device, "regsPerBlock")
    smem_per_sm = _count(device, "sharedMemPerMultiprocessor")
    smem_per_block = _count(device, "sharedMemPerBlockOptin") or _count(device, "sharedMemPerBlock")
    if not max_threads or not regs_per_sm or threads_per_block <= 0 or max_threads < warp_size:
        return None
    cc = (_count(device, "computeMajor") or 0, _count(device, "computeMinor") or 0)
    max_blocks = MAX_BLOCKS_PER_SM.get(cc, 32 if cc[0] >= 9 else 16)
    max_warps = max_threads // warp_size
    warps_per_block = -(-threads_per_block // warp_size)

    limits = {"warps": max_warps // warps_per_block, "blocks": max_blocks}
    if registers_per_thread > 0:
        regs_per_warp = -(-registers_per_thread * warp_size // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
        limits["registers"] = int(regs_per_sm) // (regs_per_warp * warps_per_block)
    if shared_memory_per_block > 0 and smem_per_sm:
        if smem_per_block and shared_memory_per_block > smem_per_block:
            return Occupancy(0.0, 0, "shared memory")
        reserved = SHARED_MEMORY_RESERVED_PER_BLOCK if cc[0] >= 8 else 0
        limits["shared memory"] = int(smem_per_sm) // (shared_memory_per_block + reserved)
    limited_by = min(limits, key=lambda k: (limits[k], k))
    blocks = max(0, limits[limited_by])
    percent = 100.0 * blocks * warps_per_block / max_warps
    return Occupancy(round(min(percent, 100.0), 1), blocks, limited_by)


def _count(device: dict[str, Any], key: str) -> int | None:
    """A device property as a positive whole number, or None."""
    value = device.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 2**62:
        return None
    return int(value) if value == int(value) else None
