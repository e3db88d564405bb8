"""Gateway settings (``GATEWAY_*``, plus ``REDIS_URL``): read once, checked at start-up."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from arbiter.keys import DEV_SECRET
from arbiter.services.common.settings import ServiceSettings
from arbiter.services.scoring.settings import SERVICES, ComponentSettings


class GatewaySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="GATEWAY_")

    port: int = Field(default=8000, ge=1, le=65535, description="Bind port.")
    verify_url: str | None = Field(
        default="http://127.0.0.1:8001",
        description="Verify service base URL (math_accuracy, format); empty = not configured.",
    )
    embedding_url: str | None = Field(
        default=None, description="Embedding service base URL (diversity); unset = not configured."
    )
    judge_url: str | None = Field(
        default=None,
        description="Judge service base URL (judge_quality, judge_verifier); unset = off.",
    )
    sandbox_url: str | None = Field(
        default=None,
        description="Sandbox service base URL (code_tests, python_grader); unset = off.",
    )
    envs_url: str | None = Field(
        default=None,
        description="Envs service base URL (`arbiter serve envs`): the environments at /ors "
        "and /nemo-gym/envs; unset = not configured.",
    )
    envs_timeout_s: float = Field(
        default=300.0,
        gt=0,
        le=3600,
        description="Deadline of one call to the envs service (a tool call that runs code "
        "in the sandbox included).",
    )
    envs_tool_calls_per_minute: int = Field(
        default=600,
        ge=0,
        le=10_000_000,
        description="Environments quota: tool calls per minute per team, an episode opened "
        "counting as one (auth on); 0 = no limit.",
    )
    envs_sandbox_cpu_s_per_minute: float = Field(
        default=300.0,
        ge=0,
        le=10_000_000,
        description="Environments quota: sandbox CPU seconds per minute per team that tool "
        "calls may use (charged after each call, as the envs service reports it); 0 = no limit.",
    )
    recipes_file: Path | None = Field(
        default=None, description="YAML file with extra recipes (added to the built-in ones)."
    )
    component_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Deadline of one component call, queueing included.",
    )
    component_timeouts: dict[str, float] = Field(
        default_factory=lambda: {
            "judge_quality": 120.0,
            "judge_verifier": 60.0,
            "code_tests": 300.0,
            "python_grader": 300.0,
        },
        description='Per-component overrides as JSON, e.g. {"judge_quality": 120}.',
    )
    component_urls: dict[str, str] = Field(
        default_factory=dict,
        description='Per-component base-URL overrides as JSON, e.g. {"format": "http://fmt:8001"}: '
        "serve one component from its own deployment.",
    )
    connect_timeout_s: float = Field(default=2.0, gt=0, le=60, description="TCP connect timeout.")
    max_concurrency: int = Field(
        default=64, ge=1, le=4096, description="In-flight calls per component service."
    )
    team_concurrency: int = Field(
        default=32,
        ge=1,
        le=4096,
        description="In-flight calls per component service of one team (at most "
        "max_concurrency): below it, another team's call never waits for a slot.",
    )
    batch_groups: int = Field(
        default=64, ge=1, le=1024, description="At most this many groups per component call."
    )
    batch_responses: int = Field(
        default=512, ge=1, le=65536, description="At most this many responses per component call."
    )
    redis_url: str | None = Field(
        default=None,
        validation_alias="REDIS_URL",
        description="REDIS_URL (no prefix): Redis cache; unset = in-process LRU.",
    )
    state_redis_url: str | None = Field(
        default=None,
        description="Redis of the teams' state (usage ledger, quotas, idempotency keys): "
        "noeviction and AOF, apart from the LRU cache so cache pressure evicts none of it. "
        "Unset = REDIS_URL (one Redis for a small deployment).",
    )
    redis_timeout_s: float = Field(
        default=0.5, gt=0, le=30, description="Redis socket/operation timeout."
    )
    redis_max_connections: int = Field(default=64, ge=1, le=10_000)
    redis_retry_s: float = Field(
        default=1.0, ge=0, le=300, description="After a Redis error, bypass it for this long."
    )
    cache_enabled: bool = Field(default=True, description="false: no caching at all.")
    cache_ttl_s: int = Field(default=7 * 24 * 3600, ge=1, description="Cache entry lifetime.")
    cache_lru_size: int = Field(
        default=100_000, ge=1, description="Entries of the in-process LRU (when no REDIS_URL)."
    )
    # Sample-level routes (/v1/compat/...): samples of one prompt that arrive together are
    # scored as one group, so group components (diversity) see the group.
    compat_window_ms: float = Field(
        default=20.0,
        ge=0,
        le=60_000,
        description="/v1/compat/*: how long the first sample of a (recipe, prompt, reference) "
        "waits for the rest of its group before the group is scored (?window_ms= per request).",
    )
    compat_max_window_ms: float = Field(
        default=30_000.0,
        ge=0,
        le=600_000,
        description="/v1/compat/*: the largest ?window_ms= a caller may ask for.",
    )
    compat_max_group: int = Field(
        default=64,
        ge=1,
        le=256,
        description="/v1/compat/*: a group is scored as soon as it holds this many samples "
        "(or the caller's ?group_size=, if smaller).",
    )
    compat_null_reward: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="/v1/compat/*: the value a score that could not be computed becomes "
        "(marked masked); unset = such a sample is answered with an error (?null_reward=).",
    )
    # Teams (docs/operations/teams.md): API keys, quotas, usage, cache scope, idempotency.
    environment: Literal["development", "production"] = Field(
        default="development",
        description="production: with auth on (GATEWAY_KEYS_FILE), refuse the development "
        "GATEWAY_KEY_SECRET and short secrets (compose and k8s set production).",
    )
    keys_file: Path | None = Field(
        default=None,
        description="Keys file written by `arbiter keys` (in k8s a mounted Secret): every "
        "/v1/* call needs Authorization: Bearer <key>. Unset or empty = no auth (every caller is "
        "team anonymous). Changes are picked up without a restart.",
    )
    key_secret: SecretStr = Field(
        default=SecretStr(DEV_SECRET),
        description="Server secret of the keys' HMAC; `arbiter keys` must use the same one "
        "(it reads GATEWAY_KEY_SECRET too). At least 32 characters in production.",
    )
    keys_reload_s: float = Field(
        default=2.0, ge=0.1, le=3600, description="How often the keys file is checked for changes."
    )
    idempotency_ttl_s: int = Field(
        default=24 * 3600,
        ge=60,
        le=30 * 24 * 3600,
        description="How long a response is kept for a retry with the same Idempotency-Key.",
    )
    idempotency_team_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        le=64 * 1024 * 1024 * 1024,
        description="Bytes of stored Idempotency-Key answers a team may hold in the state "
        "Redis; a new answer past it drops the team's oldest stored answers (an answer larger "
        "than the whole budget is not stored). Other teams' answers are never touched.",
    )
    idempotency_wait_s: float = Field(
        default=30.0,
        ge=0,
        le=600,
        description="A duplicate of a request still in flight waits this long for it, then "
        "answers 409 idempotency_in_flight.",
    )
    usage_retention_days: int = Field(
        default=400, ge=1, le=3660, description="How long a team's daily usage is kept in Redis."
    )
    quota_replicas: int = Field(
        default=1,
        ge=1,
        le=10_000,
        description="Gateway replicas (pods) sharing the quotas: while Redis cannot be reached, "
        "each process enforces 1 / (this x GATEWAY_PROCESSES) of every team's quota on its own.",
    )
    quota_wait_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="How long a team's quota check waits for its turn at Redis (a quarter of "
        "GATEWAY_REDIS_MAX_CONNECTIONS per team); past it: 429 quota_busy, Retry-After 1.",
    )

    @field_validator(
        "verify_url", "embedding_url", "judge_url", "sandbox_url", "envs_url", mode="before"
    )
    @classmethod
    def _url(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if not isinstance(value, str) or not value.startswith(("http://", "https://")):
            raise ValueError(
                f"{value!r} is not an http(s) URL; set e.g. GATEWAY_VERIFY_URL=http://127.0.0.1:8001"
            )
        return value.rstrip("/")

    @field_validator("redis_url", mode="before")
    @classmethod
    def _redis(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(
                f"REDIS_URL={value!r} is not a Redis URL; use redis://HOST:PORT/DB or unset it"
            )
        return value

    @field_validator("state_redis_url", mode="before")
    @classmethod
    def _state_redis(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(
                f"GATEWAY_STATE_REDIS_URL={value!r} is not a Redis URL; use "
                "redis://HOST:PORT/DB or unset it (then REDIS_URL holds the state too)"
            )
        return value

    @property
    def state_url(self) -> str | None:
        """The Redis of ledgers, quotas and idempotency keys: its own, else REDIS_URL's."""
        return self.state_redis_url or self.redis_url

    @field_validator("recipes_file")
    @classmethod
    def _recipes_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(
                f"GATEWAY_RECIPES_FILE={value} does not exist; point it at a YAML file or unset it"
            )
        return value

    @field_validator("component_urls")
    @classmethod
    def _component_urls(cls, value: dict[str, str]) -> dict[str, str]:
        from arbiter.services.scoring.recipes import COMPONENTS

        out = {}
        for name, url in value.items():
            if name not in COMPONENTS:
                raise ValueError(
                    f"GATEWAY_COMPONENT_URLS names unknown component {name!r}; "
                    f"known: {', '.join(COMPONENTS)}"
                )
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"GATEWAY_COMPONENT_URLS[{name!r}]={url!r} is not an http(s) URL")
            out[name] = url.rstrip("/")
        return out

    @field_validator("keys_file", mode="before")
    @classmethod
    def _no_keys_file(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value  # empty = off

    @field_validator("keys_file")
    @classmethod
    def _keys_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(
                f"GATEWAY_KEYS_FILE={value} does not exist; create it with "
                f"`arbiter keys create --team NAME --file {value}` or unset it (no auth)"
            )
        return value

    @model_validator(mode="after")
    def _auth(self) -> GatewaySettings:
        if self.keys_file is not None and self.state_url is None:
            raise ValueError(
                "GATEWAY_KEYS_FILE needs REDIS_URL: quotas, usage and idempotency live in Redis, "
                "shared by every gateway replica"
            )
        # The secret is used only with keys (auth on): without a keys file there is nothing
        # to refuse, so a local run needs no secret (docker compose's default).
        secret = self.key_secret.get_secret_value()
        unsafe = secret == DEV_SECRET or len(secret) < 32
        if self.keys_file is not None and self.environment != "development" and unsafe:
            raise ValueError(
                "GATEWAY_KEY_SECRET is the development default or shorter than 32 characters; "
                "outside development (GATEWAY_ENVIRONMENT) set a random one, e.g. "
                "`openssl rand -hex 32`, and create keys with the same one"
            )
        return self

    @model_validator(mode="after")
    def _timeouts(self) -> GatewaySettings:
        from arbiter.services.scoring.recipes import COMPONENTS

        for name, seconds in self.component_timeouts.items():
            if name not in COMPONENTS:
                raise ValueError(
                    f"GATEWAY_COMPONENT_TIMEOUTS names unknown component {name!r}; "
                    f"known: {', '.join(COMPONENTS)}"
                )
            if not 0 < seconds <= 3600:
                raise ValueError(
                    f"GATEWAY_COMPONENT_TIMEOUTS[{name!r}]={seconds} must be in (0, 3600]"
                )
        return self

    def service_url(self, service: str) -> str | None:
        return {
            "verify": self.verify_url,
            "embedding": self.embedding_url,
            "judge": self.judge_url,
            "sandbox": self.sandbox_url,
        }[service]

    def components(self) -> ComponentSettings:
        """What the scoring core reads of these settings (its component client's URLs,
        deadlines, slots and batch sizes)."""
        urls = {s: url for s in SERVICES if (url := self.service_url(s)) is not None}
        return ComponentSettings(
            service_urls=urls,
            component_urls=self.component_urls,
            component_timeout_s=self.component_timeout_s,
            component_timeouts=self.component_timeouts,
            connect_timeout_s=self.connect_timeout_s,
            max_concurrency=self.max_concurrency,
            team_concurrency=self.team_concurrency,
            batch_groups=self.batch_groups,
            batch_responses=self.batch_responses,
        )


@lru_cache(maxsize=1)
def get_settings() -> GatewaySettings:
    return GatewaySettings()
