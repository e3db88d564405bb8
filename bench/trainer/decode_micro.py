"""The decode step's parts alone at the 1.5B headline shape, on a GPU: attention and matrix
products.

One decode step of the Qwen2.5-1.5B config over 256 rows (32 prompts x G=8): each part is
compiled (inductor) as the sampler compiles it, then 28 calls (one per layer, each layer its
own cache or weights, so nothing is served from L2) are captured in one CUDA graph and the
graph is replayed; the time per decode step is the replay's time. Parts:

- attention at attended lengths ``S``: ``eager`` (``decoder.eager_attention`` over the
  ``(B, KVH, C, D)`` cache, the default), ``grouped`` (``decoder.grouped_attention`` over the
  same layout: a group's prompt slots read once, through strided copies) and ``grouped_kv``
  (the same over a ``(KVH, B, C, D)`` cache, whose group slices need no copy);
- the matrix products at M = 256 rows: cuBLAS (``F.linear``) and inductor's autotuned
  Triton templates (``max_autotune_gemm``), gate and up apart or as one product.

    BENCH_SHAPE=qwen2.5-1.5b python -m bench.trainer.decode_micro

Writes ``$OUT/trainer_decode_micro.json``. A CPU run (``--small``) checks the code paths only.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from arbiter.trainer import decoder
from bench import record

LAYERS, ROWS, G, KVH, HQ, D, HIDDEN, INTER, VOCAB = 28, 256, 8, 2, 12, 128, 1536, 8960, 151936
PROMPT, NEW = 256, 512  # prompt slots (239 tokens padded, as group_attention pads them)


def replay_ms(calls: Sequence[Callable[[], Any]], reps: int) -> float:
    """Milliseconds of one replay of a CUDA graph holding ``calls`` (one per layer)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def attention(lengths: list[int], reps: int, dev: str) -> dict[str, Any]:
    dt = torch.bfloat16
    cap = PROMPT + NEW
    out: dict[str, Any] = {}
    q = torch.randn(ROWS, HQ, 1, D, device=dev, dtype=dt)
    for layout in ("eager", "grouped", "grouped_kv"):
        kv_major = layout == "grouped_kv"
        shape = (2, LAYERS, KVH, ROWS, cap, D) if kv_major else (2, LAYERS, ROWS, KVH, cap, D)
        cache = torch.randn(shape, device=dev, dtype=dt)
        if kv_major:  # (B, KVH, C, D) views of a (KVH, B, C, D) layout
            kc = [cache[0, i].transpose(0, 1) for i in range(LAYERS)]
            vc = [cache[1, i].transpose(0, 1) for i in range(LAYERS)]
        else:
            kc, vc = list(cache[0].unbind(0)), list(cache[1].unbind(0))
        for c in (*kc, *vc):  # a group's rows share their prompt slots (as after the prefill)
            first = c[::G, :, :PROMPT]
            c[:, :, :PROMPT] = first.repeat_interleave(G, 0)

        def fn(q: Any, k: Any, v: Any, b: Any, layout: str = layout) -> Any:
            if layout == "eager":
                return decoder.eager_attention(q, k, v, b, 0.088, dt)
            return decoder.grouped_attention(q, k, v, b, 0.088, dt, G, PROMPT)

        compiled = torch.compile(fn, dynamic=False) if dev == "cuda" else fn
        for s in lengths:
            bias = torch.zeros(ROWS, 1, 1, 1, s, device=dev)
            calls = [
                functools.partial(compiled, q, kc[i][:, :, :s], vc[i][:, :, :s], bias)
                for i in range(LAYERS)
            ]
            ref = decoder.eager_attention(q, kc[0][:, :, :s], vc[0][:, :, :s], bias, 0.088, dt)
            err = float((calls[0]().float() - ref.float()).abs().max())
            ms = replay_ms(calls, reps) if dev == "cuda" else None
            out[f"{layout}_S{s}"] = {"ms_per_step": ms, "max_abs_diff_vs_eager": err}
            print(layout, s, out[f"{layout}_S{s}"], flush=True)
        del cache, kc, vc
    return out


def products(reps: int, dev: str, autotune: bool) -> dict[str, Any]:

    dt = torch.bfloat16
    x = {k: torch.randn(ROWS, k, device=dev, dtype=dt) for k in (HIDDEN, INTER)}
    shapes = {
        "qkv": (HIDDEN, (HQ + 2 * KVH) * D),
        "o": (HIDDEN, HIDDEN),
        "gate": (HIDDEN, INTER),
        "gate_up": (HIDDEN, 2 * INTER),
        "down": (INTER, HIDDEN),
        "head": (HIDDEN, VOCAB),
    }
    out: dict[str, Any] = {}
    for name, (k, n) in shapes.items():
        layers = 1 if name == "head" else LAYERS
        ws = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(layers)]
        kinds: list[tuple[str, Callable[..., Any]]] = [("cublas", F.linear)]
        if autotune and dev == "cuda":
            with_autotune = torch.compile(lambda a, w: F.linear(a, w), dynamic=False,
                                          mode="max-autotune-no-cudagraphs")  # fmt: skip
            kinds.append(("autotuned", with_autotune))
        for kind, fn in kinds:
            calls = [functools.partial(fn, x[k], w) for w in ws]
            ms = replay_ms(calls, reps) if dev == "cuda" else None
            out[f"{name}_{kind}"] = {"ms_per_step": ms, "calls": layers}
            print(name, kind, out[f"{name}_{kind}"], flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--small", action="store_true", help="CPU: check the code paths only")
    p.add_argument("--lengths", default="384,512,640,768")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--no-autotune", dest="autotune", action="store_false")
    args = p.parse_args(argv)
    global LAYERS, ROWS, INTER, VOCAB, PROMPT, NEW
    dev = "cuda" if torch.cuda.is_available() and not args.small else "cpu"
    if dev == "cpu":
        LAYERS, ROWS, INTER, VOCAB, PROMPT, NEW = 2, 16, 64, 128, 16, 16
        args.lengths = "24,32"
    res: dict[str, Any] = {"card": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                           "torch": torch.__version__}  # fmt: skip
    res["attention"] = attention([int(s) for s in args.lengths.split(",")], args.reps, dev)
    res["products"] = products(args.reps, dev, args.autotune)
    out = Path(os.environ.get("OUT", ".")) / "trainer_decode_micro.json"
    record.write_result(out, res)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
