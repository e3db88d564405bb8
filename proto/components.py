"""The shape every component service speaks (``POST /v1/<component>``).

A request carries groups (one prompt, its reference, G responses) and the component's
params; the response carries one score per response, ``null`` where it could not be
computed, with an error entry naming the index and the kind. The gateway speaks this to
every component, so adding a component means adding a service, not a new protocol.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, Field, field_validator, model_validator

from arbiter.proto.common import ArbiterModel
from arbiter.proto.errors import ItemError
from arbiter.proto.limits import (
    MAX_GROUPS,
    MAX_RESPONSES,
    MAX_TEXT_CHARS,
    check_json_depth,
    check_total_chars,
)

__all__ = ["MAX_GROUPS", "MAX_RESPONSES", "MAX_TEXT_CHARS"]  # re-exported: the contract's bounds

Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]

P = TypeVar("P", bound=ArbiterModel)


class ScoreGroup(ArbiterModel):
    """One prompt, its reference and G responses: what the gateway's caller sends and what
    the gateway forwards to a component, the same model on both hops."""

    id: str = Field(default="", max_length=256, description="Caller's id, echoed back.")
    prompt: str = Field(default="", max_length=MAX_TEXT_CHARS)
    reference: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    responses: list[Text] = Field(min_length=1, max_length=MAX_RESPONSES)
    metadata: Annotated[dict[str, Any], AfterValidator(check_json_depth)] | None = Field(
        default=None,
        description="The row's own data, a JSON object of at most "
        f"{MAX_TEXT_CHARS:,} characters: python_grader passes it to grade() as "
        "item['metadata'] (and its keys as item's own, as OpenAI's items are the dataset "
        "row); other components ignore it.",
    )

    @field_validator("metadata")
    @classmethod
    def _metadata_size(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        try:
            size = len(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError):
            raise ValueError("not plain JSON (NaN, infinity or another type)") from None
        if size > MAX_TEXT_CHARS:
            raise ValueError(f"more than {MAX_TEXT_CHARS} characters as JSON: keep it small")
        return value


class NoParams(ArbiterModel):
    pass


class ComponentRequest(ArbiterModel, Generic[P]):
    groups: list[ScoreGroup] = Field(min_length=1, max_length=MAX_GROUPS)
    params: P

    @model_validator(mode="after")
    def _total_chars(self) -> ComponentRequest[P]:
        check_total_chars(self.groups)
        return self


class ComponentGroupResult(ArbiterModel):
    id: str
    scores: list[float | None]
    errors: list[ItemError] = Field(default_factory=list)
    info: dict[str, Any] = Field(
        default_factory=dict,
        description="Component-specific notes, e.g. {'truncated': [2]} from embedding.",
    )


class ComponentUsage(ArbiterModel):
    items: int = 0
    elapsed_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cpu_ms: float = Field(
        default=0.0, ge=0, description="CPU time the component's sandboxed programs used."
    )


class ComponentResponse(ArbiterModel):
    component: str
    groups: list[ComponentGroupResult]
    usage: ComponentUsage = Field(default_factory=ComponentUsage)


Granularity = Literal["response", "group"]
