"""Where one embedding encode call spends its time: tokenizing vs the forward pass.

For batches of GSM8K answers: sentence-transformers' ``preprocess`` (the Hugging Face
tokenizer wrapper), the Rust ``Tokenizer.encode_batch`` under it, the service's
``FastTokenizer``, the forward pass alone (inputs already on the device, output fetched),
and a whole ``model.encode``. This profile (on an H200) is what led to
``services/embedding/fast_tokenize.py``; see the README's embedding benchmark.

    python -m bench.services.embedding_profile --model DIR --gsm8k DIR [--batch-sizes 128,256,512]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True, help="sentence-transformers model directory")
    p.add_argument("--gsm8k", type=Path, required=True, help="directory with train.jsonl")
    p.add_argument("--batch-sizes", default="128,256,512")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    import torch
    from sentence_transformers import SentenceTransformer

    from arbiter.services.embedding.fast_tokenize import FastTokenizer

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if dev == "cuda" else torch.float32
    model = SentenceTransformer(a.model, device=dev, model_kwargs={"dtype": dtype})
    fast = FastTokenizer.for_model(model, int(model.max_seq_length or 0))
    with (a.gsm8k / "train.jsonl").open() as f:
        texts = [json.loads(line)["answer"] for line in f]

    def ms(fn: Callable[[], Any]) -> float:
        fn()  # warm-up
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.repeats):
            fn()
        if dev == "cuda":
            torch.cuda.synchronize()
        return round((time.perf_counter() - t0) / a.repeats * 1000, 2)

    for bs in (int(x) for x in a.batch_sizes.split(",")):
        batch = texts[:bs]
        feats = model.preprocess(batch)
        on_dev = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in feats.items()}

        def forward(inputs: dict[str, Any] = on_dev) -> Any:
            with torch.inference_mode():
                return model(inputs)["sentence_embedding"].float().cpu()

        tok: Any = model.tokenizer
        row = {
            "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
            "batch": bs,
            "padded_shape": list(feats["input_ids"].shape),
            "preprocess_ms": ms(partial(model.preprocess, batch)),
            "rust_encode_batch_ms": ms(partial(tok.backend_tokenizer.encode_batch, batch)),
            "fast_tokenizer_ms": ms(partial(fast, batch)) if fast else None,
            "forward_ms": ms(forward),
            "model_encode_ms": ms(partial(model.encode, batch, batch_size=len(batch))),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
