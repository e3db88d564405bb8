"""Trainer speed on one GPU: our sampler + GRPO step against TRL's GRPOTrainer and plain generate.

Same setting as the TRL anchor (``../shared/bench/trl_grpo_anchor.py``, whose model/tokenizer
builders and TRL phase are reused so both sides see the same thing): random-init 0.48 B Qwen2
(hidden 1024, 24 layers, 16 heads, 2 KV heads, vocab 32,000, bf16, SDPA), 8 prompts x G=8,
128 new tokens, temperature 1, top_p 1, length reward, beta 0, token-mean loss, AdamW lr 1e-6,
grad-norm clip 1.0, one optimizer step per batch (mu = 1: old log-probs = detached current).

Phases (``--phases``, default all): ``check`` (CUDA graph vs eager greedy ids identical; mean
NLL of our samples vs HF generate's under the training forward), ``hf`` (plain
``model.generate``), ``ours`` (sampler alone, eager and graphed, then full steps), ``trl``.

    python -m bench.trainer_speed [--anchor PATH] [--steps 16] [--phases check,hf,ours,trl]

Writes ``$OUT/trainer_speed.json`` (rewritten after each phase) and prints a table last.
``ANCHOR_SMALL=1`` shrinks everything for a CPU smoke test (as in the anchor).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from arbiter.trainer.sampling import SamplingParams

REPO = Path(__file__).resolve().parents[1]
WARMUP = 2


def _load_anchor(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("trl_grpo_anchor", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import the anchor from {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["trl_grpo_anchor"] = mod
    spec.loader.exec_module(mod)
    return mod


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _prompts(a: ModuleType, tok: Any, dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    rows = a.prompts_messages(a.N_PROMPTS)
    texts = [
        tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
        for r in rows
    ]
    texts = [t for t in texts for _ in range(a.G)]
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left",
              add_special_tokens=False).to(dev)  # fmt: skip
    return enc["input_ids"], enc["attention_mask"]


def _length_reward(texts: list[str]) -> list[float]:
    return [min(len(t), 400) / 400.0 for t in texts]  # the anchor's reward


def _mean_nll(model: Any, p_ids: torch.Tensor, p_mask: torch.Tensor, ids: torch.Tensor,
              mask: torch.Tensor) -> tuple[float, float]:  # fmt: skip
    from arbiter.trainer.grpo import completion_logits, token_logprobs

    with torch.no_grad():
        logits = completion_logits(
            model, torch.cat([p_ids, ids], 1), torch.cat([p_mask.bool(), mask], 1), ids.shape[1]
        )
        nll = -token_logprobs(logits, ids)[mask]
    return float(nll.mean()), float(nll.std() / math.sqrt(nll.numel()))


def phase_check(a: ModuleType, tok: Any, dev: str) -> dict[str, Any]:
    from arbiter.trainer.generation import Sampler

    model = a.load_model().eval()
    p_ids, p_mask = _prompts(a, tok, dev)
    kw = dict(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    graphed = Sampler(model, compile=False)
    eager = Sampler(model, use_cuda_graphs=False, compile=False)
    greedy = SamplingParams(64, temperature=0.0, **kw)
    g_ids, _ = graphed(p_ids, p_mask, greedy)
    e_ids, _ = eager(p_ids, p_mask, greedy)
    res: dict[str, Any] = {"graph_equals_eager_greedy": bool(torch.equal(g_ids, e_ids))}
    gen = torch.Generator(device=dev).manual_seed(0)
    ours, ours_mask = graphed(p_ids, p_mask, SamplingParams(a.MAX_NEW, generator=gen, **kw))
    with torch.no_grad():
        out = model.generate(input_ids=p_ids, attention_mask=p_mask, max_new_tokens=a.MAX_NEW,
                             do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                             disable_compile=True, **kw)  # fmt: skip
    hf = out[:, p_ids.shape[1] :]
    from arbiter.trainer.generation import completion_mask_from_ids

    hf_mask = completion_mask_from_ids(hf, tok.eos_token_id)
    res["nll_ours"] = _mean_nll(model, p_ids, p_mask, ours, ours_mask)
    res |= _check_autocast(a, p_ids, p_mask, kw)
    res["nll_hf_generate"] = _mean_nll(model, p_ids, p_mask, hf, hf_mask)
    (m1, s1), (m2, s2) = res["nll_ours"], res["nll_hf_generate"]
    res["nll_diff_in_stderr"] = round((m1 - m2) / math.sqrt(s1**2 + s2**2), 2)
    del model
    return res


def _check_autocast(
    a: ModuleType, p_ids: torch.Tensor, p_mask: torch.Tensor, kw: dict[str, Any]
) -> dict[str, Any]:
    """fp32 weights under bf16 autocast (the trainer's bf16-mixed): graphs replayed in a later
    autocast context, after an in-place weight update, still equal the eager sampler."""
    from arbiter.trainer.generation import Sampler

    if not torch.cuda.is_available():
        return {}
    m32 = a.load_model().float().eval()
    graphed = Sampler(m32, compile=False)
    eager = Sampler(m32, use_cuda_graphs=False, compile=False)
    greedy = SamplingParams(32, temperature=0.0, **kw)
    out: dict[str, Any] = {}
    for r in range(2):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            g, _ = graphed(p_ids, p_mask, greedy)
            e, _ = eager(p_ids, p_mask, greedy)
        out[f"autocast_graph_equals_eager_round{r}"] = bool(torch.equal(g, e))
        with torch.no_grad():  # an optimizer-like in-place update between rollouts
            for p in m32.parameters():
                p.add_(torch.randn_like(p) * 0.02)
    del m32
    return out


def phase_hf(a: ModuleType, tok: Any, dev: str) -> dict[str, Any]:
    from transformers import GenerationConfig

    model = a.load_model().eval()
    p_ids, p_mask = _prompts(a, tok, dev)
    cfg = GenerationConfig(max_new_tokens=a.MAX_NEW, min_new_tokens=a.MAX_NEW, do_sample=True,
                           temperature=1.0, top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id, disable_compile=True)  # fmt: skip
    times = []
    with torch.no_grad():
        for _ in range(3):
            _sync()
            t = time.perf_counter()
            out = model.generate(input_ids=p_ids, attention_mask=p_mask, generation_config=cfg)
            _sync()
            times.append(time.perf_counter() - t)
    n_tok = (out.shape[1] - p_ids.shape[1]) * out.shape[0]
    best = min(times[1:])
    del model
    return {"times_s": [round(x, 3) for x in times], "s": round(best, 3),
            "tokens": n_tok, "tokens_per_s": round(n_tok / best, 1)}  # fmt: skip


def _time_sampler(sampler: Any, p_ids: torch.Tensor, p_mask: torch.Tensor, n: int, tok: Any,
                  reps: int, dev: str) -> dict[str, Any]:  # fmt: skip
    gen = torch.Generator(device=dev).manual_seed(1)
    params = SamplingParams.for_tokenizer(tok, n, generator=gen)
    times, toks = [], []
    for _ in range(reps):
        _sync()
        t = time.perf_counter()
        _, mask = sampler(p_ids, p_mask, params)
        _sync()
        times.append(time.perf_counter() - t)
        toks.append(int(mask.sum()))
    best = min(times[1:]) if reps > 1 else times[0]
    i = times.index(best)
    return {"times_s": [round(x, 4) for x in times], "s": round(best, 4), "tokens": toks[i],
            "tokens_per_s": round(toks[i] / best, 1),
            "ms_per_decode_step": round(1000 * best / n, 3)}  # fmt: skip


def phase_ours(
    a: ModuleType, tok: Any, dev: str, steps: int, compile_steps: bool = False
) -> dict[str, Any]:
    from arbiter.trainer.generation import Sampler

    res: dict[str, Any] = {}
    model = a.load_model()
    p_ids, p_mask = _prompts(a, tok, dev)
    n = a.MAX_NEW
    eager = Sampler(model, use_cuda_graphs=False, compile=False)
    res["sampler_eager"] = _time_sampler(eager, p_ids, p_mask, n, tok, 2, dev)
    sampler = Sampler(model, compile=False)
    res["sampler_graphs"] = _time_sampler(sampler, p_ids, p_mask, n, tok, 4, dev)
    print("sampler", res, flush=True)
    res["steps_sampler"] = "graphs"
    if dev == "cuda":  # option: torch.compile the decode forward before capture
        try:
            t = time.perf_counter()
            compiled = Sampler(model, compile=True)
            res["sampler_graphs_compiled"] = _time_sampler(compiled, p_ids, p_mask, n, tok, 4, dev)
            if compile_steps:
                sampler, res["steps_sampler"] = compiled, "graphs + compiled"
            res["sampler_graphs_compiled"]["first_call_with_compile_s"] = round(
                time.perf_counter() - t - 3 * res["sampler_graphs_compiled"]["s"], 1
            )
        except Exception as e:  # keep the rest of the phase
            res["sampler_graphs_compiled"] = {"error": repr(e)[:1000]}
        print("compiled", res["sampler_graphs_compiled"], flush=True)

    # full GRPO steps with the trainer's loss code (falls back to an equivalent local copy)
    try:
        from arbiter.trainer.grpo import (
            completion_logits,
            group_advantages,
            grpo_loss,
            token_logprobs,
        )

        res["loss_code"] = "arbiter.trainer.grpo (group_advantages, completion_logits, grpo_loss)"
    except ImportError as e:  # pragma: no cover - only while trainer.grpo is being written
        raise SystemExit(f"arbiter.trainer.grpo not importable: {e}") from e
    model.train()
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=dev == "cuda")
    gen = torch.Generator(device=dev).manual_seed(2)
    rows = []
    for step in range(steps + WARMUP):
        _sync()
        t0 = time.perf_counter()
        ids, mask = sampler(p_ids, p_mask, SamplingParams.for_tokenizer(tok, n, generator=gen))
        _sync()
        t1 = time.perf_counter()
        texts = tok.batch_decode(ids.masked_fill(~mask, tok.pad_token_id),
                                 skip_special_tokens=True)  # fmt: skip
        rewards = torch.tensor(_length_reward(texts), device=dev)
        adv = group_advantages(rewards, a.G)
        t2 = time.perf_counter()
        logits = completion_logits(model, torch.cat([p_ids, ids], 1),
                                   torch.cat([p_mask.bool(), mask], 1), ids.shape[1])  # fmt: skip
        logps = token_logprobs(logits, ids)
        parts = grpo_loss(logps, logps.detach(), adv, mask, agg="token_mean")
        parts.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del logits, logps, parts
        _sync()
        t3 = time.perf_counter()
        rows.append({"step": step, "s": t3 - t0, "generate_s": t1 - t0, "reward_s": t2 - t1,
                     "train_s": t3 - t2, "tokens": int(mask.sum())})  # fmt: skip
    steady = rows[WARMUP:]
    tot = sum(r["s"] for r in steady)
    res["steps"] = [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
                    for r in rows]  # fmt: skip
    res["s_per_step"] = round(tot / len(steady), 4)
    res["s_per_step_median"] = round(sorted(r["s"] for r in steady)[len(steady) // 2], 4)
    for k in ("generate_s", "reward_s", "train_s"):
        res[k + "_per_step"] = round(sum(r[k] for r in steady) / len(steady), 4)
    res["completion_tokens_per_s"] = round(sum(r["tokens"] for r in steady) / tot, 1)
    if dev == "cuda":
        res["max_allocated_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    del model, opt, sampler
    return res


def phase_trl(a: ModuleType, tok: Any) -> dict[str, Any]:
    res: dict[str, Any] = a.phase_trl(tok, a.NSEQ, 1, "A")
    res.pop("logs", None)
    steady = sorted(res.get("step_times_s", [])[WARMUP:])
    if steady:
        res["s_per_step_median"] = steady[len(steady) // 2]
    return res


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--anchor", type=Path,
                   default=REPO / ".carry" / "trainer" / "trl_grpo_anchor.py")  # fmt: skip
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--phases", default="check,hf,ours,trl")
    p.add_argument(
        "--compile",
        action="store_true",
        help="time the GRPO steps with the compiled sampler (Sampler(compile=True))",
    )
    args = p.parse_args(argv)
    if not args.anchor.exists():
        args.anchor = REPO.parent / "shared" / "bench" / "trl_grpo_anchor.py"
    os.environ.setdefault("ANCHOR_STEPS", str(args.steps))
    a = _load_anchor(args.anchor)
    dev = a.DEV
    out_dir = Path(a.OUT)
    res: dict[str, Any] = {"versions": a.versions(), "setting": {
        "prompts": a.N_PROMPTS, "G": a.G, "max_new_tokens": a.MAX_NEW, "vocab": a.VOCAB,
        "steps_timed": args.steps, "warmup_steps": WARMUP}}  # fmt: skip

    def dump() -> None:
        (out_dir / "trainer_speed.json").write_text(json.dumps(res, indent=1, default=str))

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
                res["ours"] = phase_ours(a, tok, dev, args.steps, args.compile)
            elif ph == "trl":
                res["trl"] = phase_trl(a, tok)
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
    _table(res)


def _table(res: dict[str, Any]) -> None:
    gpu = res["versions"].get("gpu", "cpu")
    ours, trl, hf = res.get("ours", {}), res.get("trl", {}), res.get("hf_generate", {})
    lines = [f"card: {gpu}", "| what | s/step | completion tok/s | vs TRL |", "|---|---|---|---|"]
    base = trl.get("completion_tokens_per_s")

    def row(name: str, s: Any, tps: Any) -> None:
        ratio = f"{tps / base:.2f}x" if base and isinstance(tps, float) else "-"
        lines.append(f"| {name} | {s} | {tps} | {ratio} |")

    row("TRL 1.16 GRPOTrainer step", trl.get("s_per_step_steady"), base)
    row("TRL: its generate share", trl.get("generate_s_per_step_steady"), None)
    row(f"ours: GRPO step ({ours.get('steps_sampler')} sampler + loss + AdamW)",
        ours.get("s_per_step"),
        ours.get("completion_tokens_per_s"))  # fmt: skip
    for k in ("generate_s", "reward_s", "train_s"):
        row(f"ours: {k} share", ours.get(k + "_per_step"), None)
    row("plain HF generate (64 x 128)", hf.get("s"), hf.get("tokens_per_s"))
    lines.append(
        f"| medians: TRL {trl.get('s_per_step_median')} s/step, "
        f"ours {ours.get('s_per_step_median')} s/step | | | |"
    )
    for k in ("sampler_eager", "sampler_graphs", "sampler_graphs_compiled"):
        r = ours.get(k, {})
        name = k.removeprefix("sampler_").replace("_", " + ")
        row(f"our sampler, {name} (64 x 128)", r.get("s"), r.get("tokens_per_s"))
    print("\n".join(lines))
    if "check" in res:
        print("check:", json.dumps(res["check"]))


if __name__ == "__main__":
    main()
