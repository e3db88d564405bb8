#!/bin/bash
# Device call (one GPU): the sampler alone at the headline scale (Qwen2.5-1.5B config, 32 GSM8K
# prompts x G=8, 512 new tokens), before and after its exact shortcuts, with the checks
# (bench/trainer/sampler_probe.py). Carry [".carry/trainer"]. SMALL=1: the same on a CPU.
source "$(dirname "$0")/gpu_env.sh"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/trainer_sampler_probe_out}
mkdir -p "$OUT"
PY=${PY:-python3}
set -o pipefail
BENCH_SHAPE=qwen2.5-1.5b BENCH_PROMPTS=32 BENCH_G=8 BENCH_NEW=512 \
  timeout ${LIMIT:-540} $PY -m bench.trainer.sampler_probe \
  --gsm8k .carry/trainer/gsm8k/train.jsonl ${VARIANTS:+--variants $VARIANTS} 2>&1 \
  | tee $OUT/trainer_sampler_probe.log | grep -v "^  \|Warning\|warn("
echo "rc=$?"
