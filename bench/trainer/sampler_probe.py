"""The sampler alone at the headline scale, before and after its exact shortcuts, one process.

The speed comparison's rollout (Qwen2.5-1.5B config, 32 GSM8K prompts x G=8 = 256 rows, 512
new tokens, T=1, bf16; the TRL baseline's model and prompts): the compiled + graphed sampler
as it was (``length_round=0``, ``share_prompts``, ``blocked_draw`` off) against the current
one, then each shortcut left out once, and the decode attention fused (flex attention or SDPA)
instead of eager. Checks, on the same card: greedy ids of the graphed and the eager
sampler identical (uncompiled, as ``bench.trainer.speed --phases check``); greedy ids of the
compiled sampler "after" against "before" and "after_flex_attention", those run (rows equal,
first divergence: bf16 rounding may differ); mean NLL under the training forward of 256 x 512
samples from each of those and HF ``generate`` (same distribution: differences within a few
standard errors); a kernel table of 10 decode steps of each (graph replays at a 512-slot and
the full cache; first row: all kernels). Peak memory of
each sampler call. Writes ``$OUT/trainer_sampler_probe.json`` after every part.

    BENCH_SHAPE=qwen2.5-1.5b BENCH_PROMPTS=32 BENCH_G=8 BENCH_NEW=512 \\
      python -m bench.trainer.sampler_probe --gsm8k ../shared/data/gsm8k/train.jsonl
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch._inductor.config

from arbiter.trainer.sampling import SamplingParams
from bench import record
from bench.trainer.phases import (
    load_baseline,
    prompts,
    sync,
    time_sampler,
    use_gsm8k,
)

BEFORE: dict[str, Any] = {"length_round": 0, "share_prompts": False, "blocked_draw": False}
VARIANTS: dict[str, dict[str, Any]] = {  # name -> Sampler options (compiled + graphed on a GPU)
    "before": BEFORE,
    "after": {},
    "after_whole_cache": {"length_round": 0},
    "after_no_blocked_draw": {"blocked_draw": False},
    "after_no_share_prompts": {"share_prompts": False},
    "after_flex_attention": {"attention": "flex"},  # one fused decode-attention kernel
    "after_sdpa_attention": {"attention": "sdpa"},
    # the session's sampler changes off: grouped attention, merged q/k/v product
    "after_ungrouped": {"group_attention": False, "merged_qkv": False},
    # attending to the whole cache (one graph, one compile): grouped attention on / off
    "whole_grouped": {"length_round": 0},
    "whole_ungrouped": {"length_round": 0, "group_attention": False},
    # inductor autotunes the decode step's matrix products (Triton templates vs cuBLAS)
    "after_autotune": {"inductor": {"max_autotune_gemm": True}},
}
CHECKED = ("before", "after", "after_flex_attention", "after_ungrouped")  # sampled, greedy, kernels


def nll(
    model: Any, p_ids: torch.Tensor, p_mask: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor
) -> tuple[float, float]:
    """Mean NLL (and its standard error) of the completions under the training forward, in
    row chunks (the full-vocabulary logits of 256 x 512 tokens would not fit)."""
    from arbiter.trainer.logprobs import completion_logits, token_logprobs

    out = []
    with torch.no_grad():
        for r in range(0, ids.shape[0], 8):
            sl = slice(r, r + 8)
            logits = completion_logits(
                model,
                torch.cat([p_ids[sl], ids[sl]], 1),
                torch.cat([p_mask[sl].bool(), mask[sl]], 1),
                ids.shape[1],
            )
            out.append(-token_logprobs(logits, ids[sl])[mask[sl]].float())
    x = torch.cat(out)
    return float(x.mean()), float(x.std() / math.sqrt(x.numel()))


def kernel_table(sampler: Any, s: int | None = None, steps: int = 10) -> list[dict[str, Any]]:
    """The kernels of ``steps`` replays of the decode graph that attends to ``s`` slots
    (default: the whole cache) of the sampler's first bucket."""
    from torch.profiler import ProfilerActivity, profile

    bk = next(iter(sampler._buckets.values()))
    s = s or bk.key[1]
    graph = bk.graphs.get(s)
    if graph is None:
        return []
    bk.slot.fill_(s - steps - 1)  # slots inside the attended length; the cache is scratch now
    bk.step.fill_(1)
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            graph.replay()
        sync()
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", 0) or getattr(ev, "cuda_time_total", 0)
        if t > 0:
            rows.append({"kernel": ev.key[:120], "us_per_step": round(t / steps, 1),
                         "calls_per_step": ev.count / steps})  # fmt: skip
    rows.sort(key=lambda r: -r["us_per_step"])
    total = round(sum(r["us_per_step"] for r in rows), 1)
    return [{"kernel": "(all kernels)", "us_per_step": total}, *rows[:30]]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gsm8k", type=Path, default=None)
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args(argv)
    a = load_baseline()
    if args.gsm8k is not None:
        use_gsm8k(a, args.gsm8k)
    from arbiter.trainer.generation import Sampler

    dev = a.DEV
    res: dict[str, Any] = {"versions": a.versions(), "rows": a.NSEQ, "max_new_tokens": a.MAX_NEW}
    out = Path(a.OUT) / "trainer_sampler_probe.json"

    def dump() -> None:
        record.write_result(out, res)

    tok = a.build_tokenizer()
    model = a.build_model(tok).to(dev).eval()
    p_ids, p_mask = prompts(a, tok, dev)
    res["prompt_tokens_padded"] = int(p_ids.shape[1])
    kw = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    n = a.MAX_NEW

    # uncompiled: graphs vs eager, greedy, 64 tokens (the check phase's test, new code)
    greedy64 = SamplingParams(64, temperature=0.0, **kw)
    g_ids, _ = Sampler(model, compile=False)(p_ids, p_mask, greedy64)
    e_ids, _ = Sampler(model, use_cuda_graphs=False, compile=False)(p_ids, p_mask, greedy64)
    res["graph_equals_eager_greedy"] = bool(torch.equal(g_ids, e_ids))
    del g_ids, e_ids
    print("graph_equals_eager_greedy", res["graph_equals_eager_greedy"], flush=True)
    dump()

    samples: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    greedy: dict[str, torch.Tensor] = {}
    for name in args.variants.split(","):
        opts = dict(VARIANTS[name])
        inductor = opts.pop("inductor", {})
        sampler = Sampler(model, **opts)
        r: dict[str, Any] = {"options": VARIANTS[name]}
        saved = {k: getattr(torch._inductor.config, k) for k in inductor}
        for k, v in inductor.items():  # compiles happen at the first call: set meanwhile
            setattr(torch._inductor.config, k, v)
        try:
            if dev == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            t = time.perf_counter()
            r |= time_sampler(sampler, p_ids, p_mask, n, tok, 3, dev)
            r["first_call_s"] = round(time.perf_counter() - t - 2 * r["s"], 1)
            r["compiled"] = sampler.compiled
            r["draw_compiled"] = sampler.blocked_draw_compiles
            r["attention"] = sampler.attention
            if dev == "cuda":
                r["peak_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            if name in CHECKED:
                gen = torch.Generator(device=dev).manual_seed(0)
                samples[name] = sampler(p_ids, p_mask, SamplingParams(n, generator=gen, **kw))
                greedy[name] = sampler(p_ids, p_mask, SamplingParams(n, temperature=0.0, **kw))[0]
                if dev == "cuda":
                    r["kernels_s512"] = kernel_table(sampler, 512)
                    r["kernels_full"] = kernel_table(sampler)
        except Exception as e:  # keep the other variants
            r["error"] = repr(e)[:1500]
        for k, v in saved.items():
            setattr(torch._inductor.config, k, v)
        sampler.release()
        res[name] = r
        print(name, {k: v for k, v in r.items() if not k.startswith("kernels")}, flush=True)
        dump()

    for ref in (x for x in CHECKED if x != "after" and x in greedy and "after" in greedy):
        b, c = greedy[ref], greedy["after"]
        w = min(b.shape[1], c.shape[1])
        diff = b[:, :w] != c[:, :w]
        first = torch.where(diff.any(1), diff.float().argmax(1), torch.full_like(diff[:, 0], w,
                            dtype=torch.long))  # fmt: skip
        res[f"greedy_{ref}_vs_after"] = {
            "rows_identical": int((~diff.any(1)).sum()),
            "rows": int(b.shape[0]),
            "mean_first_divergence": round(float(first.float().mean()), 1),
            "min_first_divergence": int(first.min()),
        }
        print(f"greedy {ref} vs after", res[f"greedy_{ref}_vs_after"], flush=True)
        dump()
    with torch.no_grad():
        out_hf = model.generate(
            input_ids=p_ids, attention_mask=p_mask, max_new_tokens=n, do_sample=True,
            temperature=1.0, top_p=1.0, top_k=0, disable_compile=True, **kw,
        )  # fmt: skip
    from arbiter.trainer.sampling import completion_mask_from_ids

    hf = out_hf[:, p_ids.shape[1] :]
    samples["hf_generate"] = (hf, completion_mask_from_ids(hf, tok.eos_token_id))
    res["nll"] = {k: nll(model, p_ids, p_mask, ids, m) for k, (ids, m) in samples.items()}
    ref = res["nll"]["hf_generate"]
    res["nll_diff_in_stderr_vs_hf"] = {
        k: round((m - ref[0]) / math.sqrt(s**2 + ref[1] ** 2), 2)
        for k, (m, s) in res["nll"].items()
        if k != "hf_generate"
    }
    print("nll", res["nll"], res["nll_diff_in_stderr_vs_hf"], flush=True)
    dump()


if __name__ == "__main__":
    main()
