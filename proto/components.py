"""The shape every component service speaks (``POST /v1/<component>``).

A request carries groups (one prompt, its reference, G responses) and the component's
params; the response carries one score per response, ``null`` where it could not be
computed, with an error entry naming the index and the kind. The gateway speaks this to
every component, so adding a component means adding a service, not a new protocol.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import Field

from arbiter.proto.common import ArbiterModel

MAX_GROUPS = 1024
MAX_RESPONSES = 256
MAX_TEXT_CHARS = 100_000

# Why a score is null. Retryable kinds first.
ErrorKind = Literal[
    "timeout",  # the item or the component ran past its deadline
    "unavailable",  # the component service could not be reached / returned 5xx
    "bad_response",  # the component answered something that is not the contract
    "internal",  # the component raised
    "invalid_reference",  # the reference could not be parsed into a value
    "group_too_small",  # a group-level component needs at least two responses
    "empty_response",  # the response is empty or whitespace: nothing to embed (diversity)
    "judge_parse_error",  # the judge's text held no score
    "judge_no_label",  # neither Yes nor No in the judge's top log-probs
    "judge_unsupported",  # the judge server ignored a feature the component needs
]

P = TypeVar("P", bound=ArbiterModel)


class ScoreGroup(ArbiterModel):
    """One prompt, its reference and G responses: what the gateway's caller sends and what
    the gateway forwards to a component, the same model on both hops."""

    id: str = Field(default="", max_length=256, description="Caller's id, echoed back.")
    prompt: str = Field(default="", max_length=MAX_TEXT_CHARS)
    reference: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    responses: list[str] = Field(min_length=1, max_length=MAX_RESPONSES)


class NoParams(ArbiterModel):
    pass


class ComponentRequest(ArbiterModel, Generic[P]):
    groups: list[ScoreGroup] = Field(min_length=1, max_length=MAX_GROUPS)
    params: P


class ItemError(ArbiterModel):
    index: int = Field(ge=0, description="Index of the response inside its group.")
    kind: ErrorKind
    message: str


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


class ComponentResponse(ArbiterModel):
    component: str
    groups: list[ComponentGroupResult]
    usage: ComponentUsage = Field(default_factory=ComponentUsage)


Granularity = Literal["response", "group"]
