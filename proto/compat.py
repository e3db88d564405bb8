"""Other RL frameworks' remote-reward shapes, as the gateway's ``/v1/compat/*`` routes speak them.

Each framework posts one sample per request and reads back one number (plus, where the
framework has room for them, the components). The shapes are theirs, copied from their
client code; they are not Arbiter's own contract, which is ``POST /v1/score``:

- OpenRLHF 0.11.2, ``--reward.remote_url``: ``openrlhf/utils/agent.py``,
  ``SingleTurnAgentExecutor._fetch_rewards_via_http`` posts ``{"query", "prompts",
  "labels"}`` (lists, one sample each) and reads ``rewards``, ``scores`` (falls back to
  ``rewards``) and ``extra_logs``; every value becomes a tensor, so none may be null.
- slime, ``--rm-type remote_rm --rm-url URL``: ``slime/rollout/rm_hub/__init__.py``,
  ``remote_rm`` posts ``{"prompt", "response", "label"}`` and keeps the returned JSON as
  the sample's reward (a dict, read with ``--reward-key reward``).
- NeMo Gym 0.7.0, a resources server's ``POST /verify``: ``nemo_gym/base_resources_server.py``,
  ``BaseVerifyRequest`` (``responses_create_params``, ``response``, plus the dataset row's
  own fields) in, ``BaseVerifyResponse`` (the request echoed, ``reward``, ``mask_sample``,
  ``failure_kind``, ``failure_reason``) out; ``BaseMultiRewardVerifyResponse`` adds
  ``reward_components``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, JsonValue, model_validator
from pydantic_core import PydanticCustomError

from arbiter.proto.common import ArbiterModel
from arbiter.proto.components import MAX_RESPONSES, MAX_TEXT_CHARS, Text
from arbiter.proto.limits import check_json_depth

# Generous: a query is the prompt and the response together, both already bounded.
MAX_QUERY_CHARS = 2 * MAX_TEXT_CHARS


class OpenRLHFRequest(ArbiterModel):
    """``{"query": [prompt + response], "prompts": [prompt], "labels": [label]}``."""

    query: list[str] = Field(
        min_length=1,
        max_length=MAX_RESPONSES,
        description="Prompt and response decoded together, special tokens kept.",
    )
    prompts: list[Text] = Field(min_length=1, max_length=MAX_RESPONSES)
    labels: list[JsonValue] = Field(
        default_factory=list,
        max_length=MAX_RESPONSES,
        description="The reference of each sample (the dataset's label column); may be empty.",
    )

    _depth = model_validator(mode="before")(check_json_depth)

    @model_validator(mode="after")
    def _lengths(self) -> OpenRLHFRequest:
        n = len(self.query)
        if len(self.prompts) != n:
            raise _mismatch("prompts", f"{len(self.prompts)} items for {n} queries")
        if self.labels and len(self.labels) != n:
            raise _mismatch("labels", f"{len(self.labels)} items for {n} queries")
        for i, text in enumerate(self.query):
            if len(text) > MAX_QUERY_CHARS:
                raise _mismatch(f"query.{i}", f"longer than {MAX_QUERY_CHARS} characters")
        return self


def _mismatch(param: str, message: str) -> PydanticCustomError:
    """A whole-request check's error that names its field (``ctx.param``)."""
    return PydanticCustomError("value_error", message, {"param": param})


class OpenRLHFResponse(ArbiterModel):
    """What OpenRLHF reads; lists of the request's length, never null (they become tensors)."""

    rewards: list[float]
    scores: list[float] = Field(description="The same values as rewards.")
    extra_logs: dict[str, list[float]] = Field(
        description="Each recipe component's score, and `masked` (1.0 where the reward was "
        "filled in with null_reward because it could not be computed)."
    )


class SlimeRequest(ArbiterModel):
    """slime's ``remote_rm`` payload: one sample."""

    prompt: str | list[dict[str, JsonValue]] = Field(
        description="The prompt text, or chat messages (the last user message is scored)."
    )
    response: str = Field(max_length=MAX_TEXT_CHARS)
    label: JsonValue = Field(default=None, description="The reference, if any.")

    _depth = model_validator(mode="before")(check_json_depth)


class SlimeResponse(ArbiterModel):
    """A flat dict: read the total with ``--reward-key reward``."""

    model_config = ConfigDict(extra="allow")

    reward: float = Field(description="The recipe total.")
    masked: float = Field(
        description="1.0 when the total could not be computed and null_reward was used."
    )


class NemoGymVerifyRequest(ArbiterModel):
    """NeMo Gym's ``BaseVerifyRequest``; the dataset row's other fields ride along."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: dict[str, Any] = Field(
        description="The Responses-API request: its last user input is the prompt."
    )
    response: dict[str, Any] = Field(
        description="The Responses-API response: its output_text parts are the response."
    )

    _depth = model_validator(mode="before")(check_json_depth)


class NemoGymVerifyResponse(ArbiterModel):
    """NeMo Gym's ``BaseMultiRewardVerifyResponse``: the request echoed back, plus the reward."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: dict[str, Any]
    response: dict[str, Any]
    reward: float
    reward_components: dict[str, float] = Field(
        description="Each component that could be computed (also echoed as top-level fields)."
    )
    mask_sample: bool = Field(
        description="True when the reward could not be computed (a component failed); "
        "the reward is then null_reward (default 0.0) and not a measurement."
    )
    failure_kind: str | None = None
    failure_reason: str | None = None
