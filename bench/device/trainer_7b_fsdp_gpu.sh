#!/bin/bash
# Device call (two GPUs): the 7B benchmark, a random-init Qwen2.5-7B config trained by
# `torchrun --nproc_per_node 2 -m arbiter.trainer --config configs/qwen2.5-7b-gsm8k-fsdp.yaml`
# (fsdp=true) on GSM8K with verify + gateway running; 6 steps, no evaluation or checkpoint.
# ONE_GPU=1 then runs the same model on GPU 0 alone (fsdp=false, bf16-mixed: does it fit?).
# Carry [".carry/trainer"].  SMALL=1 runs the same commands on a CPU with tiny shapes.
EXTRA=()
source "$(dirname "$0")/gpu_env.sh"
if [ "${SMALL:-0}" = 1 ]; then
  EXTRA=(device=cpu max_new_tokens=16 rollouts_per_step=8 micro_batch_size=4)
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/trainer_7b_out}
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
PY=${PY:-python3}
W=/tmp/trainer_7b
set -o pipefail
timeout ${LIMIT:-570} $PY -m bench.trainer.fsdp --work $W --nproc 2 --steps ${STEPS:-6} \
  --timeout ${T:-500} --tag 7b "${EXTRA[@]}" 2>&1 | grep -v "it/s\]" > $OUT/trainer_7b.log
echo "rc=$?"; tail -c 1500 $OUT/trainer_7b.log
grep -E "WARN|Error|error|Traceback|OutOfMemory" $OUT/trainer-fsdp_7b.log | head -10
if [ "${ONE_GPU:-0}" = 1 ]; then
  CUDA_VISIBLE_DEVICES=0 timeout ${LIMIT1:-270} $PY -m bench.trainer.fsdp --work ${W}_1 \
    --model $W/model --nproc 1 --steps ${STEPS:-6} --timeout ${T1:-240} --tag 7b_1gpu \
    "${EXTRA[@]}" fsdp=false 2>&1 | grep -v "it/s\]" > $OUT/trainer_7b_1gpu.log
  echo "rc1=$?"; tail -c 1500 $OUT/trainer_7b_1gpu.log
  grep -E "WARN|Error|error|Traceback|OutOfMemory" $OUT/trainer-fsdp_7b_1gpu.log | head -10
fi
