#!/usr/bin/env bash
# Second capture for sample_traces/: Python stacks (SARIF source locations), and SDPA's default dispatch at a
# head dim the fused kernels may not take. Usage: bench/gpu/gpu_capture2.sh OUT_DIR
set -u
out=${1:?OUT_DIR}
st=$(mktemp -d)/sample_traces
mkdir -p "$st"
export PYTHONUNBUFFERED=1
{
  python3 -m attntrace run --variants naive,sdpa_math --with-stack --out "$st/bf16_causal_fwd_stack"
  python3 -m attntrace run --variants sdpa,sdpa_math --head-dim 512 --seq 1024 --out "$st/bf16_causal_fwd_d512"
  python3 -m attntrace run --variants sdpa --dtype fp32 --backward --out "$st/fp32_causal_fwdbwd"
} 2>&1 | grep -v -i warn | tee "$out/capture2.log"
tar -C "$(dirname "$st")" -cf "$out/sample_traces2.tar" sample_traces
