"""Settings base: one pydantic-settings class per service, read from the environment, fail fast.

``ServiceSettings`` carries the policy every service shares (unknown variables ignored,
settings frozen once read) and the fields ``arbiter serve`` reads: ``host``, ``port``,
``log_level``, ``access_log``, ``processes``, the limits every service enforces
before any work (``max_body_bytes``, ``max_buffered_bytes``, ``max_total_chars``) and the
per-team weights of its fair share (``team_weights``). Each
service's class sets only its ``env_prefix`` and its own port default - the one place a
service's port is written down.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from arbiter.proto.limits import MAX_TOTAL_CHARS

LogLevel = Literal["debug", "info", "warning", "error"]


class ServiceSettings(BaseSettings):
    """Fields every service has. Subclasses set ``env_prefix`` (e.g. ``VERIFY_``)."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    host: str = Field(default="127.0.0.1", description="Bind address (the images set 0.0.0.0).")
    port: int = Field(default=8000, ge=1, le=65535, description="Bind port.")
    log_level: LogLevel = Field(
        default="info",
        description="Level of the service's own and uvicorn's loggers; other libraries "
        "log at warning and above.",
    )
    processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Event-loop processes serving the port, each with its own listening "
        "socket (SO_REUSEPORT: the kernel spreads connections across them) and its own "
        "state (a verify pool, /metrics counts); `arbiter serve --workers N` overrides it.",
    )
    access_log: bool = Field(
        default=False,
        description="One log line per HTTP request (uvicorn's access log, at info level); "
        "costs CPU at high request rates.",
    )
    # Limits checked before any work (services/common/limits.py). Keep each component
    # service's at least the gateway's: the gateway forwards its callers' texts unchanged.
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        le=1024 * 1024 * 1024,
        description="Largest request body in bytes, counted while it is read; past it: 413 "
        "body_too_large.",
    )
    max_buffered_bytes: int = Field(
        default=128 * 1024 * 1024,
        ge=1024,
        le=16 * 1024 * 1024 * 1024,
        description="Most bytes of the bodies of all requests in progress together (at least "
        "max_body_bytes); past it: 429 too_busy, retryable. Bounds memory however many "
        "large bodies arrive at once.",
    )
    max_team_buffered_bytes: int | None = Field(
        default=None,
        ge=1024,
        description="Most bytes of the bodies of one team's requests in progress (the gateway "
        "knows the team once it has checked the key; unset = half of max_buffered_bytes, at "
        "least max_body_bytes); past it: 429 too_busy. One team's uploads never take the "
        "whole budget.",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="A request's body must arrive whole within this many seconds; past it: "
        "408 body_timeout (a stalled upload gives back its share of the budgets).",
    )
    max_total_chars: int = Field(
        default=MAX_TOTAL_CHARS,
        ge=1,
        le=1_000_000_000,
        description="Most characters of all the texts (prompts, references, responses, "
        "inputs) of one request; past it: 422 too_many_chars naming the text.",
    )

    team_weights: dict[str, int] = Field(
        default_factory=dict,
        description="Fair share across teams (the gateway names the team of each call): "
        'weights by team name, as JSON, e.g. {"rl-core": 2}; a team not named has weight 1. '
        "Work waiting in this service is shared by one fair-share policy, teams first, then "
        "each team's requests; a team of weight w gets w times the share of weight 1.",
    )

    @model_validator(mode="after")
    def _weights_in_range(self) -> Self:
        bad = {team: w for team, w in self.team_weights.items() if not 1 <= w <= 100}
        if bad:
            prefix = str(self.model_config.get("env_prefix", "")).upper()
            raise ValueError(
                f"{prefix}TEAM_WEIGHTS: weights must be whole numbers from 1 to 100, got {bad}"
            )
        return self

    def team_buffered_bytes(self) -> int:
        """``max_team_buffered_bytes``, or its default: half the budget, at least one body."""
        if self.max_team_buffered_bytes is not None:
            return self.max_team_buffered_bytes
        return max(self.max_body_bytes, self.max_buffered_bytes // 2)

    @model_validator(mode="after")
    def _buffered_holds_a_body(self) -> Self:
        if self.max_buffered_bytes < self.max_body_bytes:
            prefix = str(self.model_config.get("env_prefix", "")).upper()
            raise ValueError(
                f"{prefix}MAX_BUFFERED_BYTES={self.max_buffered_bytes} is less than "
                f"{prefix}MAX_BODY_BYTES={self.max_body_bytes}: no body that large could "
                "ever be received; raise it or lower MAX_BODY_BYTES"
            )
        return self
