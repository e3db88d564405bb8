#!/bin/bash
# Device call (one GPU), after the three bench/device/vllm_setup.sh piece calls on the same warm
# machine (docs/development.md, "vLLM on the lent GPU"), with carry [".carry/trainer"] (TRL 1.16
# and the rest of the trainer's wheels, bench/device/prepare_carry.sh):
#   bash bench/device/trl_vllm_gpu.sh
# The speed headline's setting (Qwen2.5-1.5B config, random init, 32 GSM8K prompts x G=8,
# 512 new tokens, trainer_1p5b_gpu.sh's memory settings for ours) in one process, one JSON
# ($OUT/trainer_speed.json under the run header): ours, then TRL 1.16 GRPOTrainer with vLLM
# 0.26.0 in colocate mode (bench/trainer/trl_vllm.py: use_vllm, vllm_mode="colocate",
# BENCH_VLLM_MEM of the card, default 0.3), then plain TRL. Both TRL phases at per-device
# batch TRL_BATCH (default 16, x 16 accumulation, as the headline: config A's whole batch of
# 256 at once does not fit the 1.5B shape's logits); with vLLM, TRL still generates all 256
# completions of a step in one vLLM call. Plain TRL runs last: its memory peak then counts
# what the vLLM engine keeps. PHASES (default ours,trl_vllm,trl), STEPS (timed steps after 2
# warm-up, default 3), LIMIT (s, default 570), EXTRA (more bench.trainer.speed options).
# SMALL=1 (CPU): the TRL baseline's A_vllm phase at the tiny shapes with PY, a python whose
# venv has vLLM's CPU build and TRL (.venv-vllm plus trl==1.16.0); one SKIP line and exit 0
# where PY cannot import both (bench.trainer.speed needs the trainer, which that venv lacks).
set -o pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/trl_vllm_out}
PY=${PY:-python3}
mkdir -p "$OUT"
if [ "${SMALL:-0}" = 1 ]; then
  "$PY" -c "import trl, vllm" 2>/dev/null || { echo "SKIP: $PY cannot import trl and vllm"; exit 0; }
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} VLLM_CPU_CI_ENV=1
  BENCH_SMALL=1 BENCH_PHASES=A_vllm timeout "${LIMIT:-400}" "$PY" -m bench.trainer.trl_baseline \
    > "$OUT/trl_vllm.log" 2>&1
  rc=$?; tail -3 "$OUT/trl_vllm.log"; echo "rc=$rc"; exit $rc
fi
[ -f /tmp/site/.vllm-installed ] || { echo "no vLLM in /tmp/site: run bench/device/vllm_setup.sh piece1..3 first"; exit 1; }
source bench/device/gpu_env.sh  # TRL and the checkout into /tmp/site, beside vLLM
# FlashInfer is not carried (vllm_carry.sh); vLLM's top-k/top-p sampler imports it unguarded
export VLLM_USE_FLASHINFER_SAMPLER=0
BENCH_SHAPE=qwen2.5-1.5b BENCH_PROMPTS=32 BENCH_G=8 BENCH_NEW=512 BENCH_TRL_BS=${TRL_BATCH:-16} \
  timeout "${LIMIT:-570}" "$PY" -m bench.trainer.speed --phases "${PHASES:-ours,trl_vllm,trl}" \
  --steps "${STEPS:-3}" --micro-batch 8 --gradient-checkpointing --keep-layers 2 --keep-logits \
  --free-sampler-cache --trl-batch "${TRL_BATCH:-16}" --sampler-modes "" ${EXTRA:-} \
  --gsm8k .carry/trainer/gsm8k/train.jsonl 2>&1 | grep -v "^{'loss'" > "$OUT/trl_vllm.log"
echo "rc=$?"; tail -25 "$OUT/trl_vllm.log"
