"""vLLM's offline generation speed on the lent GPU: a Qwen2.5 config with random weights.

    python3 bench/device/vllm_check.py      (bench/device/vllm_check.sh sets the path)

``vllm.LLM`` with ``load_format="dummy"`` (random weights from the config alone: the GPU
machine has no model files) builds the model from a Qwen2.5 config written here and the
byte-level BPE tokenizer of ``arbiter.tiny_model`` (2,048 ids, trained offline on arithmetic
and judge text). The model's vocabulary stays the real one (151,936), so the head costs what it
costs in Qwen2.5; the tokens it samples beyond the tokenizer are never detokenized
(``detokenize=False``). One short warm-up generate, then PROMPTS prompts x NEW new tokens
(``ignore_eos``, temperature 1) timed as one ``LLM.generate``; prints the generated tokens/s and
the card's memory in use, and writes ``$OUT/vllm_check.json`` under the ``bench.record`` header.

Environment: BENCH_SHAPE (qwen2.5-1.5b, default, or qwen2.5-0.5b), PROMPTS (256), NEW (512),
GPU_UTIL (vLLM's gpu_memory_utilization, 0.5), ENFORCE_EAGER=1 (no CUDA graphs), OUT.
SMALL=1: a tiny config, 4 prompts x 16 tokens, eager; where vLLM cannot be imported (the CPU
here) it prints a SKIP line and exits 0.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SMALL = os.environ.get("SMALL") == "1"
SHAPES: dict[str, dict[str, Any]] = {  # the Qwen2.5 model cards' configs
    "qwen2.5-0.5b": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, tie_word_embeddings=True, vocab_size=151936,
    ),
    "qwen2.5-1.5b": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, tie_word_embeddings=True, vocab_size=151936,
    ),
    "tiny": dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=True, vocab_size=2048,
    ),
}  # fmt: skip


def build_model_dir(out: Path, shape: dict[str, Any]) -> Any:
    """The tokenizer (arbiter.tiny_model's) and a Qwen2 config.json in ``out``; returns the
    tokenizer."""
    from transformers import AutoTokenizer, Qwen2Config

    from arbiter import tiny_model

    data = Path(".carry/trainer/gsm8k")
    tiny_model.build_tokenizer(out, tiny_model._corpus(data if data.exists() else None))
    tok = AutoTokenizer.from_pretrained(out)
    shape = shape | {"vocab_size": max(shape["vocab_size"], len(tok))}
    Qwen2Config(
        **shape, max_position_embeddings=32768, bos_token_id=None,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, dtype="bfloat16",
    ).save_pretrained(out)  # fmt: skip
    return tok


def prompts(tok: Any, n: int) -> list[list[int]]:
    """``n`` arithmetic questions in the chat template, as token ids (20 to 60 tokens)."""
    rng = random.Random(0)
    out: list[list[int]] = []
    for _ in range(n):
        terms = " + ".join(str(rng.randint(1, 999)) for _ in range(rng.randint(2, 8)))
        msg = [{"role": "user", "content": f"What is {terms}? Think, then answer."}]
        text = tok.apply_chat_template(msg, add_generation_prompt=True, tokenize=False)
        out.append(list(tok.encode(text, add_special_tokens=False)))
    return out


def gpu_memory_used_mib() -> int | None:
    """The card's memory in use (nvidia-smi: every process, vLLM's engine core included)."""
    if shutil.which("nvidia-smi") is None:
        return None
    q = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return int(q.stdout.split()[0]) if q.returncode == 0 and q.stdout.strip() else None


def main() -> None:
    try:
        import vllm
    except ImportError as e:
        if SMALL:
            print(f"SKIP: vLLM is not installed here ({e}); run bench/device/vllm_setup.sh first")
            return
        sys.exit(f"vLLM is not installed ({e}): run bench/device/vllm_setup.sh for each piece")
    from vllm import LLM, SamplingParams

    from bench import record

    shape_name = "tiny" if SMALL else os.environ.get("BENCH_SHAPE", "qwen2.5-1.5b")
    n_prompts = 4 if SMALL else int(os.environ.get("PROMPTS", "256"))
    new = 16 if SMALL else int(os.environ.get("NEW", "512"))
    eager = SMALL or os.environ.get("ENFORCE_EAGER") == "1"
    util = float(os.environ.get("GPU_UTIL", "0.5"))
    out = Path(os.environ.get("OUT") or "/tmp/vllm_check_out")
    mdir = Path("/tmp/vllm_check_model")
    shutil.rmtree(mdir, ignore_errors=True)
    tok = build_model_dir(mdir, SHAPES[shape_name])
    ids = prompts(tok, n_prompts)
    t0 = time.perf_counter()
    llm = LLM(
        model=str(mdir), load_format="dummy", dtype="bfloat16", seed=0,
        max_model_len=max(map(len, ids)) + new + 16, gpu_memory_utilization=util,
        max_num_seqs=max(n_prompts, 8), enforce_eager=eager,
    )  # fmt: skip
    start_s = time.perf_counter() - t0
    params = SamplingParams(temperature=1.0, max_tokens=new, ignore_eos=True, detokenize=False)
    warm = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": p} for p in ids[:8]], warm, use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    body = {
        "small_test": SMALL,
        "vllm": vllm.__version__,
        "shape": shape_name,
        "prompts": n_prompts,
        "new_tokens": new,
        "prompt_tokens": sum(map(len, ids)),
        "enforce_eager": eager,
        "gpu_memory_utilization": util,
        "engine_start_s": round(start_s, 1),
        "generate_s": round(wall, 3),
        "generated_tokens": generated,
        "generated_tokens_per_s": round(generated / wall, 1),
        "gpu_memory_used_mib": gpu_memory_used_mib(),  # vLLM reserves GPU_UTIL of the card
    }
    record.write_result(out / "vllm_check.json", body)
    print(json.dumps(body, indent=1))


if __name__ == "__main__":
    main()
