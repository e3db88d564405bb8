#!/bin/bash
# Device call: the bench after the fix (one tokenization, pipelined prepare/forward,
# multi-process load generator); thread vs process encode worker, max_batch_texts 128/256.
WHL=.carry/embedding/whl source "$(dirname "$0")/gpu_env.sh"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
M=$PWD/.carry/embedding/minilm-fp16
G=$PWD/.carry/embedding/gsm8k
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; uptime
  python3 -c "import httptools, uvloop, sentence_transformers, torch; print('httptools', httptools.__version__, 'uvloop', uvloop.__version__, 'st', sentence_transformers.__version__, 'torch', torch.__version__)"; } 2>&1 | tee $OUT/gpu.txt
F='httpx|Loading|Batches|Writing'
timeout 250 python3 -m bench.services.embedding --device cuda --dtype float16 --model $M --gsm8k $G \
  --rounds 4 --per-client 16 --batch-sizes 128,256,512 --encode-worker thread,process \
  --max-batch-texts 128,256 --json $OUT/gpu.json 2>&1 | grep -v -E "$F" | tee $OUT/gpu.log
uptime | tee -a $OUT/gpu.txt
