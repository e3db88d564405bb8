"""The base model every wire model derives from, and the health/readiness bodies.

The error envelope and the error kinds are in ``arbiter.proto.errors``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ArbiterModel(BaseModel):
    """Policy for every wire model: unknown fields are refused, so typos fail loudly."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Health(ArbiterModel):
    status: Literal["ok"] = "ok"


class Readiness(ArbiterModel):
    ready: bool
    checks: dict[str, str] = Field(
        default_factory=dict, description="Check name → 'ok' or why it is not ready."
    )


# The team a component service's work belongs to, for fair share across teams. The gateway
# sets it on every call to a component (after authenticating the caller) and strips it from
# what callers send; a component reached without it shares one anonymous team.
TEAM_HEADER = "X-Arbiter-Team"
