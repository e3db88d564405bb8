"""The TRL side of the trainer's speed comparison: TRL's ``GRPOTrainer`` (plain transformers
generation, no vLLM) on a random-initialised Qwen2 and an offline byte-level BPE tokenizer.

``bench.trainer.speed`` (and the other trainer benchmarks) import it for the model, the
tokenizer, the prompts and the TRL phase, so both sides run the same shapes in one process;
what no setting changes (device, memory, versions, the prompts) is in ``trl_common``.
Run alone, it measures on one GPU:

1. rollout reference: ``model.generate``, prompts x G sequences x ``BENCH_NEW`` new tokens;
2. train reference: one forward + backward + AdamW step on the same batch;
3. TRL ``GRPOTrainer``, prompts x G completions per optimizer step, config A:
   per-device batch = all completions, no accumulation (with and without gradient
   checkpointing), config B: per-device batch ``BENCH_TRL_BS`` with accumulation;
   ``A_vllm``/``B_vllm``: the same with vLLM in colocate mode (``trl_vllm``; not by default).

    python -m bench.trainer.trl_baseline        # writes $OUT/trl_baseline.json

Environment (read at import): ``BENCH_SMALL=1`` tiny shapes for a CPU smoke test;
``BENCH_SHAPE`` "0.5b" (default: hidden 1024, 24 layers, vocab 32,000), "qwen2.5-1.5b" or
"qwen2.5-7b" (the real configs, vocabulary padded to theirs, random init); ``BENCH_PROMPTS``
(8), ``BENCH_G`` (8), ``BENCH_NEW`` (128 new tokens); ``BENCH_TRL_BS`` (8: config B's
per-device batch); ``BENCH_STEPS`` (8 optimizer steps, the first ``WARMUP`` untimed);
``BENCH_PHASES`` (``ref,A,A_nogc,B``). The result file is rewritten after each phase, so a
run cut short keeps what it measured.
"""

from __future__ import annotations

import itertools
import os
import random
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from bench import record
from bench.trainer import trl_vllm

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HOME", "/tmp/hf_home")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # after the offline settings above

from bench.trainer.trl_common import (
    DEV,
    arith,
    checkpointing_arg,
    checkpointing_on,
    log,
    mem_peak,
    mem_reset,
    prompts_messages,
    sync,
    versions,
)

SMALL = os.environ.get("BENCH_SMALL") == "1"
STEPS = int(os.environ.get("BENCH_STEPS", "3" if SMALL else "8"))
WARMUP = 2
PHASES = os.environ.get("BENCH_PHASES", "ref,A,A_nogc,B").split(",")
OUT = os.environ.get("OUT") or "/tmp/trl_baseline_out"
os.makedirs(OUT, exist_ok=True)
MDIR = "/tmp/trl_baseline_model"  # the model and tokenizer, saved once, loaded by each phase
SHAPES: dict[str, dict[str, Any]] = {  # the real configs (Qwen2.5 model cards), random init
    "0.5b": dict(
        hidden_size=1024, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=2, tie_word_embeddings=False, vocab=32000,
    ),
    "qwen2.5-1.5b": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, tie_word_embeddings=True, vocab=151936,
    ),
    "qwen2.5-7b": dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, tie_word_embeddings=False, vocab=152064,
    ),
}  # fmt: skip
SHAPE_NAME = os.environ.get("BENCH_SHAPE", "0.5b")
SHAPE = dict(SHAPES[SHAPE_NAME])
N_PROMPTS = int(os.environ.get("BENCH_PROMPTS", "8"))
G = int(os.environ.get("BENCH_G", "8"))
MAX_NEW = 16 if SMALL else int(os.environ.get("BENCH_NEW", "128"))
TRL_BS = int(os.environ.get("BENCH_TRL_BS", "8"))
NSEQ = N_PROMPTS * G
VOCAB: int = 2000 if SMALL else SHAPE.pop("vocab")

R: dict[str, Any] = {"small_test": SMALL, "steps": STEPS, "warmup_steps": WARMUP, "phases": {}}


def dump() -> None:
    record.write_result(Path(OUT) / "trl_baseline.json", R)


def build_tokenizer() -> Any:
    """A byte-level BPE trained on arithmetic text, padded to exactly ``VOCAB`` ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    corpus = []
    for _ in range(4000 if SMALL else 40000):
        q, a = arith(rng)
        words = " ".join(
            "".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(12)
        )
        corpus.append(f"{q} The answer is {a}. {words}")
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    tk.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token=None, eos_token="<|im_end|>", pad_token="<|pad|>",
        unk_token=None,
    )  # fmt: skip
    # pad the vocabulary up to exactly VOCAB so every id the model can sample decodes
    missing = VOCAB - len(tok)
    if missing > 0:
        tok.add_tokens([f"<|extra_{i}|>" for i in range(missing)], special_tokens=True)
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok.padding_side = "left"
    return tok


def build_model(tok: Any) -> Any:
    """A random-initialised bf16 Qwen2 of ``SHAPE`` (tiny with ``BENCH_SMALL``)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if SMALL:  # head_dim 32: the smallest that vLLM's CPU attention takes (the _vllm phases)
        shape: dict[str, Any] = dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1,
        )  # fmt: skip
    else:
        shape = dict(SHAPE)
    shape.setdefault("tie_word_embeddings", False)
    settings: dict[str, Any] = dict(
        vocab_size=len(tok), max_position_embeddings=4096, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, bos_token_id=None, rope_theta=1000000.0, **shape,
    )  # fmt: skip
    cfg = Qwen2Config(**settings)
    torch.manual_seed(0)
    with torch.device(DEV):  # random init on the GPU: seconds instead of ~10 s on CPU
        model: Any = Qwen2ForCausalLM(cfg)
        model = model.to(torch.bfloat16)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def load_model() -> Any:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(MDIR, dtype=torch.bfloat16)
    return model.to(DEV)


