"""Verify service settings (environment variables ``VERIFY_*``)."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from arbiter.services.common.settings import ServiceSettings


class VerifySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="VERIFY_")

    port: int = Field(default=8001, ge=1, le=65535, description="Bind port.")
    workers: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        description="math-verify worker processes (default: CPU count).",
    )
    deadline_s: float = Field(
        default=5.0, description="Wall-clock limit per math item; past it: null + 'timeout'."
    )
    math_verify_timeout_s: int | None = Field(
        default=None,
        description="math-verify's own timeout per parse/compare step, whole seconds "
        "(default: 80 % of deadline_s, at least 1).",
    )
    max_items: int = Field(
        default=8192,
        ge=1,
        description="Most responses in one request (all groups); past it: 413 too_many_items.",
    )
    max_chunk: int = Field(
        default=128, ge=1, le=1024, description="Most items sent to a worker in one message."
    )
    worker_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="Niceness added to the pool's workers: below the event loop, which admits "
        "requests, delivers results and enforces deadlines (measured on 2 cores: ~10 % more "
        "throughput than 0). 0: same priority.",
    )
    start_method: Literal["forkserver", "spawn"] = Field(
        default="forkserver", description="How pool workers start."
    )
    fast_path: bool = Field(
        default=True,
        description="Decide items whose both sides are plain numbers as exact rationals, "
        "without math-verify. Off: every extracted answer goes through math-verify.",
    )

    @model_validator(mode="after")
    def _check(self) -> VerifySettings:
        if not 1 <= self.workers <= 256:
            raise ValueError(f"VERIFY_WORKERS={self.workers}: set it between 1 and 256")
        if not 0.1 <= self.deadline_s <= 600:
            raise ValueError(
                f"VERIFY_DEADLINE_S={self.deadline_s}: set it between 0.1 and 600 seconds"
            )
        t = self.math_verify_timeout_s
        if t is not None and not 1 <= t <= 600:
            raise ValueError(
                f"VERIFY_MATH_VERIFY_TIMEOUT_S={t}: whole seconds between 1 and 600 "
                "(math-verify uses signal.alarm, which cannot be turned off safely here)"
            )
        return self

    @property
    def mv_timeout(self) -> int:
        if self.math_verify_timeout_s is not None:
            return self.math_verify_timeout_s
        return max(1, int(self.deadline_s * 0.8))


@lru_cache(maxsize=1)
def get_settings() -> VerifySettings:
    return VerifySettings()
