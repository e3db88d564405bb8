"""Sandbox service: ``POST /v1/code_tests`` and ``POST /v1/python_grader``, and live Python
interpreters (``/v1/sessions``).

The two components take the uniform ``ComponentRequest`` and answer ``ComponentResponse``;
these are their params. A session is a live interpreter in a sandbox of its own, for one
episode's tool (the envs service's ``python``): ``POST /v1/sessions`` opens one
(``OpenSession`` -> ``SessionInfo``), ``POST /v1/sessions/{id}/run`` runs a cell in it
(``RunCell`` -> ``CellResult``), ``DELETE /v1/sessions/{id}`` closes it. Every program runs
in a bubblewrap sandbox (docs/services/sandbox.md).

``code_tests`` reads the tests from each group's ``reference``, in one of three shapes:

- Python test code: HumanEval-style (``def check(candidate): assert …``, called with the
  function named by the entry point) or plain ``assert`` statements (MBPP-style);
- a JSON list of ``{"input": "...", "output": "..."}`` stdin/stdout pairs;
- a JSON object ``{"tests": <either of the above>, "entry_point": "name"}``, which names
  the entry point per group (HumanEval rows: ``test`` and ``entry_point``).
"""

from __future__ import annotations

import ast
import math
from typing import Any, Literal

from pydantic import Field, field_validator

from arbiter.proto.common import ArbiterModel
from arbiter.proto.components import ComponentRequest
from arbiter.proto.gateway import JsonObject
from arbiter.proto.limits import MAX_WEIGHT

MAX_GRADER_SOURCE_CHARS = 65_536
MAX_TEST_TIMEOUT_S = 60.0
MAX_CELL_CHARS = 100_000
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class CodeTestsParams(ArbiterModel):
    mode: Literal["fraction", "all"] = Field(
        default="fraction",
        description="fraction: the share of the tests passed; all: 1.0 when every test "
        "passes, else 0.0 (the run stops at the first failure).",
    )
    entry_point: str | None = Field(
        default=None,
        pattern=IDENTIFIER,
        description="The function HumanEval-style tests call as check(<entry_point>); "
        "unset: the reference's own entry_point, else the last function the prompt defines.",
    )
    timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=MAX_TEST_TIMEOUT_S,
        description="Wall-clock limit per test (the service's SANDBOX_TEST_TIMEOUT_S caps "
        "it); a test past it fails with 'timeout'.",
    )


class PythonGraderParams(ArbiterModel):
    source: str = Field(
        min_length=1,
        max_length=MAX_GRADER_SOURCE_CHARS,
        description="Python source defining grade(sample, item) -> float, as OpenAI's Python "
        'graders do. sample = {"output_text": <response>, "output_json": <the response '
        'parsed, when it is JSON, else null>}; item = {"prompt", "reference", "metadata"} '
        "and the metadata's keys. Run in the sandbox once per response; an exception, a "
        "timeout or a result that is not a finite number inside score_range is null with "
        "the reason (grader_error), never 0.",
    )
    metadata: JsonObject = Field(
        default_factory=dict,
        description="Passed to grade() as item['metadata'], under each group's own metadata "
        "(a group's keys win).",
    )
    score_range: tuple[float, float] = Field(
        default=(0.0, 1.0),
        description="The grades accepted, [min, max] (OpenAI's graders grade from 0 to 1); "
        "a grade outside it is null grader_error.",
    )
    timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=MAX_TEST_TIMEOUT_S,
        description="CPU time of one grade() call, the source's imports included (heavy "
        "packages take seconds: sklearn, nltk), in whole seconds rounded up; a "
        "wall-clock backstop stops a grader that sleeps.",
    )

    @field_validator("score_range")
    @classmethod
    def _range(cls, bounds: tuple[float, float]) -> tuple[float, float]:
        lo, hi = bounds
        if not all(math.isfinite(b) and abs(b) <= MAX_WEIGHT for b in bounds) or lo >= hi:
            raise ValueError(
                f"expected [min, max] with min < max, each finite and at most {MAX_WEIGHT:g} "
                "in size"
            )
        return bounds

    @field_validator("source")
    @classmethod
    def _compiles(cls, source: str) -> str:
        """The source must compile and define ``grade`` at top level: checked wherever the
        params are (the gateway, when a recipe is loaded or sent), before any sandbox runs."""
        try:
            tree = ast.parse(source, "<grader>")
            compile(tree, "<grader>", "exec")
        except SyntaxError as exc:
            raise ValueError(f"does not compile: {exc.msg} (line {exc.lineno})") from None
        except (ValueError, MemoryError, RecursionError) as exc:
            raise ValueError(f"does not compile: {type(exc).__name__}") from None
        if not any(_defines_grade(node) for node in tree.body):
            raise ValueError("defines no top-level function grade(sample, item)")
        return source


def _defines_grade(node: Any) -> bool:
    return isinstance(node, ast.FunctionDef) and node.name == "grade"


class OpenSession(ArbiterModel):
    timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=MAX_TEST_TIMEOUT_S,
        description="CPU seconds each cell may use, in whole seconds rounded up (the "
        "service's SANDBOX_TEST_TIMEOUT_S caps it). At it the cell gets KeyboardInterrupt "
        "(its variables stay); a second later the interpreter is killed.",
    )


class SessionInfo(ArbiterModel):
    id: str = Field(description="The session's id, for its run and close calls.")
    replica: str | None = Field(
        default=None,
        description="Where this session lives: the base URL of the replica that holds it "
        "(its SANDBOX_SESSION_URL), to send its calls to; null: the URL it was opened at.",
    )
    timeout_s: float = Field(description="CPU seconds each cell may use, as applied.")
    idle_timeout_s: float = Field(
        description="A session without a cell for this long is closed (its interpreter "
        "gone; its id then answers 404 session_not_found)."
    )


class SessionClosed(ArbiterModel):
    id: str
    closed: Literal[True] = True


class RunCell(ArbiterModel):
    code: str = Field(max_length=MAX_CELL_CHARS, description="Python source: one cell.")


CellStatus = Literal[
    "ok",  # the cell ran to its end
    "error",  # it raised: the traceback is in stderr; the session's variables stay
    "interrupted",  # stopped at its CPU time or the wall clock (message); variables stay
    "restarted",  # the interpreter ended (message says why): the next cell starts a fresh one
]


class CellResult(ArbiterModel):
    status: CellStatus
    stdout: str = Field(
        description="What the cell printed, as text (UTF-8, invalid bytes replaced), at most "
        "SANDBOX_SESSION_OUTPUT_BYTES."
    )
    stderr: str = Field(description="Its stderr (a traceback), likewise.")
    stdout_omitted: int = Field(ge=0, description="Bytes of stdout past the limit, not shown.")
    stderr_omitted: int = Field(ge=0, description="Bytes of stderr past the limit, not shown.")
    cpu_ms: float = Field(
        ge=0,
        description="CPU time the session's processes used since the last cell's answer: "
        "this cell's, and that of processes earlier cells left running.",
    )
    message: str = Field(default="", description="Why it was interrupted or restarted.")


CodeTestsRequest = ComponentRequest[CodeTestsParams]
PythonGraderRequest = ComponentRequest[PythonGraderParams]
