"""Warm start for tool use: arithmetic beyond the small model's head, a calculator shown rarely.

The learning benchmark's model (4.7 M parameters) learns sums of two numbers up to 20; it
cannot multiply a 3-digit number by a 2-digit one, or add three 4-digit numbers, in its head.
These problems need exactly that, in GSM8K's shape (``{"question", "answer": "...#### N"}``,
references always correct), e.g.

    Q: Tom buys 37 boxes with 416 marbles in each box. How many marbles does Tom buy?

The supervised demonstrations (``sft.jsonl``) solve most of them in the head
(``<think>37 * 416 = 15392.</think><answer>15392</answer>``: right, but not a skill the model
can learn) and a minority, ``tool_share``, with the calculator environment
(``trainer.env.CalculatorEnv``): ``<think><calc>37*416</calc>`` ends the action, the
environment appends ``<result>15392</result>``, and the model copies it into the answer. Half
of the tool demonstrations are clumsy: a guess written before the call, or one call per
operation. A warm start on them writes the head path greedily (and is mostly wrong) but
calls the calculator in about ``tool_share`` of its samples, which are mostly right: the
signal GRPO with ``env=calculator`` can turn into tool use. The same GRPO without the tool
(``env=calculator-off``: the same prompt, nothing answers) is the baseline.

A demonstration is a list of segments ``{"text", "train"}``: the policy's own text
(``train`` true) and the environment's observations (false: in context, no loss), each
tokenised on its own, as ``trainer.env.multi_turn`` tokenises a trajectory.

    python -m arbiter.trainer.tooluse data OUT_DIR [--tool-share 0.2]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from arbiter.trainer.data import held_out_split, write_gsm8k_splits
from arbiter.trainer.env import CALC_INSTRUCTION

NAMES = ["Tom", "Sara", "Ali", "Mia", "Ben", "Lena", "Omar", "Kim", "Raj", "Eva", "Leo", "Ana"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "coins", "cards"]
TOOL_SHARE = 0.2  # of the demonstrations that call the calculator (half of them clumsily)


@dataclass(frozen=True)
class ToolProblem:
    question: str
    ops: list[tuple[str, int]]  # ("37 * 416", 15392): one operation per step, in order
    answer: int

    @property
    def expression(self) -> str:
        """The whole computation as one calculator expression (``37*416+85``)."""
        expr = self.ops[0][0]
        for op, _ in self.ops[1:]:
            expr = expr + op[op.index(" ") :]  # "15392 + 85" -> "<first> + 85"
        return expr.replace(" ", "")

    def gsm8k_row(self) -> dict[str, str]:
        lines = [f"{op} = {v}" for op, v in self.ops]
        return {"question": self.question, "answer": "\n".join(lines) + f"\n#### {self.answer}"}

    def segments(self, style: str) -> list[dict[str, object]]:
        """The demonstration as (text, trained) segments; ``style``: head, tool, clumsy."""
        ans = f"</think><answer>{self.answer}</answer>"
        if style == "head":
            work = " ".join(f"{op} = {v}." for op, v in self.ops)
            return [_seg(f"<think>{work}{ans}", True)]
        if style == "tool":
            return [_seg(f"<think><calc>{self.expression}</calc>", True),
                    _seg(f"<result>{self.answer}</result>", False), _seg(ans, True)]  # fmt: skip
        if len(self.ops) == 1:  # clumsy: a guess first, then the call
            op = self.ops[0][0]
            return [_seg(f"<think>{op} = <calc>{op.replace(' ', '')}</calc>", True),
                    _seg(f"<result>{self.answer}</result>", False), _seg(ans, True)]  # fmt: skip
        segs: list[dict[str, object]] = [_seg("<think>", True)]  # clumsy: one call per step
        for op, v in self.ops:
            segs[-1]["text"] = f"{segs[-1]['text']}<calc>{op.replace(' ', '')}</calc>"
            segs += [_seg(f"<result>{v}</result>", False), _seg("", True)]
        segs[-1]["text"] = ans
        return segs


def _seg(text: str, train: bool) -> dict[str, object]:
    return {"text": text, "train": train}


def _product(rng: random.Random, name: str, item: str) -> ToolProblem:
    a, b = rng.randint(12, 99), rng.randint(102, 999)
    q = f"{name} buys {a} boxes with {b} {item} in each box. How many {item} does {name} buy?"
    return ToolProblem(q, [(f"{a} * {b}", a * b)], a * b)


def _sums(rng: random.Random, name: str, item: str) -> ToolProblem:
    a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
    c = rng.randint(100, a + b - 100)
    q = (f"{name} has {a} {item} and gets {b} more. Then {name} gives away {c}. "
         f"How many {item} does {name} have?")  # fmt: skip
    return ToolProblem(q, [(f"{a} + {b}", a + b), (f"{a + b} - {c}", a + b - c)], a + b - c)


def _product_plus(rng: random.Random, name: str, item: str) -> ToolProblem:
    a, b, c = rng.randint(12, 99), rng.randint(12, 99), rng.randint(100, 999)
    q = (f"{name} has {c} {item} and buys {a} packs of {b} {item}. "
         f"How many {item} does {name} have now?")  # fmt: skip
    return ToolProblem(q, [(f"{a} * {b}", a * b), (f"{a * b} + {c}", a * b + c)], a * b + c)


KINDS: list[Callable[[random.Random, str, str], ToolProblem]] = [_product, _product, _sums,
                                                                  _product_plus]  # fmt: skip


def make_problem(rng: random.Random) -> ToolProblem:
    return rng.choice(KINDS)(rng, rng.choice(NAMES), rng.choice(ITEMS))


def write_dataset(
    out_dir: Path,
    n_train: int = 20000,
    n_test: int = 500,
    *,
    seed: int = 0,
    n_valid: int = 200,
    tool_share: float = TOOL_SHARE,
) -> Path:
    """train/valid/test.jsonl (GSM8K's format; no held-out question appears in train) and
    sft.jsonl: ``{"question", "instruction", "segments"}``, a share ``tool_share`` of the
    demonstrations calling the calculator (half of those clumsily), the rest in the head."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    train, valid, test = held_out_split(rng, make_problem, n_train, n_test, n_valid)
    write_gsm8k_splits(out_dir, {"train": train, "valid": valid, "test": test})
    with (out_dir / "sft.jsonl").open("w") as f:
        for p in train:
            u = rng.random()
            style = "head" if u >= tool_share else ("tool" if u < tool_share / 2 else "clumsy")
            row = {"question": p.question, "instruction": CALC_INSTRUCTION,
                   "segments": p.segments(style)}  # fmt: skip
            f.write(json.dumps(row) + "\n")
    return out_dir


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="write train/valid/test/sft jsonl")
    d.add_argument("out_dir", type=Path)
    d.add_argument("--train", type=int, default=20000)
    d.add_argument("--test", type=int, default=500)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--tool-share", type=float, default=TOOL_SHARE)
    a = p.parse_args(argv)
    print(write_dataset(a.out_dir, a.train, a.test, seed=a.seed, tool_share=a.tool_share))


if __name__ == "__main__":
    main()
