"""The scoring steps one at a time, table-driven: plan, lookup, misses, merge (and the
weighted rewards), render. Pure functions on the gateway's own types; the in-process LRU
cache stands in for Redis where a step reads the cache (the same ``Cache`` protocol)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from arbiter.errors import ArbiterError, InvalidRequest, Timeout, Unavailable, Unprocessable
from arbiter.proto.components import ComponentGroupResult, ComponentResponse, ScoreGroup
from arbiter.proto.errors import ItemError
from arbiter.proto.gateway import Recipe, RecipeComponent, ScoreResponse
from arbiter.services.gateway.render import render
from arbiter.services.gateway.usage import tally
from arbiter.services.scoring.cache import LRUCache
from arbiter.services.scoring.fanout import CallResult
from arbiter.services.scoring.lookup import lookup
from arbiter.services.scoring.merge import Merged, merge, weigh
from arbiter.services.scoring.misses import call, chunks, misses
from arbiter.services.scoring.plan import ComponentScores, plan
from arbiter.services.scoring.recipes import ResolvedRecipe, resolve
from arbiter.services.scoring.scoring import Scored


def recipe(*comps: tuple[str, float]) -> ResolvedRecipe:
    return resolve(
        Recipe(components=[RecipeComponent(name=n, weight=w, params={}) for n, w in comps])
    )


def group(*responses: str, prompt: str = "p", reference: str | None = "4") -> ScoreGroup:
    return ScoreGroup(id="g", prompt=prompt, reference=reference, responses=list(responses))


MATH = recipe(("math_accuracy", 1.0))
MATH_FORMAT = recipe(("math_accuracy", 1.0), ("format", 0.5))
DIVERSE = recipe(("diversity", 1.0))

# --- plan -----------------------------------------------------------------------------

PLAN_CASES = [
    # one key per response for a response-level component, per component
    (MATH_FORMAT, [group("a", "b", "c")], None, [3, 3]),
    # a group-level component has one key for the whole ordered group
    (DIVERSE, [group("a", "b", "c")], None, [1]),
    # two groups: keys per group
    (MATH, [group("a"), group("b", "c")], "team-x", [1, 2]),
]


@pytest.mark.parametrize(("rec", "groups", "team", "key_counts"), PLAN_CASES)
def test_plan_has_a_table_and_keys_per_component(
    rec: ResolvedRecipe, groups: list[ScoreGroup], team: str | None, key_counts: list[int]
) -> None:
    comps = plan(rec, groups, team)
    assert [c.name for c in comps] == [b.spec.name for b in rec.components]
    assert [len(k) for c in comps for k in c.keys] == key_counts
    for comp in comps:
        assert comp.scores == [[None] * len(g.responses) for g in groups]  # all unfilled


def test_plan_keys_are_per_team_unless_shared() -> None:
    groups = [group("a")]
    team_a = plan(MATH, groups, "a")[0].keys
    assert team_a != plan(MATH, groups, "b")[0].keys  # teams never share an entry
    assert team_a != plan(MATH, groups, None)[0].keys  # nor with the shared space
    assert team_a == plan(MATH, groups, "a")[0].keys  # the same inputs, the same key


# --- lookup ---------------------------------------------------------------------------


def _group_entry(scores: list[float | None]) -> str:
    return json.dumps({"s": scores, "i": {"note": 1}})


LOOKUP_CASES = [
    # a response-level score in the cache fills its index; the other stays a miss
    (MATH, ("a", "b"), {0: "1.0"}, [[1.0, None]], 1),
    # an entry that is not a number is a miss, not an error
    (MATH, ("a", "b"), {0: "not a float"}, [[None, None]], 0),
    # a group entry of the group's length fills every index at once
    (DIVERSE, ("a", "b"), {0: _group_entry([0.2, 0.3])}, [[0.2, 0.3]], 2),
    # a group entry of the wrong length (or with a null) is a miss
    (DIVERSE, ("a", "b"), {0: _group_entry([0.2])}, [[None, None]], 0),
    (DIVERSE, ("a", "b"), {0: _group_entry([0.2, None])}, [[None, None]], 0),
]


@pytest.mark.parametrize(("rec", "texts", "stored", "want", "hits"), LOOKUP_CASES)
async def test_lookup_fills_hits_and_counts_them(
    rec: ResolvedRecipe,
    texts: tuple[str, ...],
    stored: dict[int, str],
    want: list[list[float | None]],
    hits: int,
) -> None:
    groups = [group(*texts)]
    comps = plan(rec, groups)
    cache = LRUCache(100, 60)
    await cache.set_many([(comps[0].keys[0][i], v) for i, v in stored.items()])
    await lookup(cache, {}, comps, groups)
    assert comps[0].scores == want
    assert comps[0].hits == hits == len(comps[0].hit_at)


async def test_lookup_sees_this_process_pending_writes() -> None:
    groups = [group("a")]
    comps = plan(MATH, groups)
    await lookup(LRUCache(10, 60), {comps[0].keys[0][0]: "0.0"}, comps, groups)
    assert comps[0].scores == [[0.0]]  # not yet in the cache, answered all the same


# --- misses and chunks ------------------------------------------------------------------

MISSES_CASES = [
    # nothing cached, no duplicate: one item, indices as given (full)
    (MATH, ("a", "b"), {}, [(["a", "b"], [[0], [1]], True)]),
    # the same text twice is sent once and stands for both indices
    (MATH, ("a", "b", "a"), {}, [(["a", "b"], [[0, 2], [1]], False)]),
    # a cached index is not sent again
    (MATH, ("a", "b"), {0: 1.0}, [(["b"], [[1]], False)]),
    # everything cached: no item at all
    (MATH, ("a",), {0: 1.0}, []),
    # a group-level component is sent the whole group, duplicates included
    (DIVERSE, ("a", "a"), {}, [(["a", "a"], [[0], [1]], True)]),
]


@pytest.mark.parametrize(("rec", "texts", "filled", "want"), MISSES_CASES)
def test_misses_dedupe_within_a_group(
    rec: ResolvedRecipe,
    texts: tuple[str, ...],
    filled: dict[int, float],
    want: list[tuple[list[str], list[list[int]], bool]],
) -> None:
    groups = [group(*texts)]
    comp = plan(rec, groups)[0]
    for j, score in filled.items():
        comp.scores[0][j] = score
    items = misses(comp, groups)
    assert [(it.texts, it.positions, it.full) for it in items] == want


CHUNK_CASES = [
    # (texts per item, max groups, max responses) -> items per chunk
    ([1, 1, 1], 2, 100, [2, 1]),  # the group bound
    ([3, 3, 3], 10, 6, [2, 1]),  # the response bound
    ([9], 10, 4, [1]),  # an item larger than the bound is never split
    ([], 4, 4, []),  # nothing to send
]


@pytest.mark.parametrize(("sizes", "groups_max", "responses_max", "want"), CHUNK_CASES)
def test_chunks_respect_both_bounds(
    sizes: list[int], groups_max: int, responses_max: int, want: list[int]
) -> None:
    groups = [group(*(f"t{g}-{j}" for j in range(n))) for g, n in enumerate(sizes)]
    comp = plan(MATH, groups)[0]
    items = misses(comp, groups)
    assert [len(c) for c in chunks(items, groups_max, responses_max)] == want


def test_call_body_is_the_component_request() -> None:
    groups = [group("a", "a", "b")]
    comp = plan(MATH, groups)[0]
    c = call(comp, misses(comp, groups), groups)
    body = json.loads(c.body)
    assert body == {
        "groups": [{"id": "g", "prompt": "p", "reference": "4", "responses": ["a", "b"]}],
        "params": {},
    }


# --- merge ------------------------------------------------------------------------------


def _answer(*groups: ComponentGroupResult, tokens: int = 0) -> ComponentResponse:
    r = ComponentResponse(component="x", groups=list(groups))
    r.usage.prompt_tokens = tokens
    return r


def _one(scores: list[float | None], errors: list[ItemError] | None = None) -> CallResult:
    return _answer(ComponentGroupResult(id="g", scores=scores, errors=errors or []))


MERGE_CASES: list[tuple[str, tuple[str, ...], Any, list[float | None], list[tuple[int, str]]]] = [
    # a score fills every index its text stood for (the duplicate too)
    ("dedupe", ("a", "b", "a"), _one([1.0, 0.0]), [1.0, 0.0, 1.0], []),
    # a null with the component's reason keeps that reason
    (
        "explained",
        ("a",),
        _one([None], [ItemError(index=0, kind="timeout", message="t")]),
        [None],
        [(0, "timeout")],
    ),
    # a null with no reason gets bad_response: every null says why
    ("unexplained", ("a",), _one([None]), [None], [(0, "bad_response")]),
    # a non-finite score is not a score
    ("infinite", ("a",), _one([math.inf]), [None], [(0, "bad_response")]),
    # the wrong number of scores or groups nulls the item
    ("short", ("a", "b"), _one([1.0]), [None, None], [(0, "bad_response"), (1, "bad_response")]),
    ("groups", ("a",), _answer(), [None], [(0, "bad_response")]),
    # a failed call nulls its items with its kind
    (
        "down",
        ("a", "b"),
        Unavailable("verify: down"),
        [None, None],
        [(0, "unavailable"), (1, "unavailable")],
    ),
    ("slow", ("a",), Timeout("verify: slow"), [None], [(0, "timeout")]),
]


@pytest.mark.parametrize(("case", "texts", "result", "want", "errors"), MERGE_CASES)
def test_merge_fills_exactly_the_indices_sent(
    case: str,
    texts: tuple[str, ...],
    result: CallResult,
    want: list[float | None],
    errors: list[tuple[int, str]],
) -> None:
    groups = [group(*texts)]
    comps = plan(MATH, groups)
    c = call(comps[0], misses(comps[0], groups), groups)
    merged = merge(comps, [c], [result])
    assert comps[0].scores == [want], case
    assert sorted((j, kind) for j, kind, _ in comps[0].errors[0]) == errors, case
    # only real scores become cache entries, one per text sent
    assert len(merged.writes) == len({t for t, s in zip(texts, want, strict=True) if s is not None})
    assert len(merged.failures) == isinstance(result, ArbiterError)


def test_merge_refused_params_fail_the_request_naming_the_field() -> None:
    groups = [group("a")]
    comps = plan(MATH_FORMAT, groups)
    calls = [call(c, misses(c, groups), groups) for c in comps]
    # as the fan-out passes a component's refusal on: its envelope, parsed
    refused = InvalidRequest("params.mode: bad", param="params.mode", code="invalid_params")
    with pytest.raises(Unprocessable) as err:
        merge(comps, calls, [_one([1.0]), refused])
    assert err.value.param == "recipe.components.1.params.mode"
    assert err.value.message == "recipe.components.1.params.mode: bad"
    assert err.value.code == "invalid_params"


# --- weigh and render -----------------------------------------------------------------

WEIGH_CASES = [
    # the weighted sum
    (MATH_FORMAT, [[1.0], [1.0]], [1.5], []),
    # any weighted null nulls the reward
    (MATH_FORMAT, [[1.0], [None]], [None], []),
    # a zero-weight component's null does not
    (recipe(("math_accuracy", 1.0), ("format", 0.0)), [[1.0], [None]], [1.0], []),
    # a finite score far outside its range overflows the sum: null, with a reason
    (
        recipe(("math_accuracy", 1e6), ("format", 1e6)),
        [[1e308], [1e308]],
        [None],
        [(0, "bad_response")],
    ),
]


@pytest.mark.parametrize(("rec", "scores", "want", "errors"), WEIGH_CASES)
def test_weigh(
    rec: ResolvedRecipe,
    scores: list[list[float | None]],
    want: list[float | None],
    errors: list[tuple[int, str]],
) -> None:
    groups = [group("a")]
    comps = plan(rec, groups)
    for comp, s in zip(comps, scores, strict=True):
        comp.scores = [s]
    rewards, errs = weigh(comps, groups)
    assert rewards == [want]
    assert [(j, kind) for j, kind, _ in errs[0]] == errors


def _scored(comps: list[ComponentScores], groups: list[ScoreGroup]) -> Scored:
    rewards, errors = weigh(comps, groups)
    merged = Merged(prompt_tokens=3, completion_tokens=4)
    return Scored(MATH_FORMAT, groups, comps, merged, rewards, errors, 0.0123)


RENDER_CASES = [
    # all scored, none from the cache
    ([[1.0, 0.0]], [[1.0, 1.0]], 0, [1.5, 0.5], []),
    # a null component masks its response and lists the reason, sorted by index
    (
        [[None, 1.0]],
        [[1.0, None]],
        1,
        [None, None],
        [("math_accuracy", 0), ("format", 1)],
    ),
]


@pytest.mark.parametrize(("math_s", "format_s", "hits", "rewards", "errors"), RENDER_CASES)
def test_render_is_the_score_response(
    math_s: list[list[float | None]],
    format_s: list[list[float | None]],
    hits: int,
    rewards: list[float | None],
    errors: list[tuple[str, int]],
) -> None:
    groups = [group("a", "b")]
    comps = plan(MATH_FORMAT, groups)
    comps[0].scores, comps[1].scores = math_s, format_s
    comps[0].hits = hits
    for comp in comps:
        for j, s in enumerate(comp.scores[0]):
            if s is None:
                comp.errors[0].append((j, "timeout", "slow"))
    out = ScoreResponse.model_validate_json(render(_scored(comps, groups)))
    g = out.groups[0]
    assert g.rewards == rewards and g.masked == [r is None for r in rewards]
    assert [(e.component, e.index) for e in g.errors] == errors
    assert out.usage.responses == 2 and out.usage.cache_hits == hits
    assert out.usage.cache_misses == 4 - hits
    assert (out.usage.judge_prompt_tokens, out.usage.judge_completion_tokens) == (3, 4)
    assert out.usage.elapsed_ms == 12.3
    assert out.recipe.fingerprint == MATH_FORMAT.ref.fingerprint


# --- the ledger's counters --------------------------------------------------------------

TALLY_CASES = [
    # the whole request: its totals, per component, per error kind
    (None, {"requests": 1, "responses": 2, "cache_hits": 1, "cache_misses": 3,
            "component:math_accuracy:responses": 2, "component:format:responses": 2,
            "component:math_accuracy:cache_hits": 1, "errors:timeout": 2,
            "judge_prompt_tokens": 3, "judge_completion_tokens": 4}),
    # one compat sample of the group: its own share
    ([(0, 1)], {"requests": 1, "responses": 1, "cache_misses": 2,
                "component:math_accuracy:responses": 1, "component:format:responses": 1,
                "errors:timeout": 2, "judge_prompt_tokens": 3, "judge_completion_tokens": 4}),
]  # fmt: skip


@pytest.mark.parametrize(("only", "want"), TALLY_CASES)
def test_tally_counts_what_the_ledger_records(
    only: list[tuple[int, int]] | None, want: dict[str, int]
) -> None:
    groups = [group("a", "b")]
    comps = plan(MATH_FORMAT, groups)
    comps[0].scores, comps[1].scores = [[1.0, None]], [[1.0, None]]
    comps[0].hits, comps[0].hit_at = 1, {(0, 0)}  # math of response 0 came from the cache
    comps[0].errors[0].append((1, "timeout", "slow"))
    comps[1].errors[0].append((1, "timeout", "slow"))
    assert dict(tally(_scored(comps, groups), only)) == want
