"""Recipes, fingerprints and settings: pure functions, no processes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from arbiter.errors import Unprocessable
from arbiter.proto.gateway import Recipe, RecipeComponent
from arbiter.services.gateway.settings import GatewaySettings
from arbiter.services.scoring.recipes import BUILTIN_RECIPES, RecipeBook, fingerprint
from arbiter.services.scoring.settings import ComponentSettings

# Pinned: a change here means every training run's recorded reward identity changes.
GSM8K_FINGERPRINT = "sha256:559a20ae6f6de68013acefbc081155aed86c9f0eb77c36c105aa57ad6bd398f0"


def comps(*items: tuple[str, float, dict[str, Any]]) -> list[RecipeComponent]:
    return [RecipeComponent(name=n, weight=w, params=p) for n, w, p in items]


def test_fingerprint_is_sha256_of_canonical_json() -> None:
    components = comps(("math_accuracy", 1.0, {}), ("format", 0.5, {"mode": "partial"}))
    canonical = (
        '{"components":[{"name":"math_accuracy","params":{},"weight":1.0},'
        '{"name":"format","params":{"mode":"partial"},"weight":0.5}]}'
    )
    assert fingerprint(components) == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def test_builtin_fingerprint_is_stable() -> None:
    gsm8k = RecipeBook().get("gsm8k")
    assert gsm8k.ref.fingerprint == GSM8K_FINGERPRINT
    assert RecipeBook().get("gsm8k").ref.fingerprint == GSM8K_FINGERPRINT  # a new book agrees


BASE: tuple[tuple[str, float, dict[str, Any]], ...] = (
    ("math_accuracy", 1.0, {}),
    ("format", 0.5, {}),
)


@pytest.mark.parametrize(
    ("other", "same"),
    [
        (BASE, True),  # identical components
        ((("math_accuracy", 1.0, {}), ("format", 0.5, {"mode": "partial"})), False),  # a param
        ((("math_accuracy", 1.0, {}), ("format", 0.25, {})), False),  # a weight
        ((("format", 0.5, {}), ("math_accuracy", 1.0, {})), False),  # order is part of it
        ((("math_accuracy", 1.0, {}),), False),  # a component fewer
    ],
)
def test_fingerprint_changes_with_the_recipe(other: tuple[Any, ...], same: bool) -> None:
    assert (fingerprint(comps(*BASE)) == fingerprint(comps(*other))) is same


def test_param_key_order_does_not_matter() -> None:
    a = comps(("format", 1.0, {"mode": "partial", "think_optional": True}))
    b = comps(("format", 1.0, {"think_optional": True, "mode": "partial"}))
    assert fingerprint(a) == fingerprint(b)


def test_inline_recipe_shares_the_named_fingerprint() -> None:
    book = RecipeBook()
    inline = Recipe(components=BUILTIN_RECIPES[0].components)
    assert book.get(inline).ref.fingerprint == book.get("gsm8k").ref.fingerprint
    assert book.get(inline).ref.name == "inline"


def test_builtin_recipes() -> None:
    got = {r.name: [(c.name, c.weight) for c in r.components] for r in RecipeBook().refs()}
    assert got == {
        "gsm8k": [("math_accuracy", 1.0), ("format", 0.5)],
        "gsm8k-diverse": [("math_accuracy", 1.0), ("format", 0.5), ("diversity", 0.3)],
        "gsm8k-dj": [("math_accuracy", 1.0), ("format", 0.5), ("judge_quality", 0.3)],
        "gsm8k-verifier": [("judge_verifier", 1.0), ("format", 0.2)],
        "code": [("code_tests", 1.0)],
        "code-all": [("code_tests", 1.0)],  # params {"mode": "all"}
    }


@pytest.mark.parametrize(
    ("recipe", "param"),
    [
        # a component name the registry does not know
        ({"components": [{"name": "maths"}]}, "recipe.components.0.name"),
        # the same component twice (its scores would collide in `components`)
        ({"components": [{"name": "format"}, {"name": "format"}]}, "recipe.components.1.name"),
        # a verify param checked against proto.verify.FormatParams at the gateway
        ({"components": [{"name": "format", "params": {"mode": "x"}}]},
         "recipe.components.0.params.mode"),
        # an unknown verify param (the wire models forbid extras)
        ({"components": [{"name": "math_accuracy", "params": {"tol": 1}}]},
         "recipe.components.0.params.tol"),
        # a typo in a judge param (proto.judge.QualityParams): refused at the gateway, not
        # forwarded to the judge service
        ({"components": [{"name": "format"},
                         {"name": "judge_quality", "params": {"rubricc": "x"}}]},
         "recipe.components.1.params.rubricc"),
        # a judge param out of range (QualityParams.scale is 2..10)
        ({"components": [{"name": "judge_quality", "params": {"scale": 1}}]},
         "recipe.components.0.params.scale"),
        # a judge_verifier param of the wrong type (VerifierParams.show_reference is a bool)
        ({"components": [{"name": "judge_verifier", "params": {"show_reference": "maybe"}}]},
         "recipe.components.0.params.show_reference"),
        # British spelling of a diversity param (proto.embedding.DiversityParams.normalize)
        ({"components": [{"name": "diversity", "params": {"normalise": "none"}}]},
         "recipe.components.0.params.normalise"),
        # a diversity value outside its Literal
        ({"components": [{"name": "diversity", "params": {"normalize": "minmax"}}]},
         "recipe.components.0.params.normalize"),
    ],
)  # fmt: skip
def test_bad_inline_recipe_names_the_field(recipe: dict[str, Any], param: str) -> None:
    with pytest.raises(Unprocessable) as info:
        RecipeBook().get(Recipe.model_validate(recipe))
    assert info.value.param == param


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("math_accuracy", {"rel_tolerance": 1e-3}),
        ("format", {"mode": "partial", "think_optional": True}),
        ("judge_quality", {"rubric": "Rate it 1..{scale}.", "scale": 10, "max_tokens": 64}),
        ("judge_verifier", {"top_logprobs": 20, "constrain_labels": False}),
        ("diversity", {"normalize": "group_zscore"}),
    ],
)
def test_every_components_params_are_accepted(name: str, params: dict[str, Any]) -> None:
    recipe = RecipeBook().get(Recipe(components=comps((name, 1.0, params))))
    assert recipe.components[0].params == params  # forwarded as given (fingerprint input)


def test_unknown_recipe_name() -> None:
    with pytest.raises(Unprocessable) as info:
        RecipeBook().get("gsm9k")
    assert info.value.param == "recipe" and "gsm9k" in info.value.message


def write(tmp_path: Path, doc: Any) -> Path:
    path = tmp_path / "recipes.yaml"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))  # JSON is YAML
    return path


def test_yaml_recipes_load(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "recipes:\n"
        "  - name: gsm8k-partial\n"
        "    components:\n"
        "      - {name: math_accuracy, weight: 1.0}\n"
        "      - {name: format, weight: 0.5, params: {mode: partial}}\n",
    )
    book = RecipeBook(path)
    got = book.get("gsm8k-partial")
    assert [c.name for c in got.ref.components] == ["math_accuracy", "format"]
    assert got.ref.components[1].params == {"mode": "partial"}
    assert book.get("gsm8k").ref.fingerprint == GSM8K_FINGERPRINT  # built-ins still there


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ("recipes: [", "cannot read YAML"),  # not YAML
        ({"recipe": []}, "list under 'recipes:'"),  # wrong top-level key
        ({"recipes": [{"components": [{"name": "format"}]}]}, "needs a name"),  # no name
        ({"recipes": [{"name": "gsm8k", "components": [{"name": "format"}]}]},
         "redefines 'gsm8k'"),  # a built-in cannot be replaced
        ({"recipes": [{"name": "x", "components": [{"name": "nope"}]}]},
         "recipes[0].components.0.name"),  # unknown component, with its place
        ({"recipes": [{"name": "x", "components": [{"name": "format", "weight": "w"}]}]},
         "recipes[0]"),  # wrong type
        ({"recipes": [{"name": "x", "components": [
            {"name": "judge_quality", "params": {"rubricc": "x"}}]}]},
         "recipes[0].components.0.params.rubricc"),  # a judge param typo fails the start
        ({"recipes": [{"name": "x", "components": [
            {"name": "diversity", "params": {"normalize": "l2"}}]}]},
         "recipes[0].components.0.params.normalize"),  # a bad diversity value too
    ],
)  # fmt: skip
def test_bad_yaml_fails_with_where(tmp_path: Path, doc: Any, needle: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        RecipeBook(write(tmp_path, doc))
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"GATEWAY_VERIFY_URL": "127.0.0.1:8001"}, "not an http(s) URL"),  # scheme missing
        ({"REDIS_URL": "localhost:6379"}, "not a Redis URL"),  # scheme missing
        ({"GATEWAY_RECIPES_FILE": "/nonexistent.yaml"}, "does not exist"),  # missing file
        ({"GATEWAY_COMPONENT_TIMEOUTS": '{"jduge_quality": 5}'}, "unknown component"),  # typo
        ({"GATEWAY_COMPONENT_TIMEOUTS": '{"format": 0}'}, "must be in (0, 3600]"),  # zero
        ({"GATEWAY_COMPONENT_URLS": '{"format": "fmt:8001"}'}, "not an http(s) URL"),
        ({"GATEWAY_MAX_CONCURRENCY": "0"}, "max_concurrency"),  # out of range
    ],
)
def test_bad_settings_fail_fast(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], needle: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError) as info:
        GatewaySettings()
    assert needle in str(info.value)


def test_settings_defaults_and_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")  # no GATEWAY_ prefix
    monkeypatch.setenv("GATEWAY_JUDGE_URL", "")  # empty = not configured
    s = GatewaySettings()
    assert s.port == 8000 and s.redis_url == "redis://127.0.0.1:6379/0"
    assert s.judge_url is None and s.components().timeout_for("judge_quality") == 120.0


def test_component_settings_are_the_gateways() -> None:
    # What the scoring core reads, from the gateway's settings: the services it has a URL
    # for, the overrides, and the slots and batch sizes; the core's own defaults are the
    # gateway's (the envs service takes them for what it does not set).
    s = GatewaySettings(
        verify_url="http://v:1/", judge_url="", component_urls={"format": "http://f:2"}
    )
    c = s.components()
    assert c.service_urls == {"verify": "http://v:1"}
    assert c.component_url("format", "verify") == "http://f:2"
    assert c.component_url("math_accuracy", "verify") == "http://v:1"
    assert c.service_url("judge") is None
    defaults = ComponentSettings()
    for name in (
        "connect_timeout_s",
        "max_concurrency",
        "team_concurrency",
        "batch_groups",
        "batch_responses",
        "component_timeout_s",
    ):
        assert getattr(c, name) == getattr(defaults, name), name


def test_metric_label_is_the_name_of_a_named_recipe_only() -> None:
    # An inline recipe's name is whatever the caller sent: as a label it would let a
    # caller grow the metrics without bound.
    book = RecipeBook()
    assert book.get("gsm8k").label == "gsm8k"
    inline = Recipe(name="anything-at-all", components=[RecipeComponent(name="format")])
    assert book.get(inline).label == "inline"
