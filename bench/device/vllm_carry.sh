#!/usr/bin/env bash
# Builds the pieces that carry vLLM 0.26.0 to the lent GPU (run here, in the repository root):
#   bash bench/device/vllm_carry.sh
# 1. a trimmed vLLM wheel: the FlashAttention-2 and MoE kernels, the Rust frontend binary and
#    DeepGEMM's builds for other Pythons left out (bench/device/vllm_trim.py says why each one
#    is never loaded by a dense model on a Hopper card), RECORD rewritten to match;
# 2. the wheels of vLLM's requirements that the GPU image lacks (KINDS.md's package list) and
#    that offline `vllm.LLM` generation imports, one pinned version each (--no-deps);
# 3. one uncompressed tar of all of them, split into pieces under .carry/vllm/pieceN/ (a
#    git-ignored folder), each with the manifest (bench/device/vllm_split.sh).
# Each piece travels in one device call (`carry` [".carry/vllm/pieceN"]); a call carries the
# tracked tree too (about 7 MiB), so a piece is PIECE_MIB (default 54) MiB at most.
# bench/device/vllm_setup.sh joins and installs them there. The chain, on one machine (kind
# nvidia-h100-x1 or nvidia-h200), each call sent as soon as the one before returns:
#   1. carry [".carry/vllm/piece1"], command "bash bench/device/vllm_setup.sh piece1"
#   2. carry [".carry/vllm/piece2"], command "bash bench/device/vllm_setup.sh piece2"
#   3. carry [".carry/vllm/piece3"], command
#      "bash bench/device/vllm_setup.sh piece3 && bash bench/device/vllm_check.sh"
# A call that finds an earlier piece missing: the machine went back in between; start over.
# Then, while /tmp/site is there: carry [".carry/trainer"], "bash bench/device/trl_vllm_gpu.sh";
# carry [".carry/trainer", ".carry/vllmserve"], "bash bench/device/judge_32b.sh" (on nvidia-h200).
# WHEEL: the vLLM wheel (default /tmp/vllmdl/..., downloaded into .carry/vllm/dl if absent).
set -euo pipefail
cd "$(dirname "$0")/../.."
PIECE_MIB=${PIECE_MIB:-54}
NAME=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
WHEEL=${WHEEL:-/tmp/vllmdl/$NAME}
ROOT=.carry/vllm
git check-ignore -q "$ROOT/x" || { echo "$ROOT is not git-ignored: add /.carry/ to .gitignore"; exit 1; }
dl() {  # py3.12 manylinux wheels, no dependencies (each one is named)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$@"
}
if [ ! -f "$WHEEL" ]; then
  WHEEL=$ROOT/dl/$NAME
  [ -f "$WHEEL" ] || dl "$ROOT/dl" vllm==0.26.0
fi
rm -rf "$ROOT/whl"
mkdir -p "$ROOT/whl"
python3 bench/device/vllm_trim.py "$WHEEL" "$ROOT/whl/$NAME"

# vLLM's requirements that the image lacks and that offline generation imports at start-up
# (module-level imports on the path of `from vllm import LLM` and the engine core); versions
# as in the CPU vLLM venv that serves the judge's tests (NOTES.md), but openai: the last 2.x
# (3.x moves to httpx2, which the image lacks). Left out, imported only by
# features a dense bf16 model does not use: flashinfer-python, apache-tvm-ffi, tilelang,
# nvidia-cutlass-dsl, quack-kernels, humming-kernels, tokenspeed-mla, nvidia-cudnn-frontend,
# fastsafetensors, torchcodec, PyNvVideoCodec (kernels, video), outlines_core, anthropic, mcp,
# model-hosting-container-standards, opentelemetry-* (the server, tracing). llguidance and
# xgrammar stay although no request here asks for structured output: vllm.v1.structured_output
# names their classes in dataclass annotations, which load them when vllm.v1.request is
# imported; xgrammar 0.2.8 needs apache-tvm-ffi >= 0.1.11 (vLLM pins 0.1.10 for flashinfer).
# Checked here with the CPU vLLM venv: `vllm.entrypoints.llm`, `vllm.v1.engine.core`, the GPU
# model runner and worker, Qwen2, the FlashAttention backend and the dummy loader import from
# these wheels plus the image's packages alone (the other names above blocked).
DEPS=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
      typing-extensions==4.16.0 msgspec==0.22.0 pyzmq==27.3.0 blake3==1.0.11 cachetools==8.0.2
      openai==2.54.0 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 fastapi==0.136.3
      starlette==1.10.0 uvicorn==0.54.0 openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7
      pybase64==1.5.1 cbor2==6.3.0 ijson==3.6.0 watchfiles==1.3.0 setproctitle==1.3.8
      python-json-logger==4.2.0 mistral-common==1.13.1 pydantic-extra-types==2.11.1
      pycountry==26.2.16 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
      referencing==0.37.0 rpds-py==2026.9.1 compressed-tensors==0.17.0 loguru==0.7.3
      depyf==0.20.0 astor==0.8.1 dill==0.4.1 prometheus-fastapi-instrumentator==8.1.0
      lark==1.2.2 lm-format-enforcer==0.11.3 interegular==0.3.3 nvtx==0.2.16
      llguidance==1.7.6 xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2)
dl "$ROOT/whl" "${DEPS[@]}"

# vLLM's OpenAI server (bench/device/judge_32b.sh) imports these beyond offline generation
# (the SageMaker router and form-data routes at import); they travel apart, in .carry/vllmserve
rm -rf .carry/vllmserve && mkdir -p .carry/vllmserve
dl .carry/vllmserve model-hosting-container-standards==0.1.16 jmespath==1.1.0 supervisor==4.3.0 \
  python-multipart==0.0.34
echo "wheels: $(ls "$ROOT/whl" | wc -l), $(du -sh "$ROOT/whl" | cut -f1)"
PIECE=${PIECE_MIB}M bash bench/device/vllm_split.sh "$ROOT/whl" "$ROOT"
N=$(ls -d "$ROOT"/piece* | wc -l)
# a call carries the tree that travels (tracked and untracked-not-ignored files) plus a piece
TREE=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null \
  | tail -1 | cut -f1)
BIG=$(du -b "$ROOT"/piece*/vllm.tar.part* | sort -n | tail -1 | cut -f1)
echo "tree $((TREE / 1048576)) MiB + largest piece $((BIG / 1048576)) MiB per call (limit 64 MiB)"
[ $((TREE + BIG)) -le $((64 * 1048576)) ] || { echo "over 64 MiB: lower PIECE_MIB"; exit 1; }
echo "$N pieces: $N calls to install, then one for bench/device/vllm_check.sh"
