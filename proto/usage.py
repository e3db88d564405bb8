"""Gateway: ``GET /v1/usage?from=YYYY-MM-DD&to=YYYY-MM-DD``, a team's usage per UTC day."""

from __future__ import annotations

from datetime import date

from pydantic import Field

from arbiter.proto.common import ArbiterModel


class ComponentUsage(ArbiterModel):
    responses: int = Field(default=0, description="Responses this component scored (or served).")
    cache_hits: int = Field(default=0, description="Of those, scores served from the cache.")


class UsageDay(ArbiterModel):
    day: date = Field(description="The UTC day.")
    team: str
    requests: int = Field(default=0, description="Scoring requests counted (replays are not).")
    responses: int = 0
    cache_hits: int = Field(default=0, description="Component scores served from the cache.")
    cache_misses: int = Field(default=0, description="Component scores computed.")
    judge_prompt_tokens: int = Field(default=0, description="As the judge reported them.")
    judge_completion_tokens: int = 0
    sandbox_cpu_ms: int = Field(
        default=0, description="CPU milliseconds of the team's programs in the sandbox."
    )
    env_tool_calls: int = Field(
        default=0, description="Environment tool calls run (/ors, /nemo-gym/envs)."
    )
    rate_limited: int = Field(default=0, description="Requests refused by a quota (429).")
    idempotent_replays: int = Field(
        default=0, description="Stored responses served again for an Idempotency-Key."
    )
    unanswered: int = Field(
        default=0, description="Scoring requests not answered: an error, or the client left."
    )
    unanswered_responses: int = Field(
        default=0,
        description="Of those, the responses whose work had reached a component: charged "
        "to the quota (the rest were given back).",
    )
    components: dict[str, ComponentUsage] = Field(default_factory=dict)
    errors: dict[str, int] = Field(default_factory=dict, description="Null scores by kind.")


class UsageReport(ArbiterModel):
    start: date = Field(description="`from`, inclusive.")
    end: date = Field(description="`to`, inclusive.")
    days: list[UsageDay] = Field(description="One entry per team and day with any usage.")
