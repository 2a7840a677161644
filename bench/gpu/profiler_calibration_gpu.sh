#!/usr/bin/env bash
# The profiler-cost calibration on a GPU machine (see bench/gpu/profiler_calibration.py). Run from the repo root:
#   bash bench/gpu/profiler_calibration_gpu.sh OUT_DIR
# Leaves OUT_DIR/event_costs.json, OUT_DIR/timings.json, OUT_DIR/log.txt and the traces packed in
# OUT_DIR/traces-N.tar (each under 15 MiB).
set -u
out=${1:?OUT_DIR}
work=$(mktemp -d)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__)"
  timeout 120 python -c "
import json, sys
from attntrace.capture.profiler_cost import measure
print(json.dumps(measure('cuda'), indent=1))" > "$out/event_costs.json"
  cat "$out/event_costs.json"
  uptime; top -bn1 | head -12
  # Host noise: a small-op loop timed 20 times, free to run on any core and pinned to two; the steadier wins.
  pin=$(python - <<'PY'
import os, statistics, time, torch
x = torch.randn(1024, device="cuda")
def cv():
    samples = []
    for _ in range(20):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(400): x.mul_(1.0)
        torch.cuda.synchronize(); samples.append(time.perf_counter() - t)
    return statistics.pstdev(samples) / statistics.mean(samples), statistics.mean(samples) * 1e6 / 400
free = cv(); os.sched_setaffinity(0, {2, 3}); pinned = cv()
import sys; print(f"free cv {free[0]:.3f} {free[1]:.2f} us/op, pinned cv {pinned[0]:.3f} {pinned[1]:.2f} us/op", file=sys.stderr)
print("taskset -c 2,3" if pinned[0] < free[0] else "")
PY
)
  echo "pin: ${pin:-none}"
  timeout ${CAL_TIMEOUT:-420} $pin python bench/gpu/profiler_calibration.py "$work" ${CAL_WORKLOADS:-}
  cp "$work/timings.json" "$out/" 2>/dev/null
} 2>&1 | tee "$out/log.txt"
# Pack traces into tars of at most 15 MiB (the transfer takes 8 files of 16 MiB).
python bench/gpu/pack_traces.py "$work" "$out" 5
ls -la "$out"