def phase_ref(tok: Any) -> dict[str, Any]:
    """Plain ``generate`` and one training step on the same batch: the floor under TRL's step."""
    from transformers import GenerationConfig

    res: dict[str, Any] = {}
    mem_reset()
    model = load_model()
    model.eval()
    rows = prompts_messages(N_PROMPTS)
    texts = [
        tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
        for r in rows
    ]
    texts = [t for t in texts for _ in range(G)]
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left",
              add_special_tokens=False).to(DEV)  # fmt: skip
    prompt_len = enc["input_ids"].shape[1]
    res["prompt_len_padded"] = prompt_len
    gen_cfg = GenerationConfig(
        max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, do_sample=True, temperature=1.0,
        top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        disable_compile=True,
    )  # fmt: skip
    times = []
    with torch.no_grad():
        for _ in range(3):
            sync()
            t = time.perf_counter()
            out = model.generate(**enc, generation_config=gen_cfg)
            sync()
            times.append(time.perf_counter() - t)
    new = out.shape[1] - prompt_len
    res["generate"] = {
        "seqs": NSEQ, "new_tokens_each": new, "times_s": [round(x, 3) for x in times],
        "time_s_steady": round(min(times[1:]), 3),
        "tokens_per_s": round(NSEQ * new / min(times[1:]), 1),
    }  # fmt: skip
    log("generate", res["generate"])
    res["mem_after_generate"] = mem_peak()

    # train reference: forward + backward + AdamW on NSEQ x (prompt + MAX_NEW) tokens
    model.train()
    model.config.use_cache = False
    fused = DEV == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=fused)
    seq_len = prompt_len + MAX_NEW
    ids = torch.randint(0, len(tok), (NSEQ, seq_len), device=DEV)
    for key, ckpt in [("train_step", False), ("train_step_grad_ckpt", True)]:
        if ckpt:
            checkpointing_on(model)
        if DEV == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(5):
            sync()
            t = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            times.append(time.perf_counter() - t)
        steady = sum(times[2:]) / len(times[2:])
        res[key] = {
            "batch": NSEQ, "seq_len": seq_len, "tokens": NSEQ * seq_len,
            "optimizer": f"torch AdamW fused={fused}", "grad_ckpt": ckpt,
            "times_s": [round(x, 3) for x in times], "time_s_steady": round(steady, 3),
            "tokens_per_s": round(NSEQ * seq_len / steady, 1), "mem_peak": mem_peak(),
        }  # fmt: skip
        log(key, res[key])
        dump()
    del model, opt, ids, out, loss
    mem_reset()
    return res


