#!/bin/bash
# Device call (one H200: the 32B config's weights take 58 GiB, the 1.5B trainer beside them),
# after the three bench/device/vllm_setup.sh piece calls on the same warm machine, with carry
# [".carry/trainer", ".carry/vllmserve"] (bench/device/prepare_carry.sh; vllm_carry.sh builds
# .carry/vllmserve, the four wheels vLLM's OpenAI server needs beyond offline generation):
#   bash bench/device/judge_32b.sh
# vLLM's OpenAI server with a Qwen3-32B config and random weights; the judge service against
# direct calls at 64 and 256 requests in flight; GRPO at the 1.5B shape with recipe gsm8k-dj
# through the gateway (bench/device/judge_32b.py says what and how). Writes
# $OUT/judge_32b.json and the processes' logs. SMALL=1 (the CPU here, CI): the tiny model on
# vLLM CPU (.venv-vllm, make vllm), both parts at the smallest sizes.
set -o pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/judge_32b_out}
mkdir -p "$OUT"
if [ "${SMALL:-0}" = 1 ]; then
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  timeout "${LIMIT:-400}" "${PY:-.venv/bin/python}" -m bench.device.judge_32b 2>&1 \
    | tee "$OUT/judge_32b.log" | tail -40
  exit "${PIPESTATUS[0]}"
fi
[ -f /tmp/site/.vllm-installed ] || { echo "no vLLM in /tmp/site: run bench/device/vllm_setup.sh piece1..3 first"; exit 1; }
source bench/device/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  .carry/vllmserve/*.whl 2>&1 | grep -v "already exists" | tail -3
# FlashInfer is not carried (vllm_carry.sh); vLLM's top-k/top-p sampler imports it unguarded
export VLLM_USE_FLASHINFER_SAMPLER=0
ARBITER_GSM8K_DIR=${ARBITER_GSM8K_DIR:-$PWD/.carry/trainer/gsm8k} \
  timeout "${LIMIT:-570}" python3 -m bench.device.judge_32b 2>&1 | grep -v "it/s\]" \
  | tee "$OUT/judge_32b.log" | tail -60
echo "rc=${PIPESTATUS[0]}"
