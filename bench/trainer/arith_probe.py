"""Where a model of the learning demonstration is right and wrong, by problem kind.

For each kind of generated problem (``trainer.sft``: add, sub, mul, two-step) on the held-out
split: greedy accuracy, mean sampled accuracy at the rollout temperature, and pass@k (some
of k samples right): what GRPO can sharpen (sampled < greedy), and where it has nothing to
reinforce (pass@k near 0). Exact match of the ``<answer>`` value (``trainer.sft.answers_right``).

    python -m bench.trainer.arith_probe MODEL_DIR DATA_DIR [--n 400 --k 16 --temperature 1.0]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def kind_of(question: str) -> str:
    if "Then" in question:
        return "two_step"
    if "gave" in question:
        return "sub"
    if "boxes" in question:
        return "mul"
    return "add"


def probe(model_dir: Path, data_dir: Path, n: int, k: int, temperature: float) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arbiter.trainer.data import load_problems
    from arbiter.trainer.sft import answers_right

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir))
    model = model.to(dev).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    problems = load_problems(data_dir / "test.jsonl", n)
    gen = torch.Generator(dev).manual_seed(0)
    with torch.inference_mode():
        greedy = answers_right(model, tok, problems, generator=gen)
        sampled = answers_right(
            model, tok, problems, repeats=k, temperature=temperature, generator=gen
        )
    rows: dict[str, list[tuple[bool, float, bool]]] = defaultdict(list)
    for p, g, s in zip(problems, greedy, sampled, strict=True):
        rows[kind_of(p.question)].append((g[0], sum(s) / k, any(s)))
    rows["all"] = [r for kind in list(rows) for r in rows[kind]]
    return {
        kind: {
            "n": len(r),
            "greedy": round(sum(x[0] for x in r) / len(r), 3),
            "sampled": round(sum(x[1] for x in r) / len(r), 3),
            f"pass@{k}": round(sum(x[2] for x in r) / len(r), 3),
        }
        for kind, r in rows.items()
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("data", type=Path)
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    a = p.parse_args(argv)
    print(json.dumps(probe(a.model, a.data, a.n, a.k, a.temperature)))


if __name__ == "__main__":
    main()