def phase_trl(tok: Any, bs: int, ga: int, tag: str, gc_flag: bool | None = None) -> dict[str, Any]:
    """TRL ``GRPOTrainer`` for ``STEPS`` optimizer steps at per-device batch ``bs`` and
    ``ga`` accumulation steps: step time, its generation part, completion tokens/s. A ``tag``
    ending in ``_vllm``: TRL generates with vLLM in colocate mode (``trl_vllm``)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    mem_reset()
    res: dict[str, Any] = {"per_device_train_batch_size": bs, "gradient_accumulation_steps": ga}
    ds = Dataset.from_list(prompts_messages(256))
    reward_tokens: list[int] = []

    def length_reward(
        prompts: Any, completions: list[Any], completion_ids: Any = None, **kw: Any
    ) -> list[float | None]:
        if completion_ids is not None:
            reward_tokens.append(sum(len(c) for c in completion_ids))
        out: list[float | None] = []
        for c in completions:
            text = c[-1]["content"] if isinstance(c, list) else c
            out.append(min(len(text), 400) / 400.0)
        return out

    step_end: list[tuple[Any, float]] = []
    log_rows: list[dict[str, Any]] = []
    gen_times: list[float] = []

    class Timer(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            sync()
            step_end.append(("begin", time.perf_counter()))

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            sync()
            step_end.append((state.global_step, time.perf_counter()))

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs:
                row = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in logs.items()}
                row["_step"] = state.global_step
                log_rows.append(row)

    model = load_model()
    orig_generate = model.generate

    def timed_generate(*a: Any, **k: Any) -> Any:
        sync()
        t = time.perf_counter()
        o = orig_generate(*a, **k)
        sync()
        gen_times.append(time.perf_counter() - t)
        return o

    model.generate = timed_generate
    args = GRPOConfig(
        output_dir=f"/tmp/grpo_{tag}", per_device_train_batch_size=bs,
        gradient_accumulation_steps=ga, num_generations=G, max_completion_length=MAX_NEW,
        max_steps=STEPS, learning_rate=1e-6, bf16=DEV == "cuda", use_cpu=DEV != "cuda",
        report_to="none", logging_steps=1, save_strategy="no", seed=0, temperature=1.0,
        dataloader_num_workers=0, disable_tqdm=True,
        **checkpointing_arg(gc_flag), **trl_vllm.colocate_args(tag),
    )  # fmt: skip
    shown = ["beta", "num_iterations", "loss_type", "scale_rewards", "generation_batch_size",
             "steps_per_generation", "optim", "gradient_checkpointing", "use_vllm", "top_k",
             "top_p", "cache_implementation", "torch_compile", "use_liger_kernel", "epsilon",
             "mask_truncated_completions"]  # fmt: skip
    res["trl_defaults"] = {k: getattr(args, k, None) for k in shown}
    log(tag, "config", res["trl_defaults"])
    # TRL 1.16 itself still calls transformers' old gradient_checkpointing names around
    # generation (trl/models/utils.py); this script uses the new ones where they exist
    warnings.filterwarnings(
        "ignore", r"`(is_)?gradient_checkpointing\w*` is deprecated", FutureWarning
    )
    trainer = GRPOTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=ds,
                          processing_class=tok, callbacks=[Timer()])  # fmt: skip
    trl_vllm.time_vllm(trainer, gen_times, res, sync)  # where vLLM generates
    t0 = time.perf_counter()
    trainer.train()
    res["train_wall_s"] = round(time.perf_counter() - t0, 2)
    ts = [t for _, t in step_end]
    durs = [b - a for a, b in itertools.pairwise(ts)]
    res["step_times_s"] = [round(d, 3) for d in durs]
    steady = durs[WARMUP:]
    sp = sum(steady) / len(steady)
    res["s_per_step_steady"] = round(sp, 3)
    res["generate_times_s"] = [round(x, 3) for x in gen_times]
    gsteady = (gen_times[WARMUP:] if len(gen_times) == len(durs)
               else gen_times[len(gen_times) - len(steady):])  # fmt: skip
    res["generate_s_per_step_steady"] = round(sum(gsteady) / len(gsteady), 3)
    res["non_generate_s_per_step_steady"] = round(sp - res["generate_s_per_step_steady"], 3)
    res["completion_tokens_per_step"] = reward_tokens
    tok_steady = (reward_tokens[WARMUP:] if len(reward_tokens) == len(durs)
                  else reward_tokens[-len(steady):])  # fmt: skip
    res["completion_tokens_per_s"] = round(sum(tok_steady) / sum(steady), 1)
    res["completions_per_s"] = round(NSEQ / sp, 2)
    res["mem_peak"] = mem_peak()
    res["logs"] = log_rows
    log(tag, {k: v for k, v in res.items() if k != "logs"})
    del trainer, model
    mem_reset()
    return res


def main() -> None:
    t_all = time.perf_counter()
    R["versions"] = versions()
    log("versions", R["versions"])
    dump()
    tok = build_tokenizer()
    model = build_model(tok)
    nparams = sum(p.numel() for p in model.parameters())
    config_keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "num_key_value_heads", "tie_word_embeddings"]  # fmt: skip
    R["model"] = {
        "class": "Qwen2ForCausalLM (random init)", "shape": SHAPE_NAME, "params": nparams,
        "dtype": "bfloat16", "prompts": N_PROMPTS, "G": G, "max_new": MAX_NEW,
        "config": {k: getattr(model.config, k) for k in config_keys},
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "tokenizer_len": len(tok),
    }  # fmt: skip
    model.save_pretrained(MDIR)
    tok.save_pretrained(MDIR)
    del model
    log("model", R["model"])
    dump()
    for ph in PHASES:
        t = time.perf_counter()
        try:
            if ph == "ref":
                R["phases"]["ref"] = phase_ref(tok)
            elif ph == "A_nogc":
                R["phases"]["trl_A_bs64_ga1_no_grad_ckpt"] = phase_trl(
                    tok, NSEQ, 1, "A_nogc", gc_flag=False
                )
            elif ph in ("A", "B", "A_vllm", "B_vllm"):  # _vllm: TRL with vLLM (trl_vllm)
                bs = NSEQ if ph.startswith("A") else TRL_BS
                R["phases"][f"trl_{ph}_bs{bs}_ga{NSEQ // bs}"] = phase_trl(tok, bs, NSEQ // bs, ph)
        except Exception as e:  # a phase that fails is recorded; the others still run
            traceback.print_exc()
            R["phases"][ph] = {"error": repr(e)[:2000]}
        R["phases"].setdefault("_wall_s", {})[ph] = round(time.perf_counter() - t, 1)
        dump()
    R["total_wall_s"] = round(time.perf_counter() - t_all, 1)
    dump()
    log("done", R["total_wall_s"])


if __name__ == "__main__":
    main()
