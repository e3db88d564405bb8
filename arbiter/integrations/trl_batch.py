"""TRL's batch as Arbiter's groups: each completion a ``Row`` of text, the rows of one
group found as runs of equal prompt and reference (``spans``), and every rank's rows in
rank order (``gather``) so that a group split across ranks is scored whole. Used by the
TRL adapter (``trl.py``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from arbiter.integrations.text import completion_text, prompt_text


@dataclass(frozen=True)
class Row:
    """One completion of TRL's batch, as text; ``key`` tells rows of one group apart."""

    key: str
    prompt: str
    response: str
    reference: str | None


def rows(
    prompts: Sequence[Any], completions: Sequence[Any], references: Sequence[Any] | None
) -> list[Row]:
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if references is not None and len(references) != len(prompts):
        raise ValueError(f"{len(references)} references for {len(prompts)} completions")
    out = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ref = None if references is None or references[i] is None else str(references[i])
        key = p if isinstance(p, str) else json.dumps(p, sort_keys=True, default=str)
        out.append(Row(key + "\x00" + (ref or ""), prompt_text(p), completion_text(c), ref))
    return out


def spans(batch: Sequence[Row], num_generations: int | None) -> list[tuple[int, int]]:
    """[start, end) of each group: runs of equal prompt and reference (TRL repeats each
    prompt ``num_generations`` times in a row), cut every ``num_generations`` if given."""
    out: list[tuple[int, int]] = []
    for i, row in enumerate(batch):
        start, end = out[-1] if out else (0, 0)
        full = num_generations is not None and end - start >= num_generations
        if out and batch[start].key == row.key and not full:
            out[-1] = (start, i + 1)
        else:
            out.append((i, i + 1))
    return out


def _distributed() -> Any:
    """torch.distributed when a process group is up (torch is never imported from here)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist if dist.get_world_size() > 1 else None


def gather(local: list[Row]) -> tuple[list[Row], int]:
    """Every rank's rows in rank order, and where this rank's slice starts."""
    dist = _distributed()
    if dist is None:
        return local, 0
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    offset = sum(len(p) for p in parts[: dist.get_rank()])
    return [row for part in parts for row in part], offset
