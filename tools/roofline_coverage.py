"""Coverage of the roofline model (attntrace/model/roofline.py) on every trace under the given paths: per trace the
share of GPU time whose ops have a FLOP or byte model, MFU where FLOPs were modelled, and across all of them the
op kinds that leave the most GPU time unmodelled (each trace weighted by its share, so that one long trace does
not hide the others).

    python tools/roofline_coverage.py sample_traces tests/data ../shared/corpus/wild ../shared/corpus/peer
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from attntrace.model.loading import guarded, load
from attntrace.model.roofline import analyse
from attntrace.read import discover


def main(paths: list[str]) -> None:
    unmodelled: dict[str, float] = defaultdict(float)
    reasons: dict[str, str] = {}
    rows = []
    for root in paths:
        for item in discover([root]):
            if not isinstance(item, tuple):
                continue
            path = item[0]
            trace = guarded(path, load)
            if not hasattr(trace, "gpu"):
                if getattr(trace, "kind", "") != "not-a-trace":  # run.json and timings beside the traces
                    rows.append((path, "unreadable", "", ""))
                continue
            found = analyse(trace)  # type: ignore[arg-type]
            if found is None:
                rows.append((path, "no GPU work", "", ""))
                continue
            mfu = "-" if found["mfu"] is None else f"{100 * found['mfu']:.1f}%"
            rows.append((path, f"{100 * (found['coverage'] or 0):.1f}%", mfu, found["device"]["device"] or "?"))
            for u in found["unmodelled"]:
                key = u["op"] if not u["op"].startswith("kernel ") else "(no op) " + u["op"][7:60]
                if u["reason"].startswith("no input shapes"):
                    key = "(record_shapes off) " + key
                unmodelled[key] += u["share_of_gpu"] or 0.0
                reasons.setdefault(key, u["reason"])
    width = max((len(Path(r[0]).as_posix()) for r in rows), default=10)
    print(f"{'trace':<{width}}  coverage  MFU     device")
    for path, coverage, mfu, device in rows:
        print(f"{path:<{width}}  {coverage:>8}  {mfu:>6}  {device}")
    print("\nop kinds leaving GPU time unmodelled (sum over traces of each one's share of that trace's GPU time):")
    for key, share in sorted(unmodelled.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {share:7.2f}  {key}  ({reasons[key]})")


if __name__ == "__main__":
    main(sys.argv[1:] or ["sample_traces", "tests/data"])
