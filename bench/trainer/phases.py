"""Pieces of ``bench.trainer.speed`` and the other trainer benches: loading the TRL baseline,
its prompts, sampler timing, and the checks that the sampler samples what HF ``generate``
samples (``check`` and ``hf`` phases)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from arbiter.trainer.sampling import SamplingParams

# The TRL side of the comparison: its model, tokenizer, prompts and GRPOTrainer phase.
TRL_BASELINE = Path(__file__).with_name("trl_baseline.py")


def load_baseline() -> ModuleType:
    """bench/trainer/trl_baseline.py as a fresh module: it reads its ``BENCH_*`` shape
    settings when imported, and a benchmark sets them (or a test changes them) first."""
    spec = importlib.util.spec_from_file_location("trl_baseline", TRL_BASELINE)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import the TRL baseline from {TRL_BASELINE}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["trl_baseline"] = mod
    spec.loader.exec_module(mod)
    return mod


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@contextlib.contextmanager
def gpu_span(row: dict[str, Any], name: str) -> Iterator[None]:
    """Diagnostics of a span of a step into ``row`` on a GPU: ``{name}_gpu_s``, the GPU's
    own time between the span's ends (CUDA events; the wall time less it is time the GPU
    waited for the host), ``{name}_cuda_mallocs``, the device allocations the caching
    allocator made, and ``{name}_compiles``, the graphs torch.compile made meanwhile."""
    if not torch.cuda.is_available():
        yield
        return
    from torch._dynamo.utils import counters

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    mallocs, graphs = (
        torch.cuda.memory_stats().get("num_device_alloc", 0),
        counters["stats"]["unique_graphs"],
    )
    start.record()
    yield
    end.record()
    end.synchronize()
    row[f"{name}_gpu_s"] = start.elapsed_time(end) / 1000
    row[f"{name}_cuda_mallocs"] = torch.cuda.memory_stats().get("num_device_alloc", 0) - mallocs
    row[f"{name}_compiles"] = counters["stats"]["unique_graphs"] - graphs


def prompts(a: ModuleType, tok: Any, dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    rows = a.prompts_messages(a.N_PROMPTS)
    texts = [
        tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
        for r in rows
    ]
    texts = [t for t in texts for _ in range(a.G)]
    enc = tok(
        texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
    ).to(dev)
    return enc["input_ids"], enc["attention_mask"]


def use_gsm8k(a: ModuleType, path: Path) -> None:
    """Both sides (ours and TRL's) take their prompts from GSM8K: the TRL baseline's
    ``prompts_messages`` is replaced, questions in file order, in the trainer's
    chat prompt (``arbiter.trainer.data.chat_messages``)."""
    from arbiter.trainer.data import chat_messages, load_problems

    problems = load_problems(path)

    def prompts_messages(n: int) -> list[dict[str, Any]]:
        rows = [problems[i % len(problems)] for i in range(n)]
        return [{"prompt": chat_messages(p.question), "answer": p.reference} for p in rows]

    vars(a)["prompts_messages"] = prompts_messages  # the baseline looks it up at call time


def length_reward(texts: list[str]) -> list[float]:
    return [min(len(t), 400) / 400.0 for t in texts]  # the TRL baseline's reward


def mean_nll(
    model: Any, p_ids: torch.Tensor, p_mask: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor
) -> tuple[float, float]:
    from arbiter.trainer.logprobs import completion_logits, token_logprobs

    with torch.no_grad():
        logits = completion_logits(
            model, torch.cat([p_ids, ids], 1), torch.cat([p_mask.bool(), mask], 1), ids.shape[1]
        )
        nll = -token_logprobs(logits, ids)[mask]
    return float(nll.mean()), float(nll.std() / math.sqrt(nll.numel()))


def phase_check(a: ModuleType, tok: Any, dev: str) -> dict[str, Any]:
    from arbiter.trainer.generation import Sampler

    model = a.load_model().eval()
    p_ids, p_mask = prompts(a, tok, dev)
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
        out = model.generate(
            input_ids=p_ids,
            attention_mask=p_mask,
            max_new_tokens=a.MAX_NEW,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            disable_compile=True,
            **kw,
        )
    hf = out[:, p_ids.shape[1] :]
    from arbiter.trainer.generation import completion_mask_from_ids

    hf_mask = completion_mask_from_ids(hf, tok.eos_token_id)
    res["nll_ours"] = mean_nll(model, p_ids, p_mask, ours, ours_mask)
    res |= check_autocast(a, p_ids, p_mask, kw)
    res["nll_hf_generate"] = mean_nll(model, p_ids, p_mask, hf, hf_mask)
    (m1, s1), (m2, s2) = res["nll_ours"], res["nll_hf_generate"]
    res["nll_diff_in_stderr"] = round((m1 - m2) / math.sqrt(s1**2 + s2**2), 2)
    del model
    return res


def check_autocast(
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
    p_ids, p_mask = prompts(a, tok, dev)
    cfg = GenerationConfig(
        max_new_tokens=a.MAX_NEW,
        min_new_tokens=a.MAX_NEW,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        disable_compile=True,
    )
    times = []
    with torch.no_grad():
        for _ in range(3):
            sync()
            t = time.perf_counter()
            out = model.generate(input_ids=p_ids, attention_mask=p_mask, generation_config=cfg)
            sync()
            times.append(time.perf_counter() - t)
    n_tok = (out.shape[1] - p_ids.shape[1]) * out.shape[0]
    best = min(times[1:])
    del model
    return {
        "times_s": [round(x, 3) for x in times],
        "s": round(best, 3),
        "tokens": n_tok,
        "tokens_per_s": round(n_tok / best, 1),
    }


def time_sampler(
    sampler: Any, p_ids: torch.Tensor, p_mask: torch.Tensor, n: int, tok: Any, reps: int, dev: str
) -> dict[str, Any]:
    gen = torch.Generator(device=dev).manual_seed(1)
    params = SamplingParams.for_tokenizer(tok, n, generator=gen)
    times, toks = [], []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        _, mask = sampler(p_ids, p_mask, params)
        sync()
        times.append(time.perf_counter() - t)
        toks.append(int(mask.sum()))
    best = min(times[1:]) if reps > 1 else times[0]
    i = times.index(best)
    return {
        "times_s": [round(x, 4) for x in times],
        "s": round(best, 4),
        "tokens": toks[i],
        "tokens_per_s": round(toks[i] / best, 1),
        "ms_per_decode_step": round(1000 * best / n, 3),
    }


def run_tokens(roll: Any, micro_batch: int, shared_prefix: bool) -> int:
    """Tokens the training forward runs: the real ones, less, with ``shared_prefix``, the
    prompt tokens of rows whose prompt another row of their micro-batch already runs."""
    from arbiter.trainer.decoder import distinct_rows

    total = int(roll.attention_mask.sum())
    if not shared_prefix:
        return total
    p = roll.input_ids.shape[1] - roll.loss_mask.shape[1]
    for s in range(0, len(roll.input_ids), micro_batch):
        ids, mask = (
            roll.input_ids[s : s + micro_batch, :p],
            roll.attention_mask[s : s + micro_batch, :p],
        )
        _, first = distinct_rows(ids, mask)
        total -= int(mask.sum()) - int(mask[first].sum())
    return total


# spec-sheet peaks (dense bf16 tensor FLOP/s, HBM bytes/s) of the SXM cards, by name
CARDS = {"H100": (989e12, 3.35e12), "H200": (989e12, 4.8e12)}


def card_limits(
    model: Any, steady: list[dict[str, Any]], *, prompt_len: int, rows: int, card: str
) -> dict[str, Any]:
    """How far the steps ran from the card's limits: the decode step's time (prefill
    included) against (bf16 weights + KV cache) bytes / HBM bandwidth, and the train step's
    model FLOPs utilisation (6 x matmul parameters x sequence tokens, attention left out):
    ``train_mfu`` counts the padded batch's tokens, ``train_mfu_real_tokens`` only the real
    ones (prompt and completion; the step drops padding that no row of a micro-batch needs),
    ``train_mfu_run_tokens`` those the forward runs (each group's prompt once with
    ``shared_prefix``: the work actually done)."""
    name = card
    peak = next((v for k, v in CARDS.items() if k in name), None)
    if peak is None or not steady:
        return {"card": name, "note": "no spec-sheet peaks for this card"}
    flops, bandwidth = peak
    cfg = model.config
    total = sum(p.numel() for p in model.parameters())
    head = cfg.vocab_size * cfg.hidden_size
    matmul = total if cfg.tie_word_embeddings else total - head  # lookups cost no FLOPs
    layers, kv = cfg.num_hidden_layers, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    out: dict[str, Any] = {"card": name, "peak_flops": flops, "hbm_bytes_per_s": bandwidth}
    decode_ms, bound_ms, mfu, mfu_real, mfu_run = [], [], [], [], []
    for r in steady:
        n = r["decode_steps"]
        ctx = prompt_len + n / 2  # mean cache length read per decode step
        kv_bytes = rows * ctx * layers * 2 * kv * head_dim * 2
        decode_ms.append(1000 * r["generate_s"] / n)
        bound_ms.append(1000 * (matmul * 2 + kv_bytes) / bandwidth)
        mfu.append(6 * matmul * r["seq_tokens"] / r["train_s"] / flops)
        mfu_real.append(6 * matmul * r.get("real_tokens", r["seq_tokens"]) / r["train_s"] / flops)
        mfu_run.append(6 * matmul * r.get("run_tokens", r["seq_tokens"]) / r["train_s"] / flops)
    dec, bound = sum(decode_ms) / len(decode_ms), sum(bound_ms) / len(bound_ms)
    out["decode_ms_per_step"] = round(dec, 3)
    out["decode_bound_ms_per_step"] = round(bound, 6)
    out["decode_x_of_bound"] = round(dec / bound, 2)
    out["train_mfu"] = round(sum(mfu) / len(mfu), 4)
    out["train_mfu_real_tokens"] = round(sum(mfu_real) / len(mfu_real), 4)
    out["train_mfu_run_tokens"] = round(sum(mfu_run) / len(mfu_run), 4)
    return out


def print_table(res: dict[str, Any]) -> None:
    """The speed table of a ``bench.trainer.speed`` result, printed last."""
    gpu = res["versions"].get("gpu", "cpu")
    ours, trl, hf = res.get("ours", {}), res.get("trl", {}), res.get("hf_generate", {})
    lines = [f"card: {gpu}", "| what | s/step | completion tok/s | vs TRL |", "|---|---|---|---|"]
    base = trl.get("completion_tokens_per_s")

    def row(name: str, s: Any, tps: Any) -> None:
        ratio = f"{tps / base:.2f}x" if base and isinstance(tps, float) else "-"
        lines.append(f"| {name} | {s} | {tps} | {ratio} |")

    row("TRL 1.16 GRPOTrainer step", trl.get("s_per_step_steady"), base)
    row("TRL: its generate share", trl.get("generate_s_per_step_steady"), None)
    row(
        f"ours: GRPO step ({ours.get('steps_sampler')} sampler + loss + AdamW)",
        ours.get("s_per_step"),
        ours.get("completion_tokens_per_s"),
    )
    for k in ("generate_s", "reward_s", "train_s"):
        row(f"ours: {k} share", ours.get(k + "_per_step"), None)
    fast = res.get("ours_fast", {})
    row("ours_fast: GRPO step (cache kept, micro-batch 16)", fast.get("s_per_step"),
        fast.get("completion_tokens_per_s"))  # fmt: skip
    shape = (
        f"{res['setting']['prompts'] * res['setting']['G']} x {res['setting']['max_new_tokens']}"
    )
    row(f"plain HF generate ({shape})", hf.get("s"), hf.get("tokens_per_s"))
    lines.append(
        f"| medians: TRL {trl.get('s_per_step_median')} s/step, "
        f"ours {ours.get('s_per_step_median')} s/step | | | |"
    )
    for k in (
        "sampler_eager",
        "sampler_graphs",
        "sampler_compiled",
        "sampler_compiled_whole_cache",
    ):
        r = ours.get(k, {})
        name = k.removeprefix("sampler_").replace("_", " + ")
        row(f"our sampler, {name} ({shape})", r.get("s"), r.get("tokens_per_s"))
    for k in ("peak_GiB_generate", "peak_GiB_train"):
        lines.append(f"| ours: {k} | {ours.get(k)} (fast: {fast.get(k)}) | | |")
    lines.append(f"| TRL: peak memory | {trl.get('mem_peak')} | | |")
    print("\n".join(lines))
    if "check" in res:
        print("check:", json.dumps(res["check"]))
