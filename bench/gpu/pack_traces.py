"""Pack a GPU run's traces for the trip back: tars of at most 15 MiB each (the device returns at most 8 files of
16 MiB, 64 MiB in all), smallest traces first, a trace too big for one tar left out with a line saying so.

    python bench/gpu/pack_traces.py WORK_DIR OUT_DIR [MAX_TARS]   (default 5)
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

TAR_BYTES = 15 * 2**20


def pack(work: Path, out: Path, max_tars: int) -> int:
    groups: list[list[Path]] = []
    size = 0
    for path in sorted(work.glob("*.pt.trace.json.gz"), key=lambda p: (p.stat().st_size, p.name)):
        bytes_ = path.stat().st_size
        if bytes_ > TAR_BYTES:
            print("too big, left out:", path.name, bytes_)
            continue
        if not groups or size + bytes_ > TAR_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(path)
        size += bytes_
    for number, group in enumerate(groups[:max_tars], 1):
        with tarfile.open(out / f"traces-{number}.tar", "w") as tar:
            for path in group:
                tar.add(path, arcname=path.name)
    for group in groups[max_tars:]:
        print("out of room, left out:", " ".join(p.name for p in group))
    return 0 if len(groups) <= max_tars else 1


if __name__ == "__main__":
    sys.exit(pack(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 5))
