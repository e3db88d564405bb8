#!/bin/bash
# Device call (nvidia-h100-x2 / nvidia-h200-x2): the honest learning setting under torchrun,
# one process per GPU over NCCL, 256 rollouts per rank (= the single-GPU run's 512 per step),
# short: it shows data parallelism working on GPUs and its speed, not the full learning curve.
# Carry [".carry/trainer"].
source "$(dirname "$0")/gpu_env.sh"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout ${LIMIT:-200} python3 -m bench.trainer.learn --nproc 2 --steps ${STEPS:-300} --timeout ${T:-130} \
  --compare-steps 0 --tag ddp2 rollouts_per_step=256 2>&1 | grep -v "it/s\]" | tail -2 | cut -c1-2500
grep -E "rank|NCCL|world" $OUT/trainer-learn_ddp2.log | head -5
