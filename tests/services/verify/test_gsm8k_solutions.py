"""GSM8K behaviour: OpenAI's 5,276 labelled model solutions of the GSM8K test set
(``data/gsm8k_model_solutions.jsonl.gz``, 4 models × 1,319 problems) score 1.0 exactly when
they are labelled correct."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from arbiter.services.verify.scoring import score_math_direct

DATA = Path(__file__).with_name("data") / "gsm8k_model_solutions.jsonl.gz"


def test_every_labelled_solution_agrees() -> None:
    with gzip.open(DATA, "rt") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 5276
    wrong = []
    for row in rows:
        score = score_math_direct(row["solution"], row["gold"]).score
        if (score == 1.0) != row["is_correct"]:
            wrong.append((row["gold"], row["solution"][-80:], row["is_correct"], score))
    assert not wrong, f"{len(wrong)} disagree, e.g. {wrong[:3]}"
