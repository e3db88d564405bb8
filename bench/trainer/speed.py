"""Trainer speed on one GPU: our sampler + GRPO step against TRL's GRPOTrainer and plain generate.

Same setting as the TRL baseline (``bench/trainer/trl_baseline.py``, whose model/tokenizer
builders and TRL phase are reused so both sides see the same thing): a random-init Qwen2 of
its shape (default 0.48 B: hidden 1024, 24 layers, 16 heads, 2 KV heads, vocab
32,000; ``BENCH_SHAPE=qwen2.5-1.5b`` or ``qwen2.5-7b`` for the real configs), bf16, SDPA;
``BENCH_PROMPTS`` prompts x ``BENCH_G`` completions, ``BENCH_NEW`` new tokens,
temperature 1, top_p 1, length reward, beta 0, token-mean loss, AdamW lr 1e-6, grad-norm
clip 1.0, one optimizer step per batch (mu = 1: old log-probs = detached current).

Phases (``--phases``, default all): ``check`` (graph vs eager greedy ids; NLL of our samples
vs HF generate's), ``hf`` (plain ``model.generate``), ``ours`` (the samplers alone, then full
GRPO steps through the trainer's ``train_on_batch``), ``trl``; ``ours_fast`` (the GRPO steps
again, KV cache kept between rollouts, micro-batches of 16); ``trl_vllm`` (TRL with vLLM in
colocate mode, ``trl_vllm.py``; needs vLLM; last, as its engine stays). The headline setting,
Qwen2.5-1.5B's config with 32 GSM8K prompts x 8 completions of 512 tokens:

    BENCH_SHAPE=qwen2.5-1.5b BENCH_PROMPTS=32 BENCH_G=8 BENCH_NEW=512 BENCH_TRL_BS=16 \
      python -m bench.trainer.speed --phases ours,trl --steps 4 --micro-batch 8 \
      --gradient-checkpointing --keep-layers 2 --keep-logits --free-sampler-cache \
      --trl-batch 16 --gsm8k ../shared/data/gsm8k/train.jsonl

Writes ``$OUT/trainer_speed.json`` (rewritten after each phase) and prints a table last.
``BENCH_SMALL=1`` shrinks everything for a CPU smoke test (as in the TRL baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from arbiter.trainer.sampling import SamplingParams
from bench import record
from bench.trainer.phases import (
    card_limits,
    gpu_span,
    length_reward,
    load_baseline,
    phase_check,
    phase_hf,
    print_table,
    prompts,
    run_tokens,
    sync,
    time_sampler,
    use_gsm8k,
)

WARMUP = 2
# phase ours_fast: the GRPO steps again, KV cache kept between rollouts, micro-batches of 16
FAST = {"free_sampler_cache": False, "micro_batch": 16, "sampler_modes": ""}


def phase_ours(
    a: ModuleType, tok: Any, dev: str, steps: int, opts: argparse.Namespace
) -> dict[str, Any]:
    """Sampler timings, then full GRPO steps through the trainer's own update
    (``trainer.update.train_on_batch``: micro-batches, chunked log-probs, optional gradient
    checkpointing) with the sampler the trainer uses (compiled + graphed on a GPU)."""
    from arbiter.trainer.generation import Sampler

    res: dict[str, Any] = {"options": vars(opts)}
    model = a.load_model()
    p_ids, p_mask = prompts(a, tok, dev)
    res["prompt_tokens_padded"] = int(p_ids.shape[1])
    n = a.MAX_NEW
    modes = opts.sampler_modes.split(",") if opts.sampler_modes else []
    kinds: dict[str, dict[str, Any]] = {
        "eager": dict(use_cuda_graphs=False, compile=False),
        "graphs": dict(compile=False),
        "compiled": dict(compile=True),
        # the compiled sampler attending to the whole cache in every step (no length buckets)
        "compiled_whole_cache": dict(compile=True, length_round=0),
    }
    for mode in modes:  # the sampler alone
        try:
            t = time.perf_counter()
            timed = time_sampler(Sampler(model, **kinds[mode]), p_ids, p_mask, n, tok, 3, dev)
            timed["first_call_s"] = round(time.perf_counter() - t - 2 * timed["s"], 1)
            res[f"sampler_{mode}"] = timed
        except Exception as e:  # keep the rest of the phase
            res[f"sampler_{mode}"] = {"error": repr(e)[:1000]}
        print(mode, res[f"sampler_{mode}"], flush=True)
        if dev == "cuda":
            torch.cuda.empty_cache()
    res |= _grpo_steps(a, tok, dev, steps, opts, model, p_ids, p_mask)
    del model
    return res


def _grpo_steps(
    a: ModuleType,
    tok: Any,
    dev: str,
    steps: int,
    opts: argparse.Namespace,
    model: Any,
    p_ids: torch.Tensor,
    p_mask: torch.Tensor,
) -> dict[str, Any]:
    from arbiter.trainer.config import TrainerConfig
    from arbiter.trainer.generation import Sampler
    from arbiter.trainer.grpo import allocate_state, build_optimizer, group_advantages
    from arbiter.trainer.rollout import Rollout
    from arbiter.trainer.setup import Dist, enable_gradient_checkpointing
    from arbiter.trainer.update import train_on_batch

    # the TRL baseline's loss: beta 0, token mean, mu 1, AdamW lr 1e-6, grad clip 1.0; bf16 weights
    # as the baseline loads them for TRL too (precision "bf16": no fp32 master copy)
    cfg = TrainerConfig(
        model=a.MDIR,
        rollouts_per_step=a.NSEQ,
        group_size=a.G,
        lr=1e-6,
        beta=0.0,
        micro_batch_size=opts.micro_batch or a.NSEQ,
        logprob_chunk_tokens=opts.logprob_chunk,
        gradient_checkpointing=opts.gradient_checkpointing,
        gradient_checkpointing_keep_layers=opts.keep_layers,
        logprob_keep_logits=opts.keep_logits,
        compile_train=opts.compile_train,
        shared_prefix=opts.shared_prefix,
        max_new_tokens=a.MAX_NEW,
    )
    res: dict[str, Any] = {
        "loss_code": "arbiter.trainer.update.train_on_batch",
        "compile_train": opts.compile_train and dev == "cuda",
        "shared_prefix": opts.shared_prefix,
    }
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model, cfg.gradient_checkpointing_keep_layers)
    model.train()
    sampler = Sampler(model, compile=None if opts.compile_sampler else False,
                      keep_cache=not opts.free_sampler_cache,
                      reuse_graphs=opts.reuse_graphs)  # fmt: skip
    kind = "graphs" if sampler.use_graphs else "eager"
    res["steps_sampler"] = f"compiled + {kind}" if sampler.compiled else kind
    opt, _ = build_optimizer(model, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0)
    if opts.reuse_graphs and opts.free_sampler_cache:  # as trainer.run: AdamW's state first
        allocate_state(opt)
    gen = torch.Generator(device=dev).manual_seed(2)
    params = SamplingParams.for_tokenizer(tok, a.MAX_NEW, generator=gen)
    rows = []
    peak_gen = peak_train = 0.0
    for step in range(steps + WARMUP):
        sync()
        t0 = time.perf_counter()
        if dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        spans: dict[str, Any] = {}
        with gpu_span(spans, "generate"):
            ids, mask = sampler(p_ids, p_mask, params)
        sync()
        t1 = time.perf_counter()
        texts = tok.batch_decode(ids.masked_fill(~mask, tok.pad_token_id), skip_special_tokens=True)
        adv = group_advantages(torch.tensor(length_reward(texts)), a.G).to(dev)
        roll = Rollout(
            problems=[],
            prompts=[],
            texts=texts,
            input_ids=torch.cat([p_ids, ids], 1),
            attention_mask=torch.cat([p_mask, mask.long()], 1),
            loss_mask=mask.long(),
        )
        t2 = time.perf_counter()
        if dev == "cuda":
            peak_gen = max(peak_gen, torch.cuda.max_memory_allocated() / 2**30)
            torch.cuda.reset_peak_memory_stats()
        with gpu_span(spans, "train"):
            train_on_batch(cfg, model, opt, roll, adv, Dist(), "bf16")
            opt.zero_grad(set_to_none=True)  # as the trainer's loop does: no gradients held
        sync()
        t3 = time.perf_counter()
        if dev == "cuda":
            peak_train = max(peak_train, torch.cuda.max_memory_allocated() / 2**30)
        rows.append(
            {
                "step": step,
                "s": t3 - t0,
                "generate_s": t1 - t0,
                "reward_s": t2 - t1,
                "train_s": t3 - t2,
                "tokens": int(mask.sum()),
                "decode_steps": int(ids.shape[1]),
                "seq_tokens": int(roll.input_ids.numel()),
                "real_tokens": int(roll.attention_mask.sum()),
                "run_tokens": run_tokens(roll, cfg.micro_batch_size, cfg.shared_prefix),
            }
            | spans
        )
        print("step", rows[-1], flush=True)
    steady, res["sampler_graphs"] = rows[WARMUP:], dict(sampler.graph_stats)
    tot = sum(r["s"] for r in steady)
    res["steps"] = [
        {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in rows
    ]
    res["s_per_step"] = round(tot / len(steady), 4)
    res["s_per_step_median"] = round(sorted(r["s"] for r in steady)[len(steady) // 2], 4)
    for k in ("generate_s", "reward_s", "train_s"):
        res[k + "_per_step"] = round(sum(r[k] for r in steady) / len(steady), 4)
    res["completion_tokens_per_s"] = round(sum(r["tokens"] for r in steady) / tot, 1)
    if dev == "cuda":
        res["peak_GiB_generate"] = round(peak_gen, 2)
        res["peak_GiB_train"] = round(peak_train, 2)
        res["max_allocated_GiB"] = round(max(peak_gen, peak_train), 2)
        res["limits"] = card_limits(
            model,
            steady,
            prompt_len=p_ids.shape[1],
            rows=p_ids.shape[0],
            card=torch.cuda.get_device_name(),
        )
    return res


def phase_trl(a: ModuleType, tok: Any, batch: int, vllm: bool = False) -> dict[str, Any]:
    """TRL's GRPOTrainer; per-device batch ``batch`` (0: the whole batch) with gradient
    accumulation over the rest; with ``vllm``, generating with vLLM in colocate mode."""
    bs = batch or a.NSEQ
    tag = ("A" if bs == a.NSEQ else "B") + ("_vllm" if vllm else "")
    res: dict[str, Any] = a.phase_trl(tok, bs, a.NSEQ // bs, tag)
    res.pop("logs", None)
    steady = sorted(res.get("step_times_s", [])[WARMUP:])
    if steady:
        res["s_per_step_median"] = steady[len(steady) // 2]
    return res


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=16, help="timed steps (after 2 warm-up) per side")
    p.add_argument(
        "--gsm8k",
        type=Path,
        default=None,
        help="GSM8K train.jsonl: both sides prompt with its questions in the trainer's chat "
        "prompt (default: the TRL baseline's arithmetic questions)",
    )
    p.add_argument("--phases", default="check,hf,ours,trl")
    p.add_argument(
        "--micro-batch",
        type=int,
        default=0,
        help="sequences per forward/backward in the GRPO step (0: the whole batch)",
    )
    p.add_argument(
        "--logprob-chunk",
        type=int,
        default=1024,
        help="logprob_chunk_tokens (0: the full [tokens, vocab] logits at once)",
    )
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument(
        "--keep-layers",
        type=int,
        default=0,
        help="with --gradient-checkpointing: decoder layers that keep their activations",
    )
    p.add_argument(
        "--keep-logits",
        action="store_true",
        help="the head keeps each chunk's logits for backward (logprob_keep_logits)",
    )
    p.add_argument(
        "--trl-batch",
        type=int,
        default=0,
        help="TRL per-device train batch (0: the whole batch, no accumulation)",
    )
    p.add_argument(
        "--no-compile-sampler",
        dest="compile_sampler",
        action="store_false",
        help="GRPO steps with the graphed sampler only (default: compiled on GPU)",
    )
    p.add_argument(
        "--no-compile-train",
        dest="compile_train",
        action="store_false",
        help="GRPO steps with the eager training forward (default: compile_train on GPU)",
    )
    p.add_argument(
        "--no-shared-prefix",
        dest="shared_prefix",
        action="store_false",
        help="GRPO steps with every row's prompt in the training forward (default: shared)",
    )
    p.add_argument(
        "--no-reuse-graphs",
        dest="reuse_graphs",
        action="store_false",
        help="with --free-sampler-cache: capture the sampler's graphs anew every rollout "
        "(default, as the trainer: keep them, AdamW's state allocated before the first rollout)",
    )
    p.add_argument(
        "--free-sampler-cache",
        action="store_true",
        help="free the sampler's KV cache before each training step",
    )
    p.add_argument(
        "--sampler-modes",
        default=None,
        help="samplers timed alone: eager,graphs,compiled,compiled_whole_cache (default: the "
        "first three on GPU, eager on CPU; '' for none)",
    )
    args = p.parse_args(argv)
    if args.sampler_modes is None:
        args.sampler_modes = "eager,graphs,compiled" if torch.cuda.is_available() else "eager"
    # the TRL phase runs BENCH_STEPS optimizer steps in all and times the ones after its 2
    # warm-up steps: the same count as ours
    os.environ.setdefault("BENCH_STEPS", str(args.steps + WARMUP))
    a = load_baseline()
    prompt_source = "the TRL baseline's arithmetic questions"
    if args.gsm8k is not None:
        use_gsm8k(a, args.gsm8k)
        prompt_source = f"GSM8K questions ({args.gsm8k.name}) in the trainer's chat prompt"
    dev = a.DEV
    out_dir = Path(a.OUT)
    res: dict[str, Any] = {
        "versions": a.versions(),
        "setting": {
            "prompts": a.N_PROMPTS,
            "G": a.G,
            "max_new_tokens": a.MAX_NEW,
            "vocab": a.VOCAB,
            "steps_timed": args.steps,
            "warmup_steps": WARMUP,
            "prompts_from": prompt_source,
        },
    }

    def dump() -> None:
        record.write_result(out_dir / "trainer_speed.json", res)

    tok = a.build_tokenizer()
    model = a.build_model(tok)
    res["model_params"] = sum(x.numel() for x in model.parameters())
    model.save_pretrained(a.MDIR)
    tok.save_pretrained(a.MDIR)
    del model
    dump()
    for ph in args.phases.split(","):
        t = time.perf_counter()
        try:
            if ph == "check":
                res["check"] = phase_check(a, tok, dev)
            elif ph == "hf":
                res["hf_generate"] = phase_hf(a, tok, dev)
            elif ph == "ours":
                res["ours"] = phase_ours(a, tok, dev, args.steps, args)
            elif ph == "ours_fast":  # speed over memory: cache kept, micro-batches of 16
                fast = argparse.Namespace(**vars(args) | FAST)
                res["ours_fast"] = phase_ours(a, tok, dev, args.steps, fast)
            elif ph == "trl":
                res["trl"] = phase_trl(a, tok, args.trl_batch)
            elif ph == "trl_vllm":
                res["trl_vllm"] = phase_trl(a, tok, args.trl_batch, vllm=True)
        except Exception as e:
            import traceback

            traceback.print_exc()
            res[ph] = {"error": repr(e)[:2000]}
        res.setdefault("phase_wall_s", {})[ph] = round(time.perf_counter() - t, 1)
        if dev == "cuda":
            torch.cuda.empty_cache()
        print(
            ph, json.dumps(res.get(ph, res.get(f"{ph}_generate")), default=str)[:1500], flush=True
        )
        dump()
    print_table(res)
    tv, ours = res.get("trl_vllm", {}), res.get("ours", {}).get("completion_tokens_per_s")
    if tps := tv.get("completion_tokens_per_s"):
        ratio = f"{ours / tps:.2f}x" if ours else "-"
        print(f"| TRL + vLLM colocate step | {tv['s_per_step_steady']} | {tps} | ours: {ratio} |")
        print(f"| TRL + vLLM: its generate share | {tv['generate_s_per_step_steady']} | | |")


if __name__ == "__main__":
    main()
    # Everything is written: leave without the interpreter's teardown, which on an H200 hung
    # past the regression check's limit after the table was printed (TRL's and Inductor's
    # worker threads and processes).
    sys.stdout.flush()
    os._exit(0)
