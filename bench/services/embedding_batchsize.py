"""Encoder throughput by batch size on long texts: what the batch token budget costs.

The service's own encoder (``Encoder.prepare`` + ``forward``, in this process) encodes the
same ``--texts`` long texts (``--join`` GSM8K solutions joined, cut at the model's 256
tokens) in batches of each ``--sizes`` value, interleaved (A B C, then C B A, ...) for
``--rounds`` rounds so that drifting machine load hits every size alike; prints tokens/s
per size (mean over rounds). A token budget of B makes batches of about B / 246 long texts.

    .venv/bin/python -m bench.services.embedding_batchsize [--sizes 8,16,32] [--rounds 2]
        [--texts 32] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from arbiter import gsm8k
from arbiter.services.embedding.encoder import Encoder
from arbiter.services.embedding.settings import EmbeddingSettings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="8,16,32", help="texts per batch")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--texts", type=int, default=32)
    p.add_argument("--join", type=int, default=3, help="GSM8K answers per long text")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    encoder = Encoder(EmbeddingSettings(device=args.device))
    with open(gsm8k.default_dir() / "train.jsonl") as f:
        answers = [json.loads(line)["answer"] for line in f]
    j = args.join
    texts = [" ".join(answers[j * i : j * i + j]) for i in range(args.texts)]
    encoder.encode(texts[:4])  # warm-up
    sizes = [int(s) for s in args.sizes.split(",")]
    rates: dict[int, list[float]] = {k: [] for k in sizes}
    for r in range(args.rounds):
        for k in sizes if r % 2 == 0 else sizes[::-1]:
            start, tokens = time.perf_counter(), 0
            for i in range(0, len(texts), k):
                prepared = encoder.prepare(texts[i : i + k])
                tokens += int(prepared.tokens.sum())
                encoder.forward(prepared)
            rates[k].append(tokens / (time.perf_counter() - start))
            print(f"{k} texts/batch ({tokens * k // len(texts)} tokens): {rates[k][-1]:.0f} tok/s")
    print({k: round(statistics.mean(v)) for k, v in rates.items()})


if __name__ == "__main__":
    main()
