#!/bin/bash
# Device call: a sweep of honest GRPO settings, all runs side by side on one GPU (each with its
# own verify + gateway; contention makes every run slower, so compare runs at equal step counts,
# not by wall time), then bench.trainer.arith_probe on the warm start and on each run's final policy.
# The chosen setting is then timed alone (trainer_learn_gpu.sh). Carry [".carry/trainer"].
#   bash bench/device/trainer_sweep_gpu.sh SWEEP_FILE   (lines: TAG SFT_STEPS key=value...;
#   the three sweeps run: bench/results/experiments/sweeps/settings{1,2,3}.txt)
source "$(dirname "$0")/gpu_env.sh"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/sweep.txt
T=${T:-400}
run() {  # tag sft_steps overrides...
  local tag=$1 sft=$2; shift 2
  timeout $((T + 90)) python3 -m bench.trainer.learn --sft-steps $sft --sft-check-every 100 \
    --steps 4000 --timeout $T --compare-steps 0 --verify-workers 3 --tag $tag \
    --work /tmp/w-$tag --out /tmp/o-$tag group_size=16 eval_every=100 "$@" \
    >/tmp/log-$tag 2>&1
  cp /tmp/o-$tag/trainer_learn_$tag.json $OUT/ 2>/dev/null
}
while read -r line; do [ -n "$line" ] && run $line </dev/null & done < "$1"
wait
for f in /tmp/log-*; do echo "== $f"; grep -v "it/s\]" $f | tail -2 | cut -c1-400; done >> $OUT/sweep.txt
python3 - <<'PY' | tee -a $OUT/sweep.txt
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/trainer_learn_*.json")):
    d = json.load(open(f)); g = d.get("grpo", {})
    print(os.path.basename(f), d.get("sft", {}).get("valid_accuracy"), g.get("steps"), g.get("eval"))
PY
first=1
for w in /tmp/w-*; do
  [ $first = 1 ] && sft=$w/sft || sft=; first=0
  for m in $sft $(ls -d $w/run/checkpoints/step-* 2>/dev/null | tail -1); do
    echo "probe $m $(python3 -m bench.trainer.arith_probe $m $w/arith 2>/dev/null)" | tee -a $OUT/sweep.txt
  done
done
