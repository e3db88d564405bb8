"""Cache keys carry a component's scoring version: after a scoring fix (``ComponentSpec.version``
bumped) a score cached by the old code is never served, while every unchanged component keeps
the keys it had (no cache lost at an upgrade). A group's metadata (python_grader's per-row
data) is in its keys; a group without keeps the keys it had."""

from __future__ import annotations

import dataclasses
import hashlib

from arbiter.proto.gateway import Recipe, RecipeComponent, ScoreGroup
from arbiter.services.scoring.cache import KEY_PREFIX, cache_keys
from arbiter.services.scoring.recipes import BoundComponent, RecipeBook

GROUP = ScoreGroup(prompt="p", reference="r", responses=["a", "b"])


def test_version_one_keys_are_unchanged_and_a_bumped_version_gets_new_ones() -> None:
    math, _format = RecipeBook().get("gsm8k").components
    keys = cache_keys(math, GROUP)
    # version 1: the name alone, as before versions existed
    assert math.spec.version == 1 and all(
        k.startswith(f"{KEY_PREFIX}:math_accuracy:") for k in keys
    )
    bumped = dataclasses.replace(math, spec=dataclasses.replace(math.spec, version=2))
    new = cache_keys(bumped, GROUP)
    assert all(k.startswith(f"{KEY_PREFIX}:math_accuracy.v2:") for k in new)
    assert not set(new) & set(keys)  # no old score can be read under the new version
    assert cache_keys(bumped, GROUP, team="a")[0].startswith(
        f"{KEY_PREFIX}:team:a:math_accuracy.v2:"
    )


def test_code_tests_is_at_version_three_after_the_dataset_conventions() -> None:
    # v2: plain-value asserts; v3: body-only completions and usage-example blocks run
    (code,) = RecipeBook().get("code").components
    assert code.spec.version == 3
    assert cache_keys(code, GROUP)[0].startswith(f"{KEY_PREFIX}:code_tests.v3:")


def test_python_grader_is_at_version_two_after_the_score_range() -> None:
    grader = _grader()
    assert grader.spec.version == 2
    assert cache_keys(grader, GROUP)[0].startswith(f"{KEY_PREFIX}:python_grader.v2:")


def _grader() -> BoundComponent:
    source = "def grade(sample, item):\n    return 1.0\n"
    recipe = Recipe(components=[RecipeComponent(name="python_grader", params={"source": source})])
    (bound,) = RecipeBook().get(recipe).components
    return bound


def _old_key(comp: BoundComponent, group: ScoreGroup, text: str) -> str:
    """The key as it was before groups had metadata."""

    def lp(value: str) -> bytes:
        return b"%d:" % len(value.encode()) + value.encode()

    h = hashlib.sha256(lp(comp.spec.cache_name) + lp(comp.params_json) + lp(group.prompt))
    h.update(b"N" if group.reference is None else b"R" + lp(group.reference))
    h.update(text.encode())
    return f"{KEY_PREFIX}:{comp.spec.cache_name}:{h.hexdigest()}"


def test_a_group_without_metadata_keeps_its_keys() -> None:
    grader = _grader()
    assert cache_keys(grader, GROUP) == [_old_key(grader, GROUP, t) for t in GROUP.responses]


def test_metadata_is_in_the_key_whatever_its_key_order() -> None:
    grader = _grader()
    one = GROUP.model_copy(update={"metadata": {"a": 1, "b": [2]}})
    same = GROUP.model_copy(update={"metadata": {"b": [2], "a": 1}})
    other = GROUP.model_copy(update={"metadata": {"a": 2, "b": [2]}})
    keys = cache_keys(grader, one)
    assert keys == cache_keys(grader, same)  # the same object, written in another order
    assert not set(keys) & set(cache_keys(grader, other))
    assert not set(keys) & set(cache_keys(grader, GROUP))


def test_a_response_cannot_spell_another_groups_metadata() -> None:
    # were the metadata hashed after the reference, this response text would give the key of
    # the group with metadata {"a":1} and response "X": a score planted in the shared cache
    grader = _grader()
    meta = '{"a":1}'
    spelled = ScoreGroup(prompt="p", reference="r", responses=[f"M{len(meta)}:{meta}X"])
    real = ScoreGroup(prompt="p", reference="r", responses=["X"], metadata={"a": 1})
    assert cache_keys(grader, spelled) != cache_keys(grader, real)
