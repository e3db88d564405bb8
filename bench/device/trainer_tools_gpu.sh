#!/bin/bash
# One device call (one H100/H200): tool use and the diversity reward, side by side on one GPU.
#   tool / notool: the tool-use warm start (trainer.tooluse: the calculator in 20 % of the
#     demonstrations), then GRPO with env=calculator / env=calculator-off (same prompts, same
#     problems, nothing answers a <calc>), the learning benchmark's GRPO settings otherwise;
#   gsm8k / diverse / diverse-W: the learning benchmark's warm start, then GRPO with beta=0
#     (where GRPO collapses) and recipe gsm8k / gsm8k-diverse (diversity 0.3) / diversity W,
#     the embedding service on the GPU, pass@1..16 and the pairwise distance every 100 steps.
# Each run has its own verify + gateway (+ embedding); every run starts from the same warm
# start of its task. Everything lands in $OUT/tools.tgz (with each run's JSON summary beside).
#   carry [".carry/trainer", ".carry/embedding/minilm-fp16"]
# SMALL=1 (PY=.venv/bin/python) runs the same on a CPU at the smallest sizes, a few steps.
# RUNS: which runs (default all); T: seconds of GRPO each; W_DIV: the second diversity weight;
# DIV_EXTRA: trainer settings added to the three diversity runs (e.g. scale_rewards=false);
# tool-fast: the tool run at lr 1e-4; tool-ors (not in the default RUNS): the tool run with
# its episodes through the environments service behind the gateway (env=ors:calculator), which
# needs a redis-server on the machine: carry [".carry/trainer", ".carry/redis"] (prepare_carry.sh).
# EVERY: steps between held-out evaluations (default 100); ORS_PROCESSES: the gateway's and the
# environments service's event-loop processes in tool-ors (default 4; SMALL=1: 1).
# ENV_READY=1: the caller has already sourced gpu_env.sh (another script runs beside this one)
[ "${ENV_READY:-0}" = 1 ] || source "$(dirname "$0")/gpu_env.sh"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OUT=${OUT:-/tmp/tools_out}
PY=${PY:-python3}
W=${WORK:-/tmp/tools_work}; O=$W/out
RUNS=${RUNS:-tool notool gsm8k diverse diverse-w}
if [ "${SMALL:-0}" = 1 ]; then
  T=${T:-150}; STEPS=2; EVERY=2; EMB=default; TOOL_SFT=20; VW=1; NP=${ORS_PROCESSES:-1}
else
  T=${T:-420}; STEPS=4000; EVERY=${EVERY:-100}; EMB=$PWD/.carry/embedding/minilm-fp16; TOOL_SFT=600; VW=3
  NP=${ORS_PROCESSES:-4}
fi
WEIGHT=${W_DIV:-1.0}
mkdir -p "$OUT" "$O"
L="$PY -m bench.trainer.learn --out $O --compare-steps 0 --verify-workers $VW"
# the two warm starts, side by side; each only where one of RUNS starts from it
case " $RUNS " in *" tool"*|*" notool "*)
  $L --task tool --sft-only --sft-steps $TOOL_SFT --work $W/ws-tool --tag ws-tool > $O/ws-tool.log 2>&1 & ;;
esac
case " $RUNS " in *" gsm8k "*|*" diverse"*)
  $L --sft-only --work $W/ws-arith --tag ws-arith > $O/ws-arith.log 2>&1 & ;;
esac
wait
G="--steps $STEPS --timeout $T eval_every=$EVERY"
TOOL="$L --task tool --warm-start $W/ws-tool $G"
DIV="$L --warm-start $W/ws-arith --embedding $EMB $G beta=0 ${DIV_EXTRA:-}"
recipe_w='{"components":[{"name":"math_accuracy","weight":1.0},{"name":"format","weight":0.5},{"name":"diversity","weight":'$WEIGHT'}]}'
for r in $RUNS; do
  case $r in
    tool) $TOOL --work $W/tool --tag tool env=calculator ;;
    notool) $TOOL --work $W/notool --tag notool env=calculator-off ;;
    tool-fast) $TOOL --work $W/tool-fast --tag tool-fast env=calculator lr=1e-4 ;;
    tool-ors) GATEWAY_PROCESSES=$NP ENVS_PROCESSES=$NP \
                $TOOL --ors --work $W/tool-ors --tag tool-ors env=ors:calculator ;;
    gsm8k) $DIV --work $W/gsm8k --tag gsm8k recipe=gsm8k ;;
    diverse) $DIV --work $W/diverse --tag diverse recipe=gsm8k-diverse ;;
    diverse-w) $DIV --work $W/diverse-w --tag diverse-w "recipe=$recipe_w" ;;
  esac > $O/$r.log 2>&1 &
done
wait
cp $O/trainer_learn_*.json "$OUT"/ 2>/dev/null
tar czf "$OUT"/tools.tgz -C $O .
for r in $RUNS; do
  echo "$r: $(grep -h '"accuracy_before"\|"accuracy_after"' $O/trainer_learn_$r.json | tr -d '\n ')" \
    "$(tail -1 $O/$r.log | cut -c1-200)"
done
