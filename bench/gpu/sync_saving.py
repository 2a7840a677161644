"""What removing a host sync really saves, against what AT302 claims it saves (issue 22: "AT302: the sync
removed", judged without the profiler).

Each workload runs in two forms that differ only in the sync: with it (a `.item()` per micro-batch or per step,
as programs log their loss) and without it (the loss kept on the GPU, read once after the timed steps). Both are
timed without the profiler, interleaved over rounds so the host's drift falls on both; the form with the sync is
also captured (plain and record_shapes), and AT302's claimed saving per step is read off those traces here.

On the GPU machine:
    python bench/gpu/sync_saving.py capture OUT_DIR [--rounds 3]
writes OUT_DIR/WORKLOAD.SETTING.pt.trace.json.gz and OUT_DIR/sync_saving.json ({"_host": ..., WORKLOAD:
{"with_sync_ms": [...], "without_sync_ms": [...]}}).

Here (no GPU):
    python bench/gpu/sync_saving.py report OUT_DIR
prints, per workload, the saving timed (median over rounds of with - without) beside AT302's claim on each trace.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Step = Callable[[], None]


class LossLog:
    """Where a step's loss goes: read on the host at once (`.item()`, a sync), or kept on the GPU and read later
    (a bounded list, so memory stays flat)."""

    def __init__(self, sync: bool) -> None:
        self.sync = sync
        self.kept: list[Any] = []

    def __call__(self, loss: Any) -> None:
        if self.sync:
            float(loss.item())
            return
        self.kept.append(loss.detach())
        if len(self.kept) > 256:
            self.kept.clear()


def _workloads() -> dict[str, Callable[[bool], Step]]:
    """bench/gpu/profiler_calibration.py's workloads that log their loss, each with and without the sync: its
    mlp_item_sync (a .item() per micro-batch), gpt2_train_item (one per step) and ResNet-50 training (GPU-bound:
    the sync drains a deep queue)."""
    from profiler_calibration import gpt2_train, mlp_item_sync, resnet_train

    return {"mlp_item_sync": lambda sync: mlp_item_sync(log=LossLog(sync)),
            "gpt2_train_item": lambda sync: gpt2_train(after=LossLog(sync)),
            "resnet50_train_item": lambda sync: resnet_train(after=LossLog(sync))}


def capture_all(out: Path, rounds: int) -> int:
    import torch
    from profiler_calibration import SETTINGS, capture, host_info, time_unprofiled

    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"_host": host_info(), "_rounds": rounds}
    for name, factory in _workloads().items():
        started = time.perf_counter()
        with_sync, without_sync = factory(True), factory(False)
        for step in (with_sync, without_sync):
            for _ in range(3):
                step()
        timed: dict[str, list[float]] = {"with_sync_ms": [], "without_sync_ms": []}
        for _ in range(rounds):
            timed["with_sync_ms"].append(time_unprofiled(with_sync)[0])
            timed["without_sync_ms"].append(time_unprofiled(without_sync)[0])
        for setting in ("plain", "shapes"):
            capture(with_sync, out / f"{name}.{setting}.pt.trace.json.gz", SETTINGS[setting], True, 5)
        timed["with_sync_after_ms"] = [time_unprofiled(with_sync)[0]]
        timed["without_sync_after_ms"] = [time_unprofiled(without_sync)[0]]
        results[name] = timed
        print(f"{name}: with {statistics.median(timed['with_sync_ms']):.3f} ms, without "
              f"{statistics.median(timed['without_sync_ms']):.3f} ms ({time.perf_counter() - started:.0f} s)",
              flush=True)
        del with_sync, without_sync
        torch.cuda.empty_cache()
        (out / "sync_saving.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    return 0


def report(directory: Path) -> int:
    from tabulate import tabulate

    from attntrace.api import lint

    timings = json.loads((directory / "sync_saving.json").read_text())
    rows = []
    for name in sorted(k for k in timings if not k.startswith("_")):
        timed = timings[name]
        pairs = list(zip(timed["with_sync_ms"] + timed["with_sync_after_ms"],
                         timed["without_sync_ms"] + timed["without_sync_after_ms"], strict=True))
        saving_us = statistics.median(w - wo for w, wo in pairs) * 1e3
        for setting in ("plain", "shapes"):
            path = directory / f"{name}.{setting}.pt.trace.json.gz"
            if not path.exists():
                continue
            # Every sync chain, however small its claim (min_idle_us 0): the claim is what is compared.
            report = json.loads(lint(str(path), select="AT302,AT402", settings={"AT302.min_idle_us": 0.0}).to_json())
            # AT302 findings are causes of their own or consequences inside an AT402.
            every = [c for f in report["findings"] for c in (f, *f.get("consequences", []))]
            claims = [f for f in every if f["rule"] == "AT302"]
            claimed = sum(f["impact"]["gpu_us_per_step"] for f in claims)
            recorded = sum(f["evidence"]["recorded_gpu_idle_us_per_step"] for f in claims)
            rows.append([name, setting, f"{statistics.median(timed['with_sync_ms']):.3f}",
                         f"{statistics.median(timed['without_sync_ms']):.3f}", f"{saving_us:.0f}",
                         f"{claimed:.0f}", f"{recorded:.0f}",
                         ", ".join(sorted({f['severity'] for f in claims})) or "-"])
    print(tabulate(rows, headers=["workload", "setting", "with sync ms", "without sync ms", "saving timed us",
                                  "AT302 claims us", "idle after syncs as recorded us", "AT302"],
                   tablefmt="github"))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["capture"] and len(argv) >= 2:
        rounds = int(argv[3]) if argv[2:3] == ["--rounds"] else 3
        return capture_all(Path(argv[1]), rounds)
    if argv[:1] == ["report"] and len(argv) == 2:
        return report(Path(argv[1]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
