#!/bin/bash
# Device call: the honest GRPO learning run, alone on the GPU (all-correct SFT warm start,
# 200 steps; GRPO through real verify + gateway at lr 5e-5, G=16, 512 rollouts per step,
# k3 KL beta 0.05 to the warm start; chosen by the sweeps in bench/results/experiments/sweeps/), then
# bench.trainer.arith_probe on the warm start and the final policy. Carry [".carry/trainer"].
source "$(dirname "$0")/gpu_env.sh"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name --format=csv,noheader
W=/tmp/trainer_learn
timeout 545 python3 -m bench.trainer.learn --work $W --sft-steps 200 --sft-check-every 100 \
  --steps 1500 --timeout 470 --compare-steps 0 --tag kl05_r512 \
  lr=5e-5 group_size=16 rollouts_per_step=512 beta=0.05 eval_every=100 2>&1 \
  | grep -v "it/s\]" | tail -3 | cut -c1-1500
for m in $W/sft $(ls -d $W/run/checkpoints/step-* 2>/dev/null | tail -1); do
  echo "probe $m $(timeout 30 python3 -m bench.trainer.arith_probe $m $W/arith 2>/dev/null)"
done | tee $OUT/probe_kl05_r512.txt
