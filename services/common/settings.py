"""Settings base: one pydantic-settings class per service, read from the environment, fail fast."""

from __future__ import annotations

import os

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# Offline by default: nothing in Arbiter downloads models or data at run time unless asked.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class ServiceSettings(BaseSettings):
    """Fields every service has. Subclasses set ``env_prefix`` (e.g. ``VERIFY_``)."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    host: str = Field(default="127.0.0.1", description="Bind address.")
    port: int = Field(default=8000, ge=1, le=65535, description="Bind port.")
    log_level: str = Field(default="info", pattern="^(debug|info|warning|error)$")
