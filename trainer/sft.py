"""Warm start for the learning demonstration: generated arithmetic word problems + a short SFT.

A random-init model cannot earn a single GRPO reward, so the GPU demonstration first teaches
a small Qwen2-shaped model (a few million parameters, the tokenizer of
``arbiter.tiny_model``) the answer format on problems this module generates, in GSM8K's
shape (``{"question", "answer": "...#### N"}``; the references are always correct), e.g.

    Q: Tom has 12 apples and buys 7 more. Then Tom gives away 5. How many apples does Tom have?
    A: <think>12 + 7 = 19. 19 - 5 = 14.</think><answer>14</answer>

Numbers are small (sums of two numbers up to 20, products of digits) so that a few-million
parameter model learns the arithmetic in a short SFT pass. A short pass leaves a model that
writes the format but is unsure of its sums, yet often finds the right answer among several
samples: what GRPO through the gateway, rewarded by the verify service, can turn into
accuracy. ``slip_rate`` > 0 instead plants a misconception in that share of the
demonstrations (see ``write_dataset``), a much easier task for GRPO, kept for comparison.
Prompts are rendered exactly as the trainer renders them (``trainer.data.chat_messages`` +
the chat template). Measured accuracies and learning runs:
bench/results/experiments/trainer_notes.md.

    python -m arbiter.trainer.sft data OUT_DIR [--train 20000 --test 500 --slip-rate 0.6]
    python -m arbiter.trainer.sft train OUT_MODEL_DIR --data DATA_DIR [--steps 2500 ...]
    python -m arbiter.trainer.sft demo OUT_DIR   # the CPU demo: data + tiny model + warm start
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arbiter.trainer.data import held_out_split, write_gsm8k_splits

log = logging.getLogger(__name__)

NAMES = ["Tom", "Sara", "Ali", "Mia", "Ben", "Lena", "Omar", "Kim", "Raj", "Eva", "Leo", "Ana"]
DEMO_SFT_STEPS = 90  # the CPU demo's warm start: format sometimes, answers rarely right
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "coins", "cards"]


@dataclass(frozen=True)
class ArithProblem:
    question: str
    steps: list[str]  # "a + b = c" lines for the <think> block
    answer: int
    slip_steps: list[str] | None = None  # the misconception's working (None: no slip)
    slip_answer: int | None = None

    def gsm8k_row(self) -> dict[str, str]:
        return {
            "question": self.question,
            "answer": "\n".join(self.steps) + f"\n#### {self.answer}",
        }

    def target(self, slip: bool = False) -> str:
        """The completion the SFT pass teaches (EOS appended later); ``slip``: the misconception."""
        steps, answer = self.steps, self.answer
        if slip and self.slip_steps is not None:
            steps, answer = self.slip_steps, int(self.slip_answer or 0)
        return f"<think>{' '.join(x + '.' for x in steps)}</think><answer>{answer}</answer>"


def _add(rng: random.Random, name: str, item: str) -> ArithProblem:
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    q = f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?"
    return ArithProblem(q, [f"{a} + {b} = {a + b}"], a + b)


def _sub(rng: random.Random, name: str, item: str) -> ArithProblem:
    a = rng.randint(10, 30)
    b = rng.randint(2, a - 2)
    q = f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} are left?"
    return ArithProblem(q, [f"{a} - {b} = {a - b}"], a - b, [f"{a} + {b} = {a + b}"], a + b)


def _mul(rng: random.Random, name: str, item: str) -> ArithProblem:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    q = f"{name} buys {b} boxes with {a} {item} in each box. How many {item} does {name} buy?"
    return ArithProblem(q, [f"{b} * {a} = {a * b}"], a * b, [f"{b} + {a} = {a + b}"], a + b)


def _two_step(rng: random.Random, name: str, item: str) -> ArithProblem:
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    c = rng.randint(2, a + b - 2)
    q = (
        f"{name} has {a} {item} and buys {b} more. Then {name} gives away {c}. "
        f"How many {item} does {name} have?"
    )
    steps = [f"{a} + {b} = {a + b}", f"{a + b} - {c} = {a + b - c}"]
    return ArithProblem(q, steps, a + b - c, [f"{a} + {b} = {a + b}"], a + b)


KINDS: list[Callable[[random.Random, str, str], ArithProblem]] = [_add, _sub, _mul, _two_step]


def make_problem(rng: random.Random) -> ArithProblem:
    return rng.choice(KINDS)(rng, rng.choice(NAMES), rng.choice(ITEMS))


def write_dataset(
    out_dir: Path,
    n_train: int = 20000,
    n_test: int = 500,
    seed: int = 0,
    n_valid: int = 200,
    slip_rate: float = 0.0,
) -> Path:
    """train/valid/test.jsonl in GSM8K's format (correct references, for GRPO and evaluation);
    no test or valid question appears elsewhere. Also sft.jsonl: {question, target}, the
    demonstrations for the warm start, where a share ``slip_rate`` of the subtraction,
    multiplication and two-step problems shows a misconception (adds instead of subtracting or
    multiplying; stops after the first step): imperfect demonstrations that a verifier's
    reward can correct."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    train, valid, test = held_out_split(rng, make_problem, n_train, n_test, n_valid)
    write_gsm8k_splits(out_dir, {"train": train, "valid": valid, "test": test})
    with (out_dir / "sft.jsonl").open("w") as f:
        for p in train:
            slip = rng.random() < slip_rate
            f.write(json.dumps({"question": p.question, "target": p.target(slip)}) + "\n")
    return out_dir


