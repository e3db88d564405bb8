"""What the client sends, checked before it is sent: the body of ``POST /v1/score``, and
whether a gateway's recipe list can serve a recipe. Invalid input raises ``Unprocessable``
(an ``ArbiterError`` naming the field, as the gateway's 422 would), never pydantic's
``ValidationError``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from arbiter.errors import MAX_MESSAGE_CHARS, ArbiterError, NotConfigured, Unprocessable
from arbiter.proto.gateway import Recipe, RecipeList, ScoreGroup, ScoreRequest

RecipeArg = str | Recipe | dict[str, Any]
GroupArg = ScoreGroup | dict[str, Any]
Model = TypeVar("Model", bound=BaseModel)


def score_body(
    groups: Sequence[GroupArg], recipe: RecipeArg, on_error: str = "mask"
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/score``, validated here so bad input fails before sending
    (``Unprocessable`` naming the field, as the gateway would answer)."""
    req = validated(
        ScoreRequest,
        {
            "recipe": recipe.model_dump() if isinstance(recipe, Recipe) else recipe,
            "groups": [g.model_dump() if isinstance(g, ScoreGroup) else g for g in groups],
            "on_error": on_error,
        },
    )
    return req.model_dump(mode="json", exclude_defaults=False)


def validated(model: type[Model], data: Any) -> Model:
    """``data`` as ``model``; invalid data raises ``Unprocessable`` (an ``ArbiterError``, not
    pydantic's ``ValidationError``) naming the first bad field, as the gateway's 422 does."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        message = f"{where}: {first['msg']}" if where else str(first["msg"])
        n = exc.error_count()
        more = f" (and {n - 1} more)" if n > 1 else ""
        raise Unprocessable(
            f"{message}{more}"[:MAX_MESSAGE_CHARS], param=where, code="validation_error"
        ) from None


def recipe_problem(listing: RecipeList, recipe: RecipeArg) -> ArbiterError | None:
    """Why the gateway that answered ``listing`` (``GET /v1/recipes``) cannot serve
    ``recipe``: ``NotConfigured`` (a component's service is not configured there), an
    ``Unprocessable`` (``unknown_recipe``: not on the gateway, or not for this key); None
    when it can."""
    if isinstance(recipe, str):
        found = {r.name: r for r in listing.recipes}
        if recipe not in found:
            known = ", ".join(found) or "none"
            return Unprocessable(
                f"recipe: {recipe!r} is not on the gateway for this key (it has: {known})",
                param="recipe",
                code="unknown_recipe",
            )
        info = found[recipe]
        if not info.available:
            return NotConfigured(info.reason or f"recipe {recipe!r} is not available")
        return None
    inline = recipe if isinstance(recipe, Recipe) else validated(Recipe, recipe)
    for comp in inline.components:
        why = listing.unconfigured.get(comp.name)
        if why is not None:
            return NotConfigured(f"recipe (inline): {why}")
    return None
