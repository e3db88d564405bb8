#!/bin/bash
# Device call: the honest GRPO learning run (all-correct SFT warm start, 200 steps; GRPO at
# lr 5e-5, G=16, 1,500 steps through real verify + gateway). Carry [".carry/trainer"].
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .carry/trainer/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 520 python3 -m bench.trainer_learn --sft-steps 200 --sft-check-every 100 --steps 1500 \
  --timeout 440 --compare-steps 0 --tag lr5e-5_g16_sft200_1500 \
  lr=5e-5 group_size=16 eval_every=100 2>&1 | grep -v "it/s\]" | tail -3
