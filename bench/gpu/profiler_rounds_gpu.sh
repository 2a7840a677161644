#!/usr/bin/env bash
# bench/gpu/profiler_rounds.py's capture on the GPU machine, pinned to two cores as the calibration set was
# (bench/gpu/profiler_calibration_gpu.sh). Run from the repo root:
#   bash bench/gpu/profiler_rounds_gpu.sh OUT_DIR ROUNDS WORKLOAD...
# Leaves OUT_DIR/rounds.json, OUT_DIR/log.txt and the traces packed in OUT_DIR/traces-N.tar (each under 15 MiB).
set -u
out=${1:?OUT_DIR}; rounds=${2:?ROUNDS}; shift 2
work=$(mktemp -d)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__)"
  uptime
  timeout ${ROUNDS_TIMEOUT:-500} taskset -c 2,3 python bench/gpu/profiler_rounds.py capture "$work" --rounds "$rounds" "$@"
  cp "$work/rounds.json" "$out/"
} 2>&1 | tee "$out/log.txt"
python bench/gpu/pack_traces.py "$work" "$out" 6
ls -la "$out"
