"""GSM8K problems, chat prompts and a deterministic per-(step, rank) batch order.

The batch for a step is a pure function of (seed, step, rank), so a resumed run sees
exactly the prompts it would have seen, with no sampler state to checkpoint.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

INSTRUCTION = (
    "Solve the math problem. Reason step by step inside <think>...</think>, then give only "
    "the final number inside <answer>...</answer>."
)


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    reference: str  # the value after '####'


def reference_of(answer: str) -> str:
    """GSM8K answer field -> the final value after ``####`` (commas dropped)."""
    if "####" not in answer:
        return answer.strip()
    return answer.split("####")[-1].strip().replace(",", "")


def load_problems(path: str | Path, limit: int = 0) -> list[Problem]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: set data_dir= to the GSM8K directory")
    problems = []
    with path.open() as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            problems.append(
                Problem(
                    id=f"{path.stem}-{i}",
                    question=row["question"],
                    reference=reference_of(row["answer"]),
                )
            )
            if limit and len(problems) >= limit:
                break
    if not problems:
        raise ValueError(f"{path} holds no problems")
    return problems


def chat_messages(
    question: str, system_prompt: str = "", instruction: str = INSTRUCTION
) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": f"{instruction}\n\n{question}"})
    return messages


def render_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """Chat template with the assistant turn opened; plain text if the tokenizer has none."""
    if getattr(tokenizer, "chat_template", None):
        return str(
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        )
    return "\n\n".join(m["content"] for m in messages) + "\n\n"


def batch_indices(
    n: int, *, seed: int, step: int, rank: int, world: int, per_rank: int
) -> list[int]:
    """Problem indices for (step, rank): epochs of seeded permutations, ranks disjoint."""
    per_step = per_rank * world
    start = step * per_step + rank * per_rank
    out = []
    for pos in range(start, start + per_rank):
        epoch, offset = divmod(pos, n)
        perm = _permutation(n, seed, epoch)
        out.append(perm[offset])
    return out


_PERMS: dict[tuple[int, int, int], list[int]] = {}


def _permutation(n: int, seed: int, epoch: int) -> list[int]:
    key = (n, seed, epoch)
    if key not in _PERMS:
        if len(_PERMS) > 4:
            _PERMS.clear()
        perm = list(range(n))
        random.Random(seed * 1_000_003 + epoch).shuffle(perm)
        _PERMS[key] = perm
    return _PERMS[key]


# ------------------------------------------------------------------ generated problem sets


class Generated(Protocol):
    @property
    def question(self) -> str: ...

    def gsm8k_row(self) -> dict[str, str]: ...


G = TypeVar("G", bound=Generated)


def held_out_split(
    rng: random.Random, make: Callable[[random.Random], G], n_train: int, n_test: int, n_valid: int
) -> tuple[list[G], list[G], list[G]]:
    """(train, valid, test) drawn from ``make``: distinct held-out questions first, then
    training problems, none of which repeats a held-out question."""
    held: dict[str, G] = {}
    while len(held) < n_test + n_valid:
        p = make(rng)
        held[p.question] = p
    test, valid = list(held.values())[:n_test], list(held.values())[n_test:]
    train: list[G] = []
    while len(train) < n_train:
        p = make(rng)
        if p.question not in held:
            train.append(p)
    return train, valid, test


def write_gsm8k_splits(out_dir: Path, splits: dict[str, list[G]]) -> None:
    """``NAME.jsonl`` in GSM8K's format for each split."""
    for name, rows in splits.items():
        with (out_dir / f"{name}.jsonl").open("w") as f:
            f.writelines(json.dumps(p.gsm8k_row()) + "\n" for p in rows)
