"""arbiter.trainer.sft: the generated problems and the warm-start demonstrations (CPU, no model)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from arbiter.trainer.data import load_problems
from arbiter.trainer.sft import KINDS, make_problem, write_dataset


def _value(expr: str) -> int:
    a, op, b = expr.split()
    return {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]


def test_references_are_correct_and_steps_add_up() -> None:
    rng = random.Random(0)
    for _ in range(400):
        p = make_problem(rng)
        for step in p.steps:  # every "a op b = c" line is true
            lhs, rhs = step.split(" = ")
            assert _value(lhs) == int(rhs), step
        assert int(p.steps[-1].split(" = ")[1]) == p.answer
        assert p.answer >= 0


@pytest.mark.parametrize(
    ("slip_rate", "low", "high"),
    [
        (0.0, 0.0, 0.0),  # all demonstrations correct
        (0.6, 0.38, 0.52),  # 60 % of the 3/4 of problems that have a misconception
    ],
)
def test_dataset_files_split_and_slip_share(
    tmp_path: Path, slip_rate: float, low: float, high: float
) -> None:
    d = write_dataset(tmp_path, n_train=2000, n_test=100, n_valid=50, slip_rate=slip_rate)
    train = load_problems(d / "train.jsonl")
    test = load_problems(d / "test.jsonl")
    valid = load_problems(d / "valid.jsonl")
    assert (len(train), len(test), len(valid)) == (2000, 100, 50)
    held = {p.question for p in test} | {p.question for p in valid}
    assert not held & {p.question for p in train}  # no held-out question is trained on
    assert len(held) == 150
    rows = [json.loads(x) for x in (d / "sft.jsonl").read_text().splitlines()]
    assert [r["question"] for r in rows] == [p.question for p in train]
    wrong = 0
    for r, p in zip(rows, train, strict=True):
        m = re.fullmatch(r"<think>.+</think><answer>(\d+)</answer>", r["target"])
        assert m, r["target"]
        wrong += m.group(1) != p.reference
    assert low <= wrong / len(rows) <= high


def test_every_kind_is_generated() -> None:
    rng = random.Random(1)
    starts = {make_problem(rng).question.split()[2] for _ in range(200)}
    assert len(KINDS) == 4 and len(starts) >= 3  # "has" / "had" / "buys" openings
