"""Recipes (weighted sums of components), their fingerprints, and the component registry.

A recipe's fingerprint is ``"sha256:" + sha256(canonical JSON)`` of its components
(``[{"name", "weight", "params"}]`` in recipe order, keys sorted, no whitespace). The
recipe's *name* is not part of it: the fingerprint identifies the reward function, so a
named recipe and the same components given inline share one fingerprint. Nor is its
``cache`` scope (``team`` or ``shared``): where a score may be cached changes no score.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from arbiter.errors import Unprocessable
from arbiter.proto.common import ArbiterModel
from arbiter.proto.components import Granularity, NoParams
from arbiter.proto.embedding import DiversityParams
from arbiter.proto.gateway import Recipe, RecipeComponent, RecipeRef
from arbiter.proto.judge import QualityParams, VerifierParams
from arbiter.proto.sandbox import CodeTestsParams, PythonGraderParams
from arbiter.proto.verify import FormatParams, MathParams


@dataclass(frozen=True)
class ComponentSpec:
    """Where a component lives, how it is cached (per response or per whole group), and the
    proto model its recipe params must pass (checked by the gateway, before any call)."""

    name: str
    service: str  # verify | embedding | judge | sandbox: picks GATEWAY_<SERVICE>_URL
    path: str
    granularity: Granularity
    params_model: type[ArbiterModel]
    # Bumped when the component's scores change for the same input (a scoring fix): its
    # cache entries then get new keys, so a score cached by the old code is never served.
    version: int = 1
    # A grader component's grader, validated once when its recipe is resolved (a
    # ``graders.spec`` model; None for a built-in component).
    grader: Any = field(default=None, compare=False)

    @property
    def metric_label(self) -> str:
        """Its metrics' label: its name, or ``grader`` for a grader component (whose name is
        the caller's: it must not grow the label set)."""
        return "grader" if self.service == "graders" else self.name

    @property
    def cache_name(self) -> str:
        """The name cache keys use: ``code_tests`` at version 1, ``code_tests.v2`` after
        (version 1 keeps the keys of every unchanged component as they were)."""
        return self.name if self.version == 1 else f"{self.name}.v{self.version}"


COMPONENTS: dict[str, ComponentSpec] = {
    spec.name: spec
    for spec in (
        ComponentSpec("math_accuracy", "verify", "/v1/math", "response", MathParams),
        ComponentSpec("format", "verify", "/v1/format", "response", FormatParams),
        ComponentSpec("diversity", "embedding", "/v1/diversity", "group", DiversityParams),
        ComponentSpec("judge_quality", "judge", "/v1/quality", "response", QualityParams),
        ComponentSpec("judge_verifier", "judge", "/v1/verifier", "response", VerifierParams),
        # v2: asserts compare plain values (an object whose __eq__ always says yes scored 1.0);
        # v3: the program follows the datasets' conventions (a body-only completion scored 0)
        ComponentSpec(
            "code_tests", "sandbox", "/v1/code_tests", "response", CodeTestsParams, version=3
        ),
        # v2: a grade outside params.score_range (1e308, say) is null, never a reward
        ComponentSpec(
            "python_grader",
            "sandbox",
            "/v1/python_grader",
            "response",
            PythonGraderParams,
            version=2,
        ),
    )
}


def _c(name: str, weight: float) -> RecipeComponent:
    return RecipeComponent(name=name, weight=weight, params={})


BUILTIN_RECIPES: tuple[Recipe, ...] = (
    Recipe(name="gsm8k", components=[_c("math_accuracy", 1.0), _c("format", 0.5)]),
    Recipe(
        name="gsm8k-diverse",
        components=[_c("math_accuracy", 1.0), _c("format", 0.5), _c("diversity", 0.3)],
    ),
    Recipe(
        name="gsm8k-dj",
        components=[_c("math_accuracy", 1.0), _c("format", 0.5), _c("judge_quality", 0.3)],
    ),
    Recipe(name="gsm8k-verifier", components=[_c("judge_verifier", 1.0), _c("format", 0.2)]),
    # the share of the group's tests the response's program passes
    Recipe(name="code", components=[_c("code_tests", 1.0)]),
    # 1 when every test passes, else 0
    Recipe(
        name="code-all",
        components=[RecipeComponent(name="code_tests", weight=1.0, params={"mode": "all"})],
    ),
)


MAX_ECHO_CHARS = 64  # of a caller's name quoted back in an error (a 1 MB name is not)


def echo(name: str) -> str:
    """``name`` quoted for an error message, cut to ``MAX_ECHO_CHARS``."""
    if len(name) <= MAX_ECHO_CHARS:
        return repr(name)
    return f"{name[:MAX_ECHO_CHARS]!r}… ({len(name)} characters)"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canonical(c: RecipeComponent) -> dict[str, Any]:
    body = {"name": c.name, "weight": c.weight, "params": c.params}
    if c.grader is not None:  # only then: every other recipe keeps its fingerprint
        body["grader"] = c.grader
    return body


def fingerprint(components: list[RecipeComponent]) -> str:
    body = [_canonical(c) for c in components]
    digest = hashlib.sha256(canonical_json({"components": body}).encode()).hexdigest()
    return f"sha256:{digest}"


@dataclass(frozen=True)
class BoundComponent:
    """One component of a resolved recipe: its spec, weight and canonical params."""

    spec: ComponentSpec
    weight: float
    params: dict[str, Any]
    params_json: str  # canonical: part of every cache key


