#!/usr/bin/env bash
# bench/profiler_rounds.py's capture on the GPU machine, pinned to two cores as the calibration set was
# (bench/profiler_calibration_gpu.sh). Run from the repo root:
#   bash bench/profiler_rounds_gpu.sh OUT_DIR ROUNDS WORKLOAD...
# Leaves OUT_DIR/rounds.json, OUT_DIR/log.txt and the traces packed in OUT_DIR/traces-N.tar (each under 15 MiB).
set -u
out=${1:?OUT_DIR}; rounds=${2:?ROUNDS}; shift 2
work=$(mktemp -d)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__)"
  uptime
  timeout ${ROUNDS_TIMEOUT:-500} taskset -c 2,3 python bench/profiler_rounds.py capture "$work" --rounds "$rounds" "$@"
  cp "$work/rounds.json" "$out/"
} 2>&1 | tee "$out/log.txt"
python - "$work" "$out" <<'PY'
import sys, tarfile
from pathlib import Path
work, out = Path(sys.argv[1]), Path(sys.argv[2])
n, size, tar = 0, 0, None
for f in sorted(work.glob("*.pt.trace.json.gz")):
    s = f.stat().st_size
    if tar is None or size + s > 15 * 2**20:
        if tar: tar.close()
        n += 1
        if n > 6: print("out of room, left out from:", f.name); tar = None; break
        tar, size = tarfile.open(out / f"traces-{n}.tar", "w"), 0
    tar.add(f, arcname=f.name); size += s
if tar: tar.close()
PY
ls -la "$out"
