#!/bin/bash
# Device call (one GPU): the headline speed comparison, Qwen2.5-1.5B config, 32 GSM8K prompts x G=8,
# 512 new tokens: ours (memory settings: micro-batches of 8, chunked log-probs, gradient
# checkpointing but for KEEP_LAYERS (default 2) layers, the head's chunk logits kept for
# backward, KV cache freed before each training step; compile_train on: the training
# forward's decoder layers compiled), TRL 1.16 GRPOTrainer at per-device batch 16 x
# accumulation 16, then ours again with the cache kept and micro-batches of 16.
# PHASES (default ours,trl,ours_fast) and MODES (samplers timed alone, default
# graphs,compiled; also eager, compiled_whole_cache) pick less. Carry [".carry/trainer"].
# SMALL=1 runs the same command on a CPU (no wheels installed). STEPS: timed steps (default
# 4); TAG names the log; the card's clocks, power and throttle reasons are logged every
# 500 ms beside it. EXTRA: more bench.trainer.speed options (e.g. --no-reuse-graphs).
source "$(dirname "$0")/gpu_env.sh"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/trainer_1p5b_out}
PY=${PY:-python3}
set -o pipefail
TAG=${TAG:-trainer_1p5b}
command -v nvidia-smi >/dev/null && { nvidia-smi -lms 500 --format=csv --query-gpu=timestamp,\
clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active > $OUT/$TAG.smi.csv &
SMI=$!; }
BENCH_SHAPE=qwen2.5-1.5b BENCH_PROMPTS=32 BENCH_G=8 BENCH_NEW=512 BENCH_TRL_BS=16 \
  timeout ${LIMIT:-560} $PY -m bench.trainer.speed --phases ${PHASES:-ours,trl,ours_fast} --steps ${STEPS:-4} \
  --micro-batch 8 --gradient-checkpointing --keep-layers ${KEEP_LAYERS:-2} --keep-logits \
  --free-sampler-cache --trl-batch 16 ${EXTRA:-} \
  --gsm8k .carry/trainer/gsm8k/train.jsonl --sampler-modes "${MODES-graphs,compiled}" 2>&1 \
  | grep -v "^{'loss'" > $OUT/$TAG.log
echo "rc=$?"; [ -n "${SMI:-}" ] && kill $SMI; tail -25 $OUT/$TAG.log
