"""Where a model of the learning demonstration is right and wrong, by problem kind.

For each kind of generated problem (``trainer.sft``: add, sub, mul, two-step) on the held-out
split: greedy accuracy, mean sampled accuracy at the rollout temperature, and pass@k (some
of k samples right): what GRPO can sharpen (sampled < greedy), and where it has nothing to
reinforce (pass@k near 0). Exact match of the ``<answer>`` value, as ``greedy_accuracy``.

    python -m bench.arith_probe MODEL_DIR DATA_DIR [--n 400 --k 16 --temperature 1.0]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

_ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


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

    from trainer.data import chat_messages, load_problems, render_prompt
    from trainer.generation import sample

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir))
    model = model.to(dev).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    problems = load_problems(data_dir / "test.jsonl", n)
    prompts = [render_prompt(tok, chat_messages(p.question)) for p in problems]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"].to(dev), enc["attention_mask"].to(dev)
    gen = torch.Generator(dev).manual_seed(0)

    def right(temp: float, repeats: int) -> list[list[bool]]:
        out_ids, _ = sample(
            model, ids.repeat_interleave(repeats, 0), mask.repeat_interleave(repeats, 0),
            max_new_tokens=48, temperature=temp, eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id, generator=gen,
        )  # fmt: skip
        texts = tok.batch_decode(out_ids, skip_special_tokens=True)
        hits = [bool((m := _ANSWER.search(t)) and m.group(1) == problems[i // repeats].reference)
                for i, t in enumerate(texts)]  # fmt: skip
        return [hits[i * repeats : (i + 1) * repeats] for i in range(len(problems))]

    with torch.inference_mode():
        greedy, sampled = right(0.0, 1), right(temperature, k)
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
