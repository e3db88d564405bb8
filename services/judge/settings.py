"""Judge settings (``JUDGE_*``): where the judge model is served and how to talk to it."""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from arbiter.services.common.settings import ServiceSettings


class JudgeSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="JUDGE_")

    port: int = Field(default=8003, ge=1, le=65535, description="Bind port.")
    base_url: str = Field(
        default="http://127.0.0.1:8010/v1",
        description="OpenAI-compatible server, up to and including /v1.",
    )
    model: str = Field(
        default="",
        description="Model name on that server; empty = the first model it lists.",
    )
    api_key: SecretStr = Field(
        default=SecretStr(""), description="Sent as 'Authorization: Bearer …' when set."
    )
    max_concurrency: int = Field(
        default=32, ge=1, le=1024, description="Most requests in flight to the judge server."
    )
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Deadline per item, retries and back-off included; past it: 'timeout'.",
    )
    connect_timeout_s: float = Field(default=5.0, gt=0, le=60)
    max_retries: int = Field(
        default=3, ge=0, le=20, description="Retries on 429, 5xx and connection errors."
    )
    backoff_s: float = Field(
        default=0.25, ge=0, le=60, description="First back-off; doubles per retry, jittered."
    )
    backoff_max_s: float = Field(default=8.0, ge=0, le=600)
    structured_output: Literal["auto", "json_schema", "none"] = Field(
        default="auto",
        description="Quality replies: json_schema = response_format json_schema; none = "
        "plain text, parsed; auto = json_schema, falling back to none if the server refuses it.",
    )
    send_thinking_switch: bool = Field(
        default=True,
        description="Send chat_template_kwargs {'enable_thinking': …} (Qwen3 on vLLM); "
        "turn off for servers or models without the switch.",
    )
    enable_thinking: bool = Field(
        default=False, description="Value of the switch: false keeps Qwen3 from thinking."
    )
    top_logprobs: int = Field(
        default=20,
        ge=5,
        le=100_000,
        description="Verifier: top log-probs to read Yes/No from (vLLM: > 20 needs "
        "--max-logprobs).",
    )
    constrain_labels: bool = Field(
        default=False,
        description="Verifier: send vLLM's structured_outputs choice [Yes, No] (vLLM only).",
    )
    cache_salt_per_team: bool = Field(
        default=True,
        description="Send each team's own cache_salt (vLLM; a keyed digest of the team, "
        "never its name): the server's prefix cache is then shared within a team only, so "
        "one team cannot tell from its calls' times that another just sent the same prompt. "
        "Turn off for servers that refuse the field.",
    )
    ready_probe_ttl_s: float = Field(
        default=300.0, ge=0, description="How long a passed log-probs probe is trusted."
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(
                f"JUDGE_BASE_URL={v!r} must be an http(s) URL such as http://127.0.0.1:8010/v1"
            )
        return v.rstrip("/")


@lru_cache(maxsize=1)
def get_settings() -> JudgeSettings:
    return JudgeSettings()
