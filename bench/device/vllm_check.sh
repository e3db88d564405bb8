#!/usr/bin/env bash
# Device call (one GPU), after the bench/device/vllm_setup.sh calls on the same warm machine:
#   bash bench/device/vllm_check.sh
# vLLM 0.26.0 from /tmp/site generates 256 prompts x 512 new tokens with a Qwen2.5-1.5B config
# and random weights (bench/device/vllm_check.py says what it measures and its settings);
# writes $OUT/vllm_check.json and a log. SMALL=1 (the CPU here): a tiny config where vLLM
# imports, else one SKIP line and exit 0.
set -o pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/vllm_check_out} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
PY=${PY:-python3}
mkdir -p "$OUT"
if [ "${SMALL:-0}" = 1 ]; then
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  exec "$PY" bench/device/vllm_check.py
fi
[ -f /tmp/site/.vllm-installed ] || echo "no vLLM in /tmp/site: run bench/device/vllm_setup.sh pieceN first"
export PYTHONPATH=/tmp/site:$PWD
# FlashInfer is not carried (vllm_carry.sh); its top-k/top-p sampler imports it unguarded
export VLLM_USE_FLASHINFER_SAMPLER=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout "${LIMIT:-540}" "$PY" bench/device/vllm_check.py 2>&1 | tee "$OUT/vllm_check.log" | tail -60
echo "rc=$?"
