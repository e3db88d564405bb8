"""Flex attention's decoding kernel alone at the 1.5B sampler's decode shape, a few tile settings.

256 rows x 2 KV heads x 6 query rows (the 6 query heads of a KV head, as
``trainer.decoder.fused_attention`` packs them) over 512 cache slots of head dim 128, bf16,
20% of the slots masked through a score_mod (as the sampler's valid-slot mask); compiled,
20 calls captured in one CUDA graph, 10 replays; microseconds per call and the K+V bytes read
per second. One JSON line per setting into ``$OUT/flex_micro.jsonl``.

    python -m bench.trainer.flex_micro
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, cast

import torch
from torch.nn.attention.flex_attention import flex_attention

from bench import record

B, KVH, G, S, D = 256, 2, 6, 512, 128
SETTINGS: list[dict[str, Any]] = [
    {},  # torch's default for the card
    {"num_stages": 3},
    {"num_stages": 2, "num_warps": 4},
    {"BLOCK_N": 128, "num_stages": 2, "num_warps": 4},
    {"SPLIT_KV": 2},
]


def time_setting(opts: dict[str, Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 valid: torch.Tensor) -> dict[str, Any]:  # fmt: skip
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> Any:
        def keep(s: Any, b: Any, h: Any, qi: Any, kv: Any) -> Any:
            return torch.where(valid[b, kv], s, float("-inf"))

        return flex_attention(q, k, v, score_mod=keep, kernel_options=cast(Any, dict(opts)))

    torch._dynamo.reset()
    cf = torch.compile(f, dynamic=False)
    cf(q, k, v, valid)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            cf(q, k, v, valid)
    graph.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        graph.replay()
    e1.record()
    torch.cuda.synchronize()
    us = e0.elapsed_time(e1) * 1000 / 200
    return {"opts": opts, "us": round(us, 2), "TBps": round(2 * k.numel() * 2 / us / 1e6, 2)}


def main() -> None:
    torch.manual_seed(0)
    q = torch.randn(B, KVH, G, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, KVH, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, KVH, S, D, device="cuda", dtype=torch.bfloat16)
    valid = torch.rand(B, S, device="cuda") > 0.2
    valid[:, -1] = True
    path = Path(os.environ.get("OUT", ".")) / "flex_micro.jsonl"
    with path.open("w") as out:
        for opts in SETTINGS:
            try:
                r = time_setting(opts, q, k, v, valid)
            except Exception as e:  # keep the other settings
                r = {"opts": opts, "error": repr(e)[:300]}
            print(r, flush=True)
            out.write(json.dumps(r) + "\n")
    record.write_sidecar(path)


if __name__ == "__main__":
    main()
