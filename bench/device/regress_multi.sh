#!/bin/bash
# One device call on a 2-GPU kind (nvidia-h100-x2 / nvidia-h200-x2, at most 10 minutes):
# re-checks the two-GPU headlines with default settings -- the 7B benchmark under FSDP2
# (bench/device/trainer_7b_fsdp_gpu.sh: first step, steady s/step, tokens/s, peak memory per
# GPU) and a short DDP learning run (bench/device/trainer_ddp_gpu.sh; held-out accuracy must
# rise) -- and prints one table against the figures recorded for the card
# (bench/results/regress_multi_<card>.json). Exit 1 on a crash, a goal missed or a
# regression past its allowance (bench/device/regress_multi.py, CHECKS and GOALS).
#   bash bench/device/prepare_carry.sh      # once, here: wheels, GSM8K
#   device call: kind nvidia-h100-x2, carry [".carry/trainer"],
#                command "bash bench/device/regress_multi.sh"
# Prefix ARBITER_COMMIT=<hash> to the command: the copy of the tree there has no git, and
# the results' run header (bench/record.py) names the commit from it.
# SMALL=1 runs the same parts on a CPU, two gloo processes each, at tiny sizes
# (CI: PY=.venv/bin/python). Extra arguments go to bench.device.regress_multi
# (e.g. --parts fsdp7b; --record FILE).
source "$(dirname "$0")/gpu_env.sh"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OUT=${OUT:-/tmp/regress_out}
# NVLink multicast stays off on the lent machines (NCCL, PyTorch's symmetric memory)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
mkdir -p "$OUT"
PY=${PY:-python3}
ARGS=()
[ "${SMALL:-0}" = 1 ] && ARGS+=(--small)
timeout $(( ${LIMIT:-585} + 10 )) $PY -m bench.device.regress_multi --budget ${LIMIT:-585} "${ARGS[@]}" "$@"
rc=$?
[ $rc = 124 ] && echo "regress_multi: stopped at $(( ${LIMIT:-585} + 10 )) s (a part hung)"
exit $rc