@dataclass(frozen=True)
class ResolvedRecipe:
    ref: RecipeRef
    components: tuple[BoundComponent, ...]
    ref_json: dict[str, Any]  # pre-dumped for the response
    named: bool = False  # one of the book's (an inline recipe's name is the caller's)

    @property
    def label(self) -> str:
        """Its metric label: the name of a named recipe, ``inline`` for any other (a
        caller's names must not grow the label set)."""
        return self.ref.name if self.named else "inline"


def check_params(spec: ComponentSpec, params: dict[str, Any], where: str) -> None:
    """Validate ``params`` against the component's proto model; 422 naming the field.

    The models forbid unknown fields, so a typo (``rubricc``) is refused here rather than
    reaching the component service (or, worse, being silently ignored by it).
    """
    try:
        spec.params_model.model_validate(params)
    except ValidationError as exc:
        err = exc.errors()[0]
        sub = ".".join(str(p) for p in err["loc"])
        param = f"{where}.{sub}" if sub else where
        raise Unprocessable(f"{param}: {err['msg']}", param=param, code="invalid_params") from None


def grader_component(comp: RecipeComponent, at: str) -> ComponentSpec:
    """The spec of a grader component (graded in process, ``grading.py``);
    422 naming the field for a bad grader, a name a built-in component has, or params."""
    from arbiter.services.graders.spec import load  # the graders' deps load with them

    if comp.name in COMPONENTS:
        raise Unprocessable(
            f"{at}.name: {comp.name!r} is a built-in component; name the grader otherwise",
            param=f"{at}.name",
            code="invalid_grader",
        )
    if comp.params:
        raise Unprocessable(
            f"{at}.params: a grader component takes no params (its JSON is `grader`)",
            param=f"{at}.params",
            code="invalid_grader",
        )
    grader = load(comp.grader, f"{at}.grader")
    return ComponentSpec(comp.name, "graders", "", "response", NoParams, grader=grader)


def resolve(recipe: Recipe, where: str = "recipe") -> ResolvedRecipe:
    """Check a recipe against the registry; raise 422 naming the offending field."""
    bound: list[BoundComponent] = []
    seen: set[str] = set()
    for i, comp in enumerate(recipe.components):
        at = f"{where}.components.{i}"
        graded = comp.grader is not None
        spec = grader_component(comp, at) if graded else COMPONENTS.get(comp.name)
        if spec is None:
            raise Unprocessable(
                f"{at}.name: unknown component {echo(comp.name)}; known: {', '.join(COMPONENTS)}",
                param=f"{at}.name",
                code="unknown_component",
            )
        if comp.name in seen:
            raise Unprocessable(
                f"{at}.name: component {comp.name!r} appears twice in the recipe",
                param=f"{at}.name",
                code="duplicate_component",
            )
        seen.add(comp.name)
        if comp.grader is not None:
            params = comp.grader  # the grader's JSON is the component's params
        else:
            check_params(spec, comp.params, f"{at}.params")
            params = comp.params
        bound.append(BoundComponent(spec, comp.weight, params, canonical_json(params)))
    ref = RecipeRef(
        name=recipe.name,
        fingerprint=fingerprint(recipe.components),
        components=recipe.components,
        cache=recipe.cache,
    )
    return ResolvedRecipe(ref=ref, components=tuple(bound), ref_json=ref.model_dump(mode="json"))


def load_yaml(path: Path) -> list[Recipe]:
    """``recipes: [{name, components: [{name, weight, params}]}]``; errors say where."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"recipes file {path}: cannot read YAML: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("recipes"), list):
        raise ValueError(f"recipes file {path}: expected a mapping with a list under 'recipes:'")
    out = []
    for i, item in enumerate(doc["recipes"]):
        try:
            recipe = Recipe.model_validate(item)
        except ValidationError as exc:
            raise ValueError(f"recipes file {path}: recipes[{i}]: {exc}") from exc
        if "name" not in (item or {}):
            raise ValueError(f"recipes file {path}: recipes[{i}] needs a name")
        out.append(recipe)
    return out


class RecipeBook:
    """Named recipes, resolved once at start-up (a bad file fails the start, not a request)."""

    def __init__(self, recipes_file: Path | None = None):
        self._named: dict[str, ResolvedRecipe] = {}
        for recipe in BUILTIN_RECIPES:
            self._named[recipe.name] = replace(resolve(recipe), named=True)
        if recipes_file is not None:
            for i, recipe in enumerate(load_yaml(recipes_file)):
                if recipe.name in self._named:
                    raise ValueError(
                        f"recipes file {recipes_file}: recipes[{i}] redefines {recipe.name!r}; "
                        "built-in and earlier recipes cannot be replaced, pick another name"
                    )
                try:
                    resolved = resolve(recipe, where=f"recipes[{i}]")
                    self._named[recipe.name] = replace(resolved, named=True)
                except Unprocessable as exc:
                    raise ValueError(f"recipes file {recipes_file}: {exc.message}") from None

    def get(self, recipe: str | Recipe) -> ResolvedRecipe:
        if isinstance(recipe, Recipe):
            return resolve(recipe)
        found = self._named.get(recipe)
        if found is None:
            raise Unprocessable(
                f"recipe: unknown recipe {echo(recipe)}; known: {', '.join(self._named)}",
                param="recipe",
                code="unknown_recipe",
            )
        return found

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._named) | {"inline"}

    def refs(self) -> list[RecipeRef]:
        return [r.ref for r in self._named.values()]

    def named(self) -> list[ResolvedRecipe]:
        """The named recipes, built-in first, in the order they were defined."""
        return list(self._named.values())
