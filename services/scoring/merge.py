"""Step 5: write what the component calls answered back into the plan; weigh the rewards.

Each score goes to exactly the response indices its text stood for. A component's answer
is checked against the contract as it is merged: a wrong number of groups or scores, or a
non-finite score, becomes a null with ``bad_response``; a null the component did not
explain gets ``bad_response`` too, so every null carries a reason. A refused param
(an ``InvalidRequest`` from the fan-out) is the caller's error: the whole request fails
with 422 naming it. Successful scores become new cache entries; a null never does (a
component answers null ``timeout`` for anything a deadline decided: docs/operations/
fairness.md), nor a score that comes with an error entry for its index.

``weigh`` makes the rewards: the weighted sums, null when any weighted component of that
response is null (a zero-weight component never nulls a reward) or when the sum is not
finite (an error entry says so; ``render`` files it under component ``reward``), so every
body is strict JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from arbiter.errors import ArbiterError, InvalidRequest, Unprocessable
from arbiter.proto.components import ComponentResponse, ScoreGroup
from arbiter.services.scoring.fanout import CallResult
from arbiter.services.scoring.misses import Call
from arbiter.services.scoring.plan import ComponentScores, Item


@dataclass
class Merged:
    writes: list[tuple[str, str]] = field(default_factory=list)  # new cache entries
    failures: list[ArbiterError] = field(default_factory=list)  # calls that failed as a whole
    prompt_tokens: int = 0  # the judge's, billed to the caller
    completion_tokens: int = 0
    cpu_ms: float = 0.0  # the sandbox's programs', billed to the caller


def merge(comps: list[ComponentScores], calls: list[Call], results: list[CallResult]) -> Merged:
    out = Merged()
    for call, result in zip(calls, results, strict=True):
        comp = call.comp
        if isinstance(result, ArbiterError):
            if isinstance(result, InvalidRequest):
                raise refused_params(comps.index(comp), result)
            out.failures.append(result)
            for item in call.items:
                comp.fail(item, result.kind, result.message)
            continue
        service = comp.bound.spec.service
        if service in ("judge", "graders"):  # embedding reports tokens too; not billed
            out.prompt_tokens += result.usage.prompt_tokens
            out.completion_tokens += result.usage.completion_tokens
        if service in ("sandbox", "graders"):  # a grader's: its python graders' CPU
            out.cpu_ms += result.usage.cpu_ms
        _merge_one(comp, call.items, result, out.writes)
    return out


def refused_params(i: int, refusal: InvalidRequest) -> Unprocessable:
    """The caller's error for params component ``i`` refused, as its service (or the grader)
    answered them (``param``: ``params.<field>`` or ``grader``; ``message``: prefixed with
    it): the one place the recipe's field is named."""
    param = f"recipe.components.{i}.{refusal.param}"
    message = refusal.message.removeprefix(f"{refusal.param}: ")
    return Unprocessable(f"{param}: {message}", param=param, code="invalid_params")


def _merge_one(
    comp: ComponentScores, chunk: list[Item], resp: ComponentResponse, writes: list[tuple[str, str]]
) -> None:
    name = comp.name
    if len(resp.groups) != len(chunk):
        for item in chunk:
            comp.fail(item, "bad_response", f"{name}: {len(resp.groups)} groups for {len(chunk)}")
        return
    for item, rg in zip(chunk, resp.groups, strict=True):
        if len(rg.scores) != len(item.texts):
            msg = f"{name}: {len(rg.scores)} scores for {len(item.texts)} responses"
            comp.fail(item, "bad_response", msg)
            continue
        explained: set[int] = set()
        for err in rg.errors:
            if err.index < len(item.positions):
                explained.add(err.index)
                for j in item.positions[err.index]:
                    comp.errors[item.g].append((j, err.kind, err.message))
        all_ok = True
        for u, score in enumerate(rg.scores):
            if score is not None and not math.isfinite(score):
                score = None
                explained.discard(u)
            if score is None:
                all_ok = False
                if u not in explained:
                    for j in item.positions[u]:
                        comp.errors[item.g].append((j, "bad_response", f"{name}: null, no reason"))
            elif not comp.group_level and u not in explained:
                # a score with an error entry for it (outside the contract) is not a verdict
                # to keep: served, never cached. Its notes are kept with it (the reasons a
                # test failed, the extracted answer), so a cached 0 still says why.
                note = _note(rg.info, u, len(item.texts))
                cached = json.dumps({"s": score, "i": note}) if note else repr(score)
                writes.append((item.keys[u], cached))
            for j in item.positions[u]:
                comp.scores[item.g][j] = score
                if not comp.group_level:
                    note = _note(rg.info, u, len(item.texts))
                    if note:
                        comp.notes[(item.g, j)] = note
        info = rg.info
        if info and not item.full:
            info = {**info, "sent_indices": [p[0] for p in item.positions]}
        if info:
            comp.info[item.g] = info
        if comp.group_level and all_ok and not explained:
            writes.append((item.keys[0], json.dumps({"s": rg.scores, "i": rg.info})))


def _note(info: dict[str, Any], u: int, n: int) -> dict[str, Any]:
    """Response ``u``'s share of a group's notes: each list with one entry per response."""
    return {k: v[u] for k, v in info.items() if isinstance(v, list) and len(v) == n}


def join_notes(comps: list[ComponentScores], groups: list[ScoreGroup]) -> None:
    """Where some of a group's scores came from the cache with their notes, the group's
    ``info`` lists every response's (``None`` where a response has none), so a cached
    score explains itself as a fresh one does."""
    for comp in comps:
        if comp.group_level or not comp.hit_at:
            continue
        for g, group in enumerate(groups):
            mine = [comp.notes.get((g, j)) for j in range(len(group.responses))]
            if not any((g, j) in comp.hit_at and mine[j] for j in range(len(mine))):
                continue
            names = dict.fromkeys(k for note in mine if note for k in note)
            rest = {k: v for k, v in comp.info[g].items() if k not in names and k != "sent_indices"}
            comp.info[g] = {**rest, **{k: [(n or {}).get(k) for n in mine] for k in names}}


def weigh(
    comps: list[ComponentScores], groups: list[ScoreGroup]
) -> tuple[list[list[float | None]], list[list[tuple[int, str, str]]]]:
    """(rewards, errors) per group: each response's weighted sum, or None and why."""
    weighted = [(c, c.bound.weight) for c in comps if c.bound.weight != 0]
    rewards: list[list[float | None]] = []
    errors: list[list[tuple[int, str, str]]] = []
    for g, group in enumerate(groups):
        row: list[float | None] = []
        errs: list[tuple[int, str, str]] = []
        for j in range(len(group.responses)):
            total: float | None = 0.0
            for c, w in weighted:
                s = c.scores[g][j]
                if s is None:
                    total = None
                    break
                total += w * s  # type: ignore[operator]
            if total is not None and not math.isfinite(total):
                # Bounded weights times finite scores cannot overflow, but a component may
                # answer a finite score far outside its range: null it, never send inf.
                errs.append((j, "bad_response", f"the weighted sum is not finite ({total})"))
                total = None
            row.append(total)
        rewards.append(row)
        errors.append(errs)
    return rewards, errors
