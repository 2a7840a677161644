from __future__ import annotations

from attntrace.model.occupancy import theoretical

H200 = {"computeMajor": 9, "computeMinor": 0, "maxThreadsPerMultiprocessor": 2048, "regsPerMultiprocessor": 65536,
        "warpSize": 32, "sharedMemPerMultiprocessor": 233472, "sharedMemPerBlockOptin": 232448,
        "sharedMemPerBlock": 49152}


def test_flash_attention_register_limited():
    # FlashAttention-2 fwd on H200: 128 threads, 255 registers, 48 KB smem; Kineto reported 13%.
    occ = theoretical(H200, 128, 255, 49152)
    assert occ.percent == 12.5 and occ.limited_by == "registers" and occ.blocks_per_sm == 2


def test_shared_memory_opt_in_limit():
    occ = theoretical(H200, 64, 32, 200 * 1024)
    assert occ.blocks_per_sm == 1 and occ.limited_by == "shared memory"
    assert occ.percent == 3.1


def test_full_occupancy_and_block_limit():
    assert theoretical(H200, 256, 32, 0).percent == 100.0
    small = theoretical(H200, 32, 16, 0)
    assert small.limited_by == "blocks" and small.percent == 50.0


def test_over_the_opt_in_limit_cannot_launch():
    assert theoretical(H200, 128, 32, 240 * 1024).percent == 0.0


def test_missing_properties():
    assert theoretical({}, 128, 32, 0) is None
