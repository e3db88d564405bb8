"""NeMo Gym 0.7.0's resources-server shapes beyond ``verify``, as ``/nemo-gym/envs/{env}``
speaks them (``nemo_gym/base_resources_server.py``, ``nemo_gym/episode_types.py``,
``nemo_gym/config_types.py``).

- The typed session contract an Environment Server drives: ``POST /seed_session`` with a
  ``ResourcesSeedSessionRequest`` (a caller-assigned ``resources_session_id``, the
  ``episode_id`` and ``task_id`` it belongs to, the task's data) and ``POST /close_session``
  with a ``ResourcesCloseSessionRequest``; each answers the id back. NeMo Gym's checker
  (``nemo_gym.testing.session_conformance``) holds a server to it: a repeated seed returns
  the session it made, a close succeeds whatever the session's state, and a server that
  keeps state refuses a seed after a close of the same id.
- ``POST /aggregate_metrics``: ``AggregateMetricsRequest`` in, ``AggregateMetrics`` out.
- ``GET /reverify_mode``: ``ReverifyMode``, whether ``gym eval reverify`` may call
  ``/verify`` again on saved rollouts.

Like NeMo Gym's, these models refuse unknown fields.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from arbiter.proto.common import ArbiterModel
from arbiter.proto.gateway import JsonObject

MAX_SESSION_ID_CHARS = 512
MAX_VERIFY_RESPONSES = 100_000


class EpisodeId(ArbiterModel):
    """One physical attempt of a logical rollout."""

    rollout_id: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    attempt: int = Field(default=0, ge=0)


class TaskId(ArbiterModel):
    """One task of a run's taskset."""

    taskset: str = Field(min_length=1, max_length=256)
    task_id: str = Field(min_length=1, max_length=256)


class NemoGymSeedSession(ArbiterModel):
    """``ResourcesSeedSessionRequest``: open the episode of ``task_data`` under the caller's id."""

    resources_session_id: str = Field(min_length=1, max_length=MAX_SESSION_ID_CHARS)
    episode_id: EpisodeId
    task_id: TaskId
    task_data: JsonObject = Field(
        description="The dataset row: its task_spec, its task fields, or split and index."
    )


class NemoGymSeedSessionResponse(ArbiterModel):
    """``ResourcesSeedSessionResponse`` (no MCP tools, no sandbox access offered)."""

    resources_session_id: str


class NemoGymCloseSession(ArbiterModel):
    """``ResourcesCloseSessionRequest``."""

    resources_session_id: str = Field(min_length=1, max_length=MAX_SESSION_ID_CHARS)
    episode_id: EpisodeId


class NemoGymCloseSessionResponse(ArbiterModel):
    """``ResourcesCloseSessionResponse``."""

    resources_session_id: str


class NemoGymAggregateMetricsRequest(ArbiterModel):
    """``AggregateMetricsRequest``: a run's verify responses, each with ``_ng_task_index``
    and ``_ng_rollout_index`` (0 when absent) as NeMo Gym's rollout collection stamps them."""

    verify_responses: list[JsonObject] = Field(max_length=MAX_VERIFY_RESPONSES)


class NemoGymAggregateMetrics(ArbiterModel):
    """``AggregateMetrics``: flat string keys, for logging as they are."""

    group_level_metrics: list[dict[str, Any]] = Field(
        default_factory=list, description="Per task: its statistics and its rollouts."
    )
    agent_metrics: dict[str, Any] = Field(
        default_factory=dict, description="Over every rollout, and across repeats."
    )
    key_metrics: dict[str, Any] = Field(
        default_factory=dict, description="The headline: agent_metrics' mean/* (and coverage/*)."
    )
    perf_summary: dict[str, Any] | None = Field(
        default=None, description="From the rollouts' ng_perf; null when none has one."
    )
    repeat_level_metrics: list[dict[str, Any]] = Field(
        default_factory=list, description="Per rollout index, when a task has several."
    )


class ReverifyMode(StrEnum):
    """Whether ``/verify`` can score a saved rollout again without its session."""

    STATELESS = "stateless"  # the verify request alone decides the reward
    UNSUPPORTED = "unsupported"  # the reward needs the session's state (the episode)
    UNKNOWN = "unknown"  # NeMo Gym's default for a server that does not say
