"""Generated problem sets: held-out questions never leak into training, and the files are
GSM8K's format."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from arbiter.trainer.data import held_out_split, write_gsm8k_splits


@dataclass(frozen=True)
class Sum:
    question: str
    answer: int

    def gsm8k_row(self) -> dict[str, str]:
        return {"question": self.question, "answer": f"#### {self.answer}"}


def make(rng: random.Random) -> Sum:
    a, b = rng.randint(0, 20), rng.randint(0, 20)  # a small space: repeats are common
    return Sum(f"{a} + {b}?", a + b)


def test_held_out_questions_are_distinct_and_never_in_train() -> None:
    train, valid, test = held_out_split(random.Random(0), make, 500, 60, 40)
    assert (len(train), len(valid), len(test)) == (500, 40, 60)
    held = [p.question for p in valid + test]
    assert len(set(held)) == len(held)
    assert not {p.question for p in train} & set(held)
    # the same seed, the same split
    assert held_out_split(random.Random(0), make, 500, 60, 40) == (train, valid, test)


def test_splits_are_written_in_gsm8k_format(tmp_path: Path) -> None:
    train, valid, test = held_out_split(random.Random(1), make, 5, 3, 2)
    write_gsm8k_splits(tmp_path, {"train": train, "valid": valid, "test": test})
    rows = [json.loads(line) for line in (tmp_path / "test.jsonl").read_text().splitlines()]
    assert rows == [p.gsm8k_row() for p in test]
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        f"{n}.jsonl" for n in ("test", "train", "valid")
    ]