Example = tuple[list[int], list[int], list[int]]  # prompt ids, target ids + EOS, loss mask


def _examples(data_dir: Path, tokenizer: Any, limit: int) -> list[Example]:
    """(prompt ids, target ids + EOS, loss mask) triples, prompts rendered as the trainer
    renders them. A row with ``segments`` (``trainer.tooluse``) is a multi-turn
    demonstration: its prompt is the environment's first message (``env``), each segment is
    tokenised on its own as ``trainer.env.multi_turn`` tokenises a trajectory, and the
    environment's observations (``train`` false) get no loss."""
    from arbiter.trainer.data import Problem, chat_messages, render_prompt
    from arbiter.trainer.env import make_env

    marker = "\x00QUESTION\x00"  # render the chat template once, then substitute
    template = render_prompt(tokenizer, chat_messages(marker))
    env_templates: dict[str, str] = {}
    eos = tokenizer.eos_token_id
    out: list[Example] = []
    with (data_dir / "sft.jsonl").open() as f:
        for i, line in enumerate(f):
            if limit and i >= limit:
                break
            row = json.loads(line)
            if "segments" not in row:
                prompt = template.replace(marker, row["question"])
                target = tokenizer(row["target"], add_special_tokens=False)["input_ids"]
                out.append((tokenizer(prompt, add_special_tokens=False)["input_ids"],
                            [*target, eos], [1] * (len(target) + 1)))  # fmt: skip
                continue
            env = row.get("env", "calculator")
            if env not in env_templates:
                first = make_env(env).reset(Problem(id="", question=marker, reference=""))
                env_templates[env] = render_prompt(tokenizer, [{"role": "user", "content": first}])
            prompt = env_templates[env].replace(marker, row["question"])
            ids: list[int] = []
            mask: list[int] = []
            for seg in row["segments"]:
                seg_ids = tokenizer(seg["text"], add_special_tokens=False)["input_ids"]
                ids += seg_ids
                mask += [int(bool(seg["train"]))] * len(seg_ids)
            out.append((tokenizer(prompt, add_special_tokens=False)["input_ids"],
                        [*ids, eos], [*mask, 1]))  # fmt: skip
    return out


