"""Verify service: ``POST /v1/math`` and ``POST /v1/format``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from arbiter.proto.common import ArbiterModel
from arbiter.proto.components import ComponentRequest


class MathParams(ArbiterModel):
    rel_tolerance: float = Field(
        default=1e-6, ge=0.0, le=0.1, description="Relative tolerance for numeric equality."
    )


class FormatParams(ArbiterModel):
    think_tag: str = Field(
        default="think",
        pattern=r"^[A-Za-z_][A-Za-z0-9_\-]{0,31}$",
        description="Name of the reasoning block's tag: <think>…</think>.",
    )
    answer_tag: str = Field(
        default="answer",
        pattern=r"^[A-Za-z_][A-Za-z0-9_\-]{0,31}$",
        description="Name of the answer block's tag: <answer>…</answer>.",
    )
    think_optional: bool = Field(
        default=False, description="Accept a response with no think block at all."
    )
    mode: Literal["strict", "partial"] = Field(
        default="strict", description="strict: 1.0 or 0.0; partial: graded credit per rule."
    )


MathRequest = ComponentRequest[MathParams]
FormatRequest = ComponentRequest[FormatParams]
