"""Gateway: the public ``POST /v1/score``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from arbiter.proto.common import ArbiterModel
from arbiter.proto.components import MAX_GROUPS, ScoreGroup
from arbiter.proto.errors import ErrorKind
from arbiter.proto.limits import MAX_WEIGHT, check_json_depth, check_total_chars

# Free-form JSON (a component's params before the gateway checks them against the
# component's own model), bounded in depth.
JsonObject = Annotated[dict[str, Any], AfterValidator(check_json_depth)]


class RecipeComponent(ArbiterModel):
    name: str = Field(description="Component name, e.g. 'math_accuracy'.")
    weight: float = Field(
        default=1.0,
        ge=-MAX_WEIGHT,
        le=MAX_WEIGHT,
        allow_inf_nan=False,
        description="Finite and bounded, so a weighted sum of component scores is finite.",
    )
    params: JsonObject = Field(default_factory=dict)
    grader: JsonObject | None = Field(
        default=None,
        exclude_if=lambda v: v is None,  # absent, not null, from every other component
        description="An OpenAI grader's JSON (string_check, text_similarity, python, "
        "score_model, label_model, multi; docs/services/graders.md): the component is that "
        "grader, `name` is its name in the answer and `params` must be empty.",
    )


CacheScope = Literal["team", "shared"]


class Recipe(ArbiterModel):
    name: str = Field(default="inline", max_length=128)
    components: list[RecipeComponent] = Field(min_length=1, max_length=16)
    cache: CacheScope = Field(
        default="team",
        description="team: cached scores are seen by the caller's team only; shared: by "
        "every team that scores the same inputs with a shared recipe of the same "
        "components. Not part of the fingerprint (it changes no score).",
    )


class ScoreRequest(ArbiterModel):
    recipe: str | Recipe = Field(description="A named recipe or an inline one.")
    groups: list[ScoreGroup] = Field(min_length=1, max_length=MAX_GROUPS)
    on_error: Literal["mask", "fail"] = Field(
        default="mask",
        description="mask: null + mask + error entry; fail: the whole request fails "
        "(503/504) when a component fails. A component this gateway has not configured "
        "is refused before any work in both modes (422 component_not_configured).",
    )

    @model_validator(mode="after")
    def _total_chars(self) -> ScoreRequest:
        check_total_chars(self.groups)
        return self


class RecipeRef(ArbiterModel):
    name: str
    fingerprint: str = Field(description="sha256 of the recipe's canonical JSON.")
    components: list[RecipeComponent]
    cache: CacheScope = "team"


class ScoreError(ArbiterModel):
    component: str
    index: int
    kind: ErrorKind
    message: str


class GroupScore(ArbiterModel):
    id: str
    rewards: list[float | None]
    components: dict[str, list[float | None]]
    masked: list[bool]
    errors: list[ScoreError] = Field(default_factory=list)
    info: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Per-component notes (e.g. truncation)."
    )


class ScoreUsage(ArbiterModel):
    responses: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    judge_prompt_tokens: int = 0
    judge_completion_tokens: int = 0
    sandbox_cpu_ms: int = Field(
        default=0,
        description="CPU milliseconds the sandbox's programs used (code_tests, "
        "python_grader); cached scores cost none.",
    )
    elapsed_ms: float = 0.0


class ScoreResponse(ArbiterModel):
    recipe: RecipeRef
    groups: list[GroupScore]
    usage: ScoreUsage


class RecipeInfo(RecipeRef):
    """A named recipe as ``GET /v1/recipes`` lists it: whether this deployment can serve it."""

    available: bool = Field(
        default=True,
        description="false: a component's service is not configured on this gateway; a "
        "scoring call with this recipe is refused (422 component_not_configured).",
    )
    reason: str | None = Field(
        default=None,
        description="Why not available: the component and service missing, and how to add "
        "it (the refusal's message). null when available.",
    )


class RecipeList(ArbiterModel):
    recipes: list[RecipeInfo]
    unconfigured: dict[str, str] = Field(
        default_factory=dict,
        description="Components whose service this gateway has not configured, each with "
        "why and how to add it: any recipe that uses one, named or inline, is refused "
        "(422 component_not_configured).",
    )
