"""Envs service settings (environment variables ``ENVS_*``)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from arbiter.services.common.settings import ServiceSettings


class EnvsSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="ENVS_")

    port: int = Field(default=8005, ge=1, le=65535, description="Bind port.")
    state_redis_url: str = Field(
        description="Redis of the episodes' state: the gateway's state Redis "
        "(GATEWAY_STATE_REDIS_URL; noeviction, AOF), so any replica, or a restarted process, "
        "serves any call of an open episode. Required.",
    )
    verify_url: str | None = Field(
        default="http://127.0.0.1:8001",
        description="Verify service (math_accuracy, format): the math environments' rewards.",
    )
    sandbox_url: str | None = Field(
        default=None,
        description="Sandbox service (code_tests): the python and code environments; unset: "
        "those two are not offered.",
    )
    session_ttl_s: int = Field(
        default=900,
        ge=1,
        le=7 * 24 * 3600,
        description="An episode untouched (no call, prompt or ping) this long is forgotten.",
    )
    component_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=600,
        description="Deadline of one call to verify or the sandbox (queueing included).",
    )
    team_episode_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=64 * 1024,
        description="The most bytes a team's open episodes may hold in the state Redis "
        "(their tasks, mostly: a code episode's can be a few hundred KB); past it, the "
        "team's /create is 429 episodes_over_budget, and no other team's.",
    )
    call_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="A tool call's deadline, its wait behind the episode's earlier calls "
        "included (calls on one episode run one at a time; the turn is held at most this "
        "long). Past it the call answers 504 inside its stream (retryable).",
    )
    sse_keepalive_s: float = Field(
        default=10.0,
        gt=0,
        le=60,
        description="A tool call's stream sends a keep-alive comment this often while its "
        "tool runs (ORS clients give a silent stream up after 30 s).",
    )
    run_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="python: CPU seconds of one run() (one cell, in the episode's live "
        "interpreter); code: of each visible test of one run_tests().",
    )
    gsm8k_dir: Path | None = Field(
        default=None,
        description="Folder with GSM8K's train.jsonl and test.jsonl (read at start-up); "
        "unset: ARBITER_GSM8K_DIR, else ../shared/data/gsm8k beside the checkout.",
    )

    @field_validator("state_redis_url", mode="before")
    @classmethod
    def _redis(cls, value: Any) -> Any:
        if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(
                f"ENVS_STATE_REDIS_URL={value!r} is not a Redis URL; point it at the gateway's "
                "state Redis, e.g. redis://127.0.0.1:6380/0"
            )
        return value

    @field_validator("verify_url", "sandbox_url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if not isinstance(value, str) or not value.startswith(("http://", "https://")):
            raise ValueError(
                f"{value!r} is not an http(s) URL; set e.g. ENVS_SANDBOX_URL=http://127.0.0.1:8004"
            )
        return value.rstrip("/")


@lru_cache(maxsize=1)
def get_settings() -> EnvsSettings:
    return EnvsSettings()
