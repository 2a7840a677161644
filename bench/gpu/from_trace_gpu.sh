#!/usr/bin/env bash
# Checks `attntrace run --from-trace` against real Hugging Face models on a GPU, in under 8 minutes:
# builds four models from configs (a GQA Llama training step, a GPT-2 training step, a BERT forward and a Llama
# generate() with a KV cache), each in eager and in SDPA attention; times each step without the profiler and
# captures a trace of it with record_shapes=True; runs `attntrace run --from-trace` on every trace (the eager ones
# first); and writes the per-step saving that the eager traces' runs predict for switching to sdpa next to the
# saving timed.
#
#   bench/gpu/from_trace_gpu.sh OUT_DIR                       on the GPU machine
#   bench/gpu/from_trace_gpu.sh OUT_DIR --tiny --device cpu   a check of the script itself on a CPU
#
# OUT_DIR gets 8 files: results.json, results.md, from_trace_gpu.log (versions first), one
# traces_<model>.tar.gz per model (its two traces and timings) and fromtrace_runs.tar.gz (each run's run.json,
# tables and variant traces). Past 400 s no new run starts, so the report and the archives are always written.
set -u
out=${1:?OUT_DIR}
shift
extra=("$@")
device=cuda
for ((i = 0; i < ${#extra[@]}; i++)); do
  if [[ ${extra[$i]} == --device ]]; then device=${extra[$((i + 1))]}; fi
done
mkdir -p "$out"
work=$(mktemp -d)
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
variants=naive,sdpa_math,sdpa_efficient,sdpa_flash,sdpa_cudnn,sdpa
models=(llama_train gpt2_train bert_infer llama_generate)
budget=400
SECONDS=0
late() { if ((SECONDS > budget)); then echo "### skipped: $1 ($SECONDS s used)"; return 0; fi; return 1; }
from_trace() {  # model impl
  local model=$1 impl=$2 trace="$work/$1_$2.pt.trace.json.gz" causal=()
  [[ -f $trace ]] || return 0
  late "from-trace $model $impl" && return 0
  [[ $model == bert_infer ]] && causal=(--no-causal)  # an encoder: its mask is padding, not causal
  echo "### attntrace run --from-trace ${model}_${impl} --plan"
  python3 -m attntrace run --from-trace "$trace" --plan --variants "$variants" "${causal[@]}"
  echo "### attntrace run --from-trace ${model}_${impl} (${SECONDS} s)"
  timeout 90 python3 -m attntrace run --from-trace "$trace" --variants "$variants" --steps 2 --warmup 3 \
    --device "$device" --out "$work/fromtrace/${model}_${impl}" "${causal[@]}"
  echo "### exit $?"
}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "transformers", transformers.__version__)'
  for model in "${models[@]}"; do
    late "capture $model" && continue
    echo "### capture $model (${SECONDS} s)"
    timeout 100 python3 "$here/bench/from_trace_models.py" capture "$work" "$model" "${extra[@]}"
    echo "### exit $?"
  done
  for model in "${models[@]}"; do from_trace "$model" eager; done
  for model in "${models[@]}"; do from_trace "$model" sdpa; done
  echo "### report (${SECONDS} s)"
  python3 "$here/bench/from_trace_models.py" report "$work"
  cp "$work/results.json" "$work/results.md" "$out/" 2>/dev/null
  date -u
} 2>&1 | tee "$out/from_trace_gpu.log"
for model in "${models[@]}"; do
  files=$(cd "$work" && ls "${model}"_*.pt.trace.json.gz "${model}"_timing.json 2>/dev/null)
  [[ -n $files ]] && tar -C "$work" -czf "$out/traces_$model.tar.gz" $files
done
[[ -d $work/fromtrace ]] && tar -C "$work" -czf "$out/fromtrace_runs.tar.gz" fromtrace
ls -la "$out"
