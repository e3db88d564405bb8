"""Settings base: one pydantic-settings class per service, read from the environment, fail fast.

``ServiceSettings`` carries the policy every service shares (unknown variables ignored,
settings frozen once read) and the fields ``arbiter serve`` reads: ``host``, ``port``,
``log_level``, ``access_log``. Each service's class sets only its ``env_prefix`` and its
own port default - the one place a service's port is written down.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

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
    access_log: bool = Field(
        default=False,
        description="One log line per HTTP request (uvicorn's access log, at info level); "
        "costs CPU at high request rates.",
    )
