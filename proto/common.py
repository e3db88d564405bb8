"""Base model and the one error envelope used by every Arbiter service."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ArbiterModel(BaseModel):
    """Policy for every wire model: unknown fields are refused, so typos fail loudly."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


ErrorType = Literal[
    "invalid_request_error",  # 400/422: bad input, not retryable
    "payload_too_large",  # 413
    "not_found",  # 404
    "rate_limited",  # 429, retryable
    "unavailable",  # 503, retryable
    "timeout",  # 504, retryable
    "internal_error",  # 500
]


class ErrorBody(ArbiterModel):
    type: ErrorType
    message: str
    param: str | None = Field(default=None, description="The offending field, dotted path.")
    code: str | None = Field(default=None, description="Machine-readable reason.")


class ErrorResponse(ArbiterModel):
    """``{"error": {"type", "message", "param", "code"}}`` — every non-2xx body."""

    error: ErrorBody


class Health(ArbiterModel):
    status: Literal["ok"] = "ok"


class Readiness(ArbiterModel):
    ready: bool
    checks: dict[str, str] = Field(
        default_factory=dict, description="Check name → 'ok' or why it is not ready."
    )
