#!/bin/bash
# One device call (one H100/H200, at most 10 minutes; about 5 on a 2-GPU kind, which runs the
# speed part on the second GPU): re-checks every GPU headline with the trainer's default
# settings -- the learning benchmark (300 GRPO steps; held-out accuracy must rise), tool use
# learned with the calculator environment and the diversity reward beside it, the
# Qwen2.5-1.5B speed benchmark against TRL 1.16 (shortened), the embedding service on the GPU
# -- and prints one table against the figures recorded for the card
# (bench/results/regress_<card>.json). Exit 1 on a crash or a regression
# larger than the measured run-to-run spread (bench/device/regress.py, CHECKS, says each allowance).
#   bash bench/device/prepare_carry.sh      # once, here: wheels, GSM8K, MiniLM
#   device call: carry [".carry/trainer", ".carry/embedding/minilm-fp16"],
#                command "bash bench/device/regress.sh"
# Prefix ARBITER_COMMIT=<hash> to the command: the copy of the tree there has no git, and
# the results' run header (bench/record.py) names the commit from it.
# SMALL=1 runs the same parts on a CPU at tiny sizes (CI: PY=.venv/bin/python). Extra
# arguments go to bench.device.regress (e.g. --parts learn,tool; --record FILE).
source "$(dirname "$0")/gpu_env.sh"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OUT=${OUT:-/tmp/regress_out}
mkdir -p "$OUT"
PY=${PY:-python3}
ARGS=()
[ "${SMALL:-0}" = 1 ] && ARGS+=(--small)
timeout $(( ${LIMIT:-585} + 10 )) $PY -m bench.device.regress --budget ${LIMIT:-585} "${ARGS[@]}" "$@"
rc=$?
[ $rc = 124 ] && echo "regress: stopped at $(( ${LIMIT:-585} + 10 )) s (a part hung)"
exit $rc
