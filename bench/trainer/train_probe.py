"""The GRPO train step alone, several ways, in one process: what each memory/speed setting
costs in seconds and peak GPU memory at the TRL baseline's shapes (the 1.5B headline setting).

One model and one fused AdamW (states allocated before timing, as in a running trainer; the
optimizer steps too, lr 1e-6), a batch laid out as the trainer lays it out: the
baseline's GSM8K prompts (left-padded), G completions of ``BENCH_NEW`` random tokens each (a
random-init model samples near-uniform tokens and never stops early). Each variant times
``trainer.update.train_on_batch`` over ``--steps`` steps after one warm-up step (the compile,
if any), with the peak allocated memory of its steps (weights, gradients, AdamW states and
activations; the sampler's KV cache is freed before training in the memory setting).

Variants (``--variants``, comma-separated names from ``VARIANTS``): micro-batch size,
gradient checkpointing (``all``, ``none``, or every k-th layer), padding trimmed or not,
compiled (``compile_train``) or eager. ``--profile-decode`` adds a profile of the eager
decode step's kernels.

    BENCH_SHAPE=qwen2.5-1.5b BENCH_PROMPTS=32 BENCH_G=8 BENCH_NEW=512 \\
      python -m bench.trainer.train_probe --gsm8k ../shared/data/gsm8k/train.jsonl

Writes ``$OUT/trainer_train_probe.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from bench import record
from bench.trainer.phases import load_baseline, prompts, sync, use_gsm8k

CUDA = torch.cuda.is_available()
VARIANTS: dict[str, dict[str, Any]] = {  # in the order they run by default
    "base": dict(mbs=8, ckpt="all", trim=False, compile=False),  # the setting measured first
    "trim": dict(mbs=8, ckpt="all", trim=True, compile=False),
    "compile": dict(mbs=8, ckpt="all", trim=True, compile=True),
    "compile_mb16": dict(mbs=16, ckpt="all", trim=True, compile=True),
    "compile_mb4_ckpt2": dict(mbs=4, ckpt=2, trim=True, compile=True),
    "compile_mb8_ckpt2": dict(mbs=8, ckpt=2, trim=True, compile=True),
    "compile_mb2_none": dict(mbs=2, ckpt="none", trim=True, compile=True),
    "compile_mb1_none": dict(mbs=1, ckpt="none", trim=True, compile=True),
    "compile_mb2_ckpt4": dict(mbs=2, ckpt=4, trim=True, compile=True),
    # each group's prompt run once (trainer.prefix); with fewer tokens, room to keep some layers
    "shared": dict(mbs=8, ckpt="all", trim=True, compile=True, shared=True),
    "shared_mb16": dict(mbs=16, ckpt="all", trim=True, compile=True, shared=True),
    "shared_keep4": dict(mbs=8, ckpt="keep4", trim=True, compile=True, shared=True),
    "shared_mb32": dict(mbs=32, ckpt="all", trim=True, compile=True, shared=True),
    # the head's chunk logits kept for backward (logprob_keep_logits); two (keep14) or four
    # (keep7) layers that keep their activations
    "shared_keep_logits": dict(
        mbs=8, ckpt="all", trim=True, compile=True, shared=True, keep_logits=True
    ),
    "shared_keep14": dict(mbs=8, ckpt="keep14", trim=True, compile=True, shared=True),
    "shared_keep7": dict(mbs=8, ckpt="keep7", trim=True, compile=True, shared=True),
    "shared_keep_logits_keep14": dict(
        mbs=8, ckpt="keep14", trim=True, compile=True, shared=True, keep_logits=True
    ),
}


def _reset_peak() -> None:
    if CUDA:
        torch.cuda.reset_peak_memory_stats()


def set_checkpointing(model: Any, ckpt: str | int) -> None:
    """all / none / every k-th decoder layer recomputed in backward (the rest keep theirs) /
    ``keepK``: every K-th layer keeps its activations (the rest recomputed)."""
    from arbiter.trainer.setup import enable_gradient_checkpointing

    enable_gradient_checkpointing(model)
    keep = int(ckpt[4:]) if isinstance(ckpt, str) and ckpt.startswith("keep") else 0
    for i, layer in enumerate(model.model.layers):
        layer.gradient_checkpointing = (
            ckpt == "all" or (isinstance(ckpt, int) and i % ckpt == 0) or (keep and i % keep != 0)
        )


def run_variant(
    a: Any,
    model: Any,
    opt: Any,
    roll: Any,
    adv: torch.Tensor,
    v: dict[str, Any],
    steps: int,
    profile_step: bool = False,
) -> dict[str, Any]:
    from arbiter.trainer.config import TrainerConfig
    from arbiter.trainer.setup import Dist
    from arbiter.trainer.update import train_on_batch

    cfg = TrainerConfig(model=a.MDIR, rollouts_per_step=a.NSEQ, group_size=a.G, lr=1e-6,
                        beta=0.0, micro_batch_size=v["mbs"], compile_train=v["compile"],
                        max_new_tokens=a.MAX_NEW, shared_prefix=v.get("shared", False),
                        logprob_keep_logits=v.get("keep_logits", False))  # fmt: skip
    set_checkpointing(model, v["ckpt"])
    times, stats = [], {}
    _reset_peak()
    for i in range(steps + 1):
        sync()
        t = time.perf_counter()
        stats = train_on_batch(cfg, model, opt, roll, adv, Dist(), "bf16", trim=v["trim"])
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t)
        if i == 0:
            _reset_peak()  # compile-time temporaries are not the step
    steady = times[1:]
    prof: dict[str, Any] = {}
    if profile_step:  # one more step: GPU busy time against wall time, top kernels
        from torch.profiler import ProfilerActivity, profile

        t = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pr:
            train_on_batch(cfg, model, opt, roll, adv, Dist(), "bf16", trim=v["trim"])
            opt.zero_grad(set_to_none=True)
            sync()
        wall = time.perf_counter() - t
        events = pr.key_averages()
        busy = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e6
        prof = {"profiled_wall_s": round(wall, 3), "kernel_s": round(busy, 3)}
        prof["top"] = events.table(sort_by="self_device_time_total", row_limit=22)
        print(prof["top"], flush=True)
    return prof | {
        "setting": v,
        "first_step_s": round(times[0], 2),
        "times_s": [round(x, 3) for x in steady],
        "train_s": round(sum(steady) / len(steady), 3),
        "peak_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2) if CUDA else None,
        "loss": stats.get("loss"),
        "entropy": stats.get("entropy"),
    }


def logprob_agreement(model: Any, roll: Any) -> dict[str, Any]:
    """One micro-batch's log-probs and the head's weight gradient: eager + padded against
    eager + trimmed, compiled + trimmed, and shared prefix (eager and compiled) (bf16: each
    way rounds differently; this bounds how differently)."""
    from arbiter.trainer.logprobs import completion_logprobs, trim_padding

    ids, attn, mask = roll.input_ids[:8], roll.attention_mask[:8], roll.loss_mask[:8]
    n = mask.shape[1]
    out = []
    names: tuple[str, ...] = ("eager_trimmed", "compiled_trimmed", "shared_prefix",
                              "shared_prefix_compiled")  # fmt: skip
    ways = [(False, False, False), (True, False, False), (True, True, False), (True, False, True),
            (True, True, True)]  # fmt: skip
    if not CUDA:  # compiled: GPU only
        ways, names = [w for w in ways if not w[1]], ("eager_trimmed", "shared_prefix")
    for trim, compile, shared in ways:
        model.zero_grad(set_to_none=True)
        x, m, k = trim_padding(ids, attn, mask) if trim else (ids, attn, n)
        lp, _ = completion_logprobs(model, x, m, k, compile=compile, shared_prefix=shared)
        lp.sum().backward()
        out.append((lp.detach().float(), model.lm_head.weight.grad.float().clone()))
    model.zero_grad(set_to_none=True)
    res: dict[str, Any] = {"logp_mean": round(float(out[0][0].mean()), 4)}
    for name, (lp1, g1) in zip(names, out[1:], strict=True):
        lp0, g0 = out[0]
        cos = torch.nn.functional.cosine_similarity(g0.flatten(), g1.flatten(), dim=0)
        res[name] = {
            "logp_max_abs_diff": round(float((lp0 - lp1).abs().max()), 5),
            "logp_mean_abs_diff": round(float((lp0 - lp1).abs().mean()), 6),
            "head_grad_cosine": round(float(cos), 6),
        }
    return res


def profile_decode(a: Any, model: Any, p_ids: torch.Tensor, p_mask: torch.Tensor, tok: Any) -> Any:
    """Kernel time of the eager (uncompiled, ungraphed) decode loop, top kernels."""
    from torch.profiler import ProfilerActivity, profile

    from arbiter.trainer import generation
    from arbiter.trainer.generation import Sampler
    from arbiter.trainer.sampling import SamplingParams

    # the cache capacity of the timed run (prompt + 512 new tokens, 768 slots) for 64 steps
    generation._CAPACITY_ROUND = -(-(p_ids.shape[1] + a.MAX_NEW) // 64) * 64
    sampler = Sampler(model, use_cuda_graphs=False, compile=False, keep_cache=False)
    params = SamplingParams.for_tokenizer(tok, 64, generator=None)
    sampler(p_ids, p_mask, params)  # warm-up
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        sampler(p_ids, p_mask, params)
        sync()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    print(table, flush=True)
    return table


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gsm8k", type=Path, default=None)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=2, help="timed steps per variant")
    p.add_argument("--budget-s", type=float, default=480, help="skip variants after this")
    p.add_argument("--profile-decode", action="store_true")
    p.add_argument("--profile", default="", help="variants to profile one more step of")
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    a = load_baseline()
    if args.gsm8k is not None:
        use_gsm8k(a, args.gsm8k)
    from arbiter.trainer.grpo import build_optimizer, group_advantages
    from arbiter.trainer.rollout import Rollout

    tok = a.build_tokenizer()
    model = a.build_model(tok)
    model.train()
    dev = a.DEV
    p_ids, p_mask = prompts(a, tok, dev)
    S, N = p_ids.shape[0], a.MAX_NEW
    gen = torch.Generator(device=dev).manual_seed(0)
    comp = torch.randint(0, model.config.vocab_size, (S, N), device=dev, generator=gen)
    roll = Rollout(problems=[], prompts=[], texts=[], input_ids=torch.cat([p_ids, comp], 1),
                   attention_mask=torch.cat([p_mask, torch.ones_like(comp)], 1),
                   loss_mask=torch.ones_like(comp))  # fmt: skip
    adv = group_advantages(torch.rand(S, generator=gen, device=dev).cpu(), a.G).to(dev)
    opt, _ = build_optimizer(model, lr=1e-6, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0)
    res: dict[str, Any] = {
        "card": torch.cuda.get_device_name() if CUDA else "cpu",
        "torch": torch.__version__,
        "shape": {
            "rows": S,
            "prompt_padded": int(p_ids.shape[1]),
            "new": N,
            "real_tokens": int(roll.attention_mask.sum()),
            "padded_tokens": int(roll.input_ids.numel()),
        },
        "variants": {},
    }
    out = Path(a.OUT) / "trainer_train_probe.json"
    print(json.dumps(res), flush=True)
    for name in args.variants.split(","):
        if time.perf_counter() - t_start > args.budget_s:
            res["variants"][name] = {"skipped": "time budget"}
            continue
        try:
            prof = name in args.profile.split(",")
            r = run_variant(a, model, opt, roll, adv, VARIANTS[name], args.steps, prof)
        except torch.OutOfMemoryError as e:
            r = {"setting": VARIANTS[name], "error": "OOM " + str(e)[:200]}
        except Exception as e:  # keep the other variants
            r = {"setting": VARIANTS[name], "error": repr(e)[:1000]}
        opt.zero_grad(set_to_none=True)
        if CUDA:
            torch.cuda.empty_cache()
        res["variants"][name] = r
        print(name, json.dumps(r), flush=True)
        record.write_result(out, res)
    try:
        res["agreement"] = logprob_agreement(model, roll)
    except Exception as e:
        res["agreement"] = {"error": repr(e)[:500]}
    print("agreement", res["agreement"], flush=True)
    if args.profile_decode:
        del opt
        if CUDA:
            torch.cuda.empty_cache()
        model.eval()
        res["decode_profile"] = profile_decode(a, model, p_ids, p_mask, tok)
    res["wall_s"] = round(time.perf_counter() - t_start, 1)
    record.write_result(out, res)


if __name__ == "__main__":
    main()
