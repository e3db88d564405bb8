"""The envs service: multi-turn episodes served over the Open Reward Standard (ORS).

The wire shapes are ORS's (openrewardstandard.io, "HTTP API" and "Server-Sent Events"; the
``openreward`` SDK's ``environments/types.py``): discovery (``/list_environments``,
``/{env}/tools``, ``/{env}/splits``, ``/{env}/tasks``), sessions (``/create_session``,
``/create``, ``/{env}/prompt``, ``/{env}/call``, ``/ping``, ``/delete``,
``/delete_session``), the session named by the ``X-Session-ID`` header. A tool call's answer
is an SSE body: ``task_id``, then the ``RunToolOutput`` JSON in ``chunk`` events of at most
4096 characters, the last one ``end``.

Arbiter's own additions, internal between the gateway and the service: the team header
(``proto.common.TEAM_HEADER``) on every session route, and two SSE comments on a tool
call's stream, which ORS clients skip: ``USAGE_COMMENT`` (what the run cost, for the team's
quota and ledger; the gateway takes it out) and ``ERROR_COMMENT`` (the status and error
envelope of a call that did not answer).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from arbiter.proto.common import ArbiterModel
from arbiter.proto.errors import ErrorBody
from arbiter.proto.gateway import JsonObject

SESSION_HEADER = "X-Session-ID"
# The openreward SDK's name of the environment (``environments.get(name=…)``) on every call;
# the environment of a bare route (``/tools``, ``/call``…) sent without ``variant``.
DEPLOYMENT_HEADER = "X-Deployment"
# On a tool call's stream: ``: arbiter-usage {"tool_calls": 1, "sandbox_cpu_ms": <int>}``,
# and, for a call that did not answer, ``: arbiter-error <status> <envelope>``.
USAGE_COMMENT = ": arbiter-usage "
ERROR_COMMENT = ": arbiter-error "
SSE_CHUNK_CHARS = 4096  # ORS: a result longer than this comes in several events

SplitType = Literal["train", "validation", "test"]
# ORS's reasons for a tool call refused inside the SSE body (``ok: false``).
ToolErrorReason = Literal["not_found", "name_collision", "input_validation", "episode_finished"]


class TextBlock(ArbiterModel):
    text: str
    detail: JsonObject | None = None
    type: Literal["text"] = "text"


class ToolSpec(ArbiterModel):
    name: str
    description: str
    input_schema: JsonObject | None = Field(description="JSON Schema of the tool's input.")


class ListToolsOutput(ArbiterModel):
    tools: list[ToolSpec]


class Split(ArbiterModel):
    name: str
    type: SplitType


class ListTasks(ArbiterModel):
    split: str = Field(max_length=64)


class GetTask(ArbiterModel):
    split: str = Field(max_length=64)
    index: int = Field(ge=0)


class GetTaskRange(ArbiterModel):
    """Tasks ``[start:stop]`` of a split, as Python slices them (negative, or unset)."""

    split: str = Field(max_length=64)
    start: int | None = None
    stop: int | None = None


class NumTasks(ArbiterModel):
    num_tasks: int


class TaskOutput(ArbiterModel):
    task: JsonObject
    env_name: str


class TasksOutput(ArbiterModel):
    tasks: list[JsonObject]
    env_name: str


class SessionId(ArbiterModel):
    sid: str


class Status(ArbiterModel):
    status: str = "ok"


class CreateEpisode(ArbiterModel):
    """``POST /create``: the environment and its task, given whole (``task_spec``) or by
    ``split`` and ``index`` into the environment's own tasks."""

    env_name: str | None = Field(default=None, max_length=64)
    task_spec: JsonObject | None = None
    split: str | None = Field(default=None, max_length=64)
    index: int | None = Field(default=None, ge=0)
    toolset_name: str | None = Field(default=None, description="ORS's; none are offered here.")
    secrets: JsonObject | None = Field(
        default=None,
        description="ORS's secrets for the environment (API keys it calls out with): "
        "accepted and not kept, as no environment here needs one.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> CreateEpisode:
        by_index = self.split is not None or self.index is not None
        if (self.split is None) != (self.index is None):
            raise ValueError("split and index must both be given")
        if (self.task_spec is not None) == by_index:
            raise ValueError("give either task_spec or split and index, not both or neither")
        return self


class ToolCall(ArbiterModel):
    name: str = Field(max_length=128)
    input: JsonObject = Field(default_factory=dict)
    task_id: str | None = Field(default=None, max_length=128)


class ToolOutput(ArbiterModel):
    blocks: list[TextBlock]
    metadata: JsonObject | None = None
    reward: float | None = None
    finished: bool = False


class RunToolSuccess(ArbiterModel):
    ok: Literal[True] = True
    output: ToolOutput


class RunToolError(ArbiterModel):
    ok: Literal[False] = False
    error: str
    reason: ToolErrorReason | None = None


class Usage(ArbiterModel):
    """``USAGE_COMMENT``'s value: what one tool call cost."""

    tool_calls: int = 1
    sandbox_cpu_ms: int = 0


# ---- task specs: what ``task_spec`` holds for each environment (checked at /create)


class MathTask(ArbiterModel):
    """A GSM8K-style problem: ``math``, ``calculator`` and ``python``."""

    question: str = Field(min_length=1, max_length=20_000)
    answer: str = Field(
        min_length=1,
        max_length=20_000,
        description="The reference: a number, or GSM8K's worked answer ending '#### 72'.",
    )
    id: str = Field(default="", max_length=256)


class CodeTask(ArbiterModel):
    """A function to write: ``code``. Tests are Python asserts (MBPP) or a HumanEval
    ``def check(candidate)``; ``tests`` are shown to run_tests, ``hidden_tests`` score
    submit (default: the same as ``tests``)."""

    prompt: str = Field(min_length=1, max_length=20_000)
    entry_point: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
    tests: str = Field(min_length=1, max_length=100_000)
    hidden_tests: str | None = Field(default=None, min_length=1, max_length=100_000)
    id: str = Field(default="", max_length=256)


def task_json(task: ArbiterModel) -> dict[str, Any]:
    return task.model_dump(mode="json")


# ---- Arbiter's batch routes (not ORS): one request carries a turn's calls of many episodes
# (``/v1/envs/batch/*`` at the gateway), so a trainer stepping hundreds of episodes at once
# makes a few requests a turn instead of one per episode. Every item is what the ORS route
# of the same name does for one episode, and answers what it answers.

MAX_BATCH = 1024  # items in one batch request


class BatchFailure(ArbiterModel):
    """An item that did not answer: the status and error envelope that the ORS route would
    have answered for it alone (retryable or not as that status is)."""

    status: int
    error: ErrorBody


class BatchCreate(ArbiterModel):
    """``POST /v1/envs/batch/create``: episodes opened at once, each as ``/create_session``
    then ``/create`` open one (a new sid each)."""

    episodes: list[CreateEpisode] = Field(min_length=1, max_length=MAX_BATCH)


class BatchOpened(ArbiterModel):
    sid: str | None = None  # the episode's X-Session-ID; None when ``failed``
    failed: BatchFailure | None = None


class BatchCreated(ArbiterModel):
    results: list[BatchOpened]  # in the order of ``episodes``


class BatchToolCall(ArbiterModel):
    sid: str = Field(min_length=1, max_length=128, description="The episode's X-Session-ID.")
    env_name: str = Field(max_length=64)
    name: str = Field(max_length=128)
    input: JsonObject = Field(default_factory=dict)


class BatchCall(ArbiterModel):
    """``POST /v1/envs/batch/call``: tool calls on distinct episodes, run at once."""

    calls: list[BatchToolCall] = Field(min_length=1, max_length=MAX_BATCH)


class BatchCallResult(ArbiterModel):
    """ORS's answer to one call (``result``: ``ok`` with the ``ToolOutput``, or the
    environment's refusal), or ``failed``: it did not answer, not the policy's doing."""

    result: RunToolSuccess | RunToolError | None = None
    failed: BatchFailure | None = None


class BatchCalled(ArbiterModel):
    results: list[BatchCallResult]  # in the order of ``calls``
    usage: Usage  # the batch's: its calls that ran, and their sandbox CPU


class BatchDelete(ArbiterModel):
    """``POST /v1/envs/batch/delete``: episodes ended at once, as ``/delete`` ends one."""

    sids: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        min_length=1, max_length=MAX_BATCH
    )


class BatchDeleted(ArbiterModel):
    deleted: int  # of the sids, those that were open
