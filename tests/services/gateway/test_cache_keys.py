"""Cache keys carry a component's scoring version: after a scoring fix (``ComponentSpec.version``
bumped) a score cached by the old code is never served, while every unchanged component keeps
the keys it had (no cache lost at an upgrade)."""

from __future__ import annotations

import dataclasses

from arbiter.proto.gateway import ScoreGroup
from arbiter.services.gateway.cache import KEY_PREFIX, cache_keys
from arbiter.services.gateway.recipes import RecipeBook

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


def test_code_tests_is_at_version_two_after_the_plain_value_comparison_fix() -> None:
    (code,) = RecipeBook().get("code").components
    assert code.spec.version == 2
    assert cache_keys(code, GROUP)[0].startswith(f"{KEY_PREFIX}:code_tests.v2:")