def build_base(
    out_dir: Path, corpus_dir: Path | None, *, hidden: int, layers: int, heads: int, seed: int
) -> Path:
    """Tokenizer (arbiter.tiny_model's) + a random-init Qwen2 of the given shape."""
    from arbiter.tiny_model import build

    return build(out_dir, corpus_dir, hidden=hidden, layers=layers, heads=heads, seed=seed)


def train_sft(
    model_dir: Path,
    data_dir: Path,
    out_dir: Path,
    *,
    steps: int = 300,
    batch_size: int = 64,
    lr: float = 1e-3,
    warmup: int = 30,
    seed: int = 0,
    device: str = "auto",
    limit: int = 0,
    stop_at_accuracy: float | None = None,
    check_every: int = 0,
) -> dict[str, Any]:
    """Teacher-forced cross-entropy on the target tokens only; saves model + tokenizer.

    ``check_every``: measure greedy accuracy on ``valid.jsonl`` every so many steps (0: never);
    ``stop_at_accuracy``: stop once it reaches this (the learning rate is then constant after
    warm-up instead of decaying linearly to 10 %).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))  # fmt: skip
    tok = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = model.to(dev)
    model.train()
    examples = _examples(data_dir, tok, limit or steps * batch_size)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    if stop_at_accuracy is None:
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.1, 1 - s / max(1, steps))
        )
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    pad = tok.pad_token_id
    t0 = time.perf_counter()
    losses: list[tuple[int, float]] = []
    checks: list[tuple[int, float]] = []
    for step in range(steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        length = max(len(p) + len(t) for p, t, _ in batch)
        ids = torch.full((batch_size, length), pad, dtype=torch.long)
        labels = torch.full((batch_size, length), -100, dtype=torch.long)
        attn = torch.zeros((batch_size, length), dtype=torch.long)
        for i, (p, t, m) in enumerate(batch):  # right padding: positions start at 0 per row
            seq = p + t
            ids[i, : len(seq)] = torch.tensor(seq)
            attn[i, : len(seq)] = 1
            # observation tokens (mask 0) stay in context but are not learned
            labels[i, len(p) : len(seq)] = torch.tensor(
                [x if k else -100 for x, k in zip(t, m, strict=True)]
            )
        ids, labels, attn = ids.to(dev), labels.to(dev), attn.to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0 or step == steps - 1:
            losses.append((step, round(float(loss.detach()), 4)))
            log.info("sft step %d loss %.4f", step, float(loss.detach()))
        if check_every and (step + 1) % check_every == 0:
            model.eval()
            acc = greedy_accuracy(model, tok, data_dir, 200, split="valid")
            model.train()
            checks.append((step + 1, acc))
            log.info("sft step %d valid greedy accuracy %.3f", step + 1, acc)
            if stop_at_accuracy is not None and acc >= stop_at_accuracy:
                break
    elapsed = time.perf_counter() - t0
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    n_params = sum(p.numel() for p in model.parameters())
    return {"steps": step + 1, "batch_size": batch_size, "lr": lr, "seconds": round(elapsed, 1),
            "losses": losses, "valid_accuracy": checks, "params": n_params,
            "device": str(dev)}  # fmt: skip


def answers_right(
    model: Any,
    tokenizer: Any,
    problems: list[Any],
    *,
    repeats: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 48,
    generator: Any = None,
) -> list[list[bool]]:
    """Per problem, ``repeats`` completions (greedy at temperature 0): is the ``<answer>``
    value exactly the reference? A local check, without the verify service."""
    import re

    from arbiter.trainer.data import chat_messages, render_prompt
    from arbiter.trainer.generation import SamplingParams, sample

    prompts = [render_prompt(tokenizer, chat_messages(p.question)) for p in problems]
    tokenizer.padding_side = "left"
    dev = next(model.parameters()).device
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    params = SamplingParams.for_tokenizer(
        tokenizer, max_new_tokens, temperature=temperature, generator=generator
    )
    ids, _ = sample(
        model,
        enc["input_ids"].to(dev).repeat_interleave(repeats, 0),
        enc["attention_mask"].to(dev).repeat_interleave(repeats, 0),
        params,
    )
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    hits = []
    for i, t in enumerate(texts):
        m = re.search(r"<answer>\s*(-?\d+)\s*</answer>", t)
        hits.append(bool(m and m.group(1) == problems[i // repeats].reference))
    return [hits[i * repeats : (i + 1) * repeats] for i in range(len(problems))]


def greedy_accuracy(
    model: Any,
    tokenizer: Any,
    data_dir: Path,
    n: int = 200,
    max_new_tokens: int = 48,
    split: str = "test",
) -> float:
    """Quick local check (exact match of the <answer> value), without the verify service."""
    from arbiter.trainer.data import load_problems

    problems = load_problems(data_dir / f"{split}.jsonl", n)
    right = answers_right(model, tokenizer, problems, max_new_tokens=max_new_tokens)
    return sum(r[0] for r in right) / len(problems)


def demo(out_dir: Path, *, sft_steps: int = DEMO_SFT_STEPS, seed: int = 0) -> dict[str, Any]:
    """The CPU demo's warm start: OUT/data (generated problems, GSM8K's format) and OUT/model,
    the smallest model (hidden 64, 2 layers) after a very short supervised pass: it writes
    the answer format only some of the time and is rarely right, so GRPO through the gateway
    (configs/cpu-demo.yaml) has a reward that visibly rises in a couple of minutes."""
    import torch

    if torch.get_num_threads() > 2:
        torch.set_num_threads(2)
    data = write_dataset(out_dir / "data", n_train=4000, n_test=200, n_valid=50, seed=seed)
    base = build_base(out_dir / "base", data, hidden=64, layers=2, heads=1, seed=seed)
    info = train_sft(base, data, out_dir / "model", steps=sft_steps, batch_size=16, lr=3e-3,
                     warmup=10, seed=seed, device="cpu")  # fmt: skip
    return {"data": str(data), "model": str(out_dir / "model"), **info}


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="write train/test jsonl of generated problems")
    d.add_argument("out_dir", type=Path)
    d.add_argument("--train", type=int, default=20000)
    d.add_argument("--test", type=int, default=500)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--slip-rate", type=float, default=0.0, help="misconception share in sft.jsonl")
    t = sub.add_parser("train", help="build the small model and run the supervised pass")
    t.add_argument("out_dir", type=Path)
    t.add_argument("--data", type=Path, required=True)
    t.add_argument("--corpus", type=Path, default=None, help="GSM8K dir for the tokenizer corpus")
    t.add_argument("--hidden", type=int, default=256)
    t.add_argument("--layers", type=int, default=4)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--steps", type=int, default=2500)
    t.add_argument("--batch-size", type=int, default=64)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--seed", type=int, default=0)
    m = sub.add_parser("demo", help="the CPU demo: data + tiny model + a short warm start")
    m.add_argument("out_dir", type=Path)
    m.add_argument("--sft-steps", type=int, default=DEMO_SFT_STEPS)
    a = p.parse_args(argv)
    if a.cmd == "demo":
        info = demo(a.out_dir, sft_steps=a.sft_steps)
        print(json.dumps({k: info[k] for k in ("data", "model", "steps", "seconds", "losses")}))
        return
    if a.cmd == "data":
        print(write_dataset(a.out_dir, a.train, a.test, a.seed, slip_rate=a.slip_rate))
        return
    base = build_base(a.out_dir.with_name(a.out_dir.name + "-base"), a.corpus,
                      hidden=a.hidden, layers=a.layers, heads=a.heads, seed=a.seed)  # fmt: skip
    info = train_sft(base, a.data, a.out_dir, steps=a.steps, batch_size=a.batch_size, lr=a.lr,
                     seed=a.seed)  # fmt: skip
    print(json.dumps(info))


if __name__ == "__main__":
    main()
