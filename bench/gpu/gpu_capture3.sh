#!/usr/bin/env bash
# Captures the scenario sample traces (GQA, decode with a KV cache, sliding window, variable length) and a
# fresh dense run for the README table. Usage: bench/gpu/gpu_capture3.sh OUT_DIR
# Writes one OUT_DIR/<folder>.tar per run as soon as it ends (so a cut-off call keeps what finished) and
# OUT_DIR/capture3.log.
set -u
out=${1:?OUT_DIR}
st=$(mktemp -d)/sample_traces
mkdir -p "$st"
export PYTHONUNBUFFERED=1
capture() {  # folder, then attntrace run's arguments
  local folder=$1
  shift
  echo "### attntrace run $* --out $folder"
  python3 -m attntrace run "$@" --out "$st/$folder"
  echo "### exit $?"
  tar -C "$st" -cf "$out/$folder.tar" "$folder"
}
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch,triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "triton", triton.__version__)'
  capture bf16_gqa_fwd --kv-heads 2
  capture bf16_decode_kvcache --query-len 1 --kv-len 8192 --batch 8 --heads 32 --kv-heads 8 --head-dim 128
  capture bf16_decode_q16 --query-len 16 --kv-len 8192 --batch 8 --heads 32 --kv-heads 8 --head-dim 128
  capture bf16_window_fwd --window 1024 --seq 8192 --batch 1
  capture bf16_varlen_fwd --varlen --batch 8 --seq 2048
  capture bf16_causal_fwd_v2
  # Not kept as samples: the short skip reasons on PyTorch's real messages, and the fp32 peak label.
  echo "### head dim 1000"
  python3 -m attntrace run --variants sdpa_flash,sdpa_cudnn,sdpa_efficient --head-dim 1000 --seq 256 --no-lint --out /tmp/hd1000
  echo "### exit $?"
  python3 -c 'import json; [print(v["name"], "|", v["reason"], "|", v.get("detail"), "|", v["warnings"]) for v in json.load(open("/tmp/hd1000/run.json"))["variants"]]'
  echo "### fp32"
  python3 -m attntrace run --variants naive,sdpa --dtype fp32 --seq 1024 --no-lint --out /tmp/fp32
  echo "### exit $?"
  python3 -m attntrace run --variants nosuch --out /tmp/nosuch
  echo "### exit $?"
} 2>&1 | tee "$out/capture3.log"
