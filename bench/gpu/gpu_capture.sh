#!/usr/bin/env bash
# Captures sample_traces/ on a CUDA machine. Usage: bench/gpu/gpu_capture.sh OUT_DIR
# Writes OUT_DIR/sample_traces.tar (the traces and run.json files) and logs beside it.
set -u
out=${1:?OUT_DIR}
st=$(mktemp -d)/sample_traces
mkdir -p "$st"
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch,triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "triton", triton.__version__)'
  python3 -m attntrace run --variants all --dtype bf16 --out "$st/bf16_causal_fwd"
  python3 -m attntrace run --variants naive,sdpa_flash --dtype bf16 --backward --out "$st/bf16_causal_fwdbwd"
  python3 -m attntrace run --variants naive,sdpa --dtype fp32 --out "$st/fp32_causal_fwd"
  python3 -m attntrace.capture.scenarios "$st/workloads"
  python3 bench/gpu/triton_check.py
} 2>&1 | tee "$out/capture.log"
tar -C "$(dirname "$st")" -cf "$out/sample_traces.tar" sample_traces
ls -laR "$st" > "$out/listing.txt"
