"""The tool-use warm start's data: references right, the calculator demonstrated in the share
asked for, each demonstration's observations exactly what the environment answers, and the
supervised pass learning the policy's tokens only, on the prompt the trainer renders."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from arbiter.calculator import evaluate
from arbiter.trainer import tooluse
from arbiter.trainer.data import Problem, load_problems, render_prompt
from arbiter.trainer.env import CalculatorEnv
from arbiter.trainer.sft import _examples


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tooluse.write_dataset(tmp_path_factory.mktemp("tool"), 2000, 50, n_valid=20)


def test_problems_and_references(data: Path) -> None:
    train = load_problems(data / "train.jsonl")
    test = load_problems(data / "test.jsonl")
    assert len(train) == 2000 and len(test) == 50
    assert not {p.question for p in test} & {p.question for p in train}  # held out
    rng = random.Random(1)
    for _ in range(200):
        p = tooluse.make_problem(rng)
        assert evaluate(p.expression) == p.answer  # one expression computes the answer
        assert all(evaluate(op) == v for op, v in p.ops)
        assert p.answer >= 100  # beyond a head for small sums


def test_the_calculator_is_shown_in_a_minority_and_answers_as_the_environment(data: Path) -> None:
    rows = [json.loads(x) for x in (data / "sft.jsonl").read_text().splitlines()]
    tool = [r for r in rows if len(r["segments"]) > 1]
    # the default share, within 3 standard errors of 2,000 draws
    assert abs(len(tool) / len(rows) - tooluse.TOOL_SHARE) < 3 * (0.2 * 0.8 / 2000) ** 0.5
    env = CalculatorEnv()
    for r in tool:
        segs = r["segments"]
        # policy and environment alternate, the environment's turns exactly its answers
        assert [s["train"] for s in segs] == [i % 2 == 0 for i in range(len(segs))]
        for action, obs in zip(segs[::2], segs[1::2], strict=False):
            step = env.step(action["text"], eos=False)
            assert step.tool_call and obs["text"] == step.observation
        answer = segs[-1]["text"]
        assert answer.startswith("</think><answer>") and "error" not in json.dumps(segs)


def test_sft_learns_the_policy_tokens_only(data: Path, tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(tiny_model)
    rows = [json.loads(x) for x in (data / "sft.jsonl").read_text().splitlines()[:40]]
    examples = _examples(data, tok, 40)
    for row, (prompt, target, mask) in zip(rows, examples, strict=True):
        first = CalculatorEnv().reset(Problem(id="", question=row["question"], reference=""))
        assert tok.decode(prompt) == render_prompt(tok, [{"role": "user", "content": first}])
        want_ids: list[int] = []
        want_mask: list[int] = []
        for s in row["segments"]:  # each segment tokenised alone, as multi_turn does
            ids = tok(s["text"], add_special_tokens=False)["input_ids"]
            want_ids += ids
            want_mask += [int(s["train"])] * len(ids)
        assert target == [*want_ids, tok.eos_token_id] and mask == [*want_mask, 1]
