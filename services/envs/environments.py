"""The environments: their tools, prompts, and what a tool call does to an episode.

- ``math``: ``submit(answer)``, the whole final response, scored by the ``gsm8k`` recipe
  (math_accuracy 1.0 + format 0.5), as ``/v1/score`` would score it.
- ``calculator``: ``calculate(expression)``, arithmetic by ``arbiter.calculator`` (the
  trainer's in-process calculator's grammar and rendering, so both answer alike); ``submit(answer)``
  as math (a bare number earns math_accuracy's 1.0; the <think>/<answer> layout format's 0.5).
- ``python``: ``run(code)`` in the episode's live interpreter in the sandbox
  (``interpreters.py``), ``submit(answer)`` as calculator.
- ``code``: ``run_tests(code)`` against the task's visible tests, ``submit(code)`` scored by
  the ``code`` recipe (code_tests, the share passed) on the hidden ones.

A call returns a ``Step``: the ORS ``ToolOutput``, the sandbox CPU it cost, and what the
environment keeps in the episode for its next call (``tool_state``: python's interpreter
handle). A submit ends the episode. Bad tool input is the policy's: an ORS
``RunToolError`` (``input_validation``) naming the field, never an HTTP error.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydantic import Field, ValidationError

from arbiter import calculator
from arbiter.proto.common import ArbiterModel
from arbiter.proto.components import ScoreGroup
from arbiter.proto.envs import CodeTask, MathTask, TextBlock, ToolOutput, ToolSpec
from arbiter.proto.gateway import Recipe, RecipeComponent
from arbiter.services.common.app import field_path
from arbiter.services.envs.interpreters import LOST, Handle, Interpreters, shown
from arbiter.services.envs.rewards import Judged, Rewards
from arbiter.services.envs.settings import EnvsSettings
from arbiter.services.envs.tasks import TaskSet
from arbiter.services.scoring.recipes import ResolvedRecipe, resolve

MAX_ANSWER = 20_000
MAX_CODE = 50_000


class Answer(ArbiterModel):
    answer: str = Field(max_length=MAX_ANSWER, description="Your final answer.")


class Expression(ArbiterModel):
    # no min_length: an empty expression is the calculator's error to show, as in process
    expression: str = Field(
        max_length=calculator.MAX_LENGTH, description=f"Arithmetic: {calculator.SUMMARY}."
    )


class Code(ArbiterModel):
    code: str = Field(min_length=1, max_length=MAX_CODE, description="Python source.")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args: type[ArbiterModel]

    def spec(self) -> ToolSpec:
        schema = self.args.model_json_schema()
        schema.pop("title", None)
        return ToolSpec(name=self.name, description=self.description, input_schema=schema)


class ToolInputError(Exception):
    """The policy's tool input does not fit the tool: an ORS ``input_validation`` error."""


@dataclass
class Step:
    output: ToolOutput
    cpu_ms: int = 0
    # what the episode keeps for the environment's next call (python: its interpreter's
    # handle); None: as it was
    tool_state: dict[str, str] | None = None


def text(message: str) -> list[TextBlock]:
    return [TextBlock(text=message)]


def judged_output(j: Judged, shown: str) -> ToolOutput:
    return ToolOutput(blocks=text(shown), reward=j.reward, finished=True, metadata=j.metadata())


class Environment:
    """One environment: its tools, tasks and task model; ``call`` does one tool call."""

    name: str
    description: str
    tools: tuple[Tool, ...]
    task_model: type[ArbiterModel]
    needs_sandbox = False

    def __init__(self, tasks: TaskSet, rewards: Rewards, settings: EnvsSettings):
        self.taskset = tasks
        self.rewards = rewards
        self.settings = settings

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def args(self, tool: Tool, given: dict[str, Any]) -> Any:
        try:
            return tool.args.model_validate(given)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in ["input", *field_path(first.get("loc", ()))])
            raise ToolInputError(f"{where}: {first['msg']}") from None

    def prompt(self, task: dict[str, Any]) -> str:
        raise NotImplementedError

    async def call(
        self, tool: Tool, args: Any, task: dict[str, Any], tool_state: dict[str, str], team: str
    ) -> Step:
        raise NotImplementedError

    async def close(self, tool_state: dict[str, str], team: str) -> None:
        """The episode is deleted: let go of what its ``tool_state`` holds (best effort)."""


SUBMIT = Tool("submit", "Submit your whole final response; this ends the episode.", Answer)
MATH_PROMPT = (
    "Solve the math problem. Reason step by step inside <think>...</think>, then give the "
    "final number inside <answer>...</answer>.{how} Call submit with that whole response."
)


class Math(Environment):
    name = "math"
    description = "GSM8K: submit the response; the gsm8k recipe scores it."
    tools: tuple[Tool, ...] = (SUBMIT,)
    task_model = MathTask
    recipe_name = "gsm8k"
    how = ""  # a tool environment's sentence on its tool, in the prompt

    def prompt(self, task: dict[str, Any]) -> str:
        return f"{MATH_PROMPT.format(how=self.how)}\n\n{task['question']}"

    def scoring(self) -> ResolvedRecipe:
        return self.rewards.recipe(self.recipe_name)

    async def submit(self, answer: str, task: dict[str, Any], team: str) -> Step:
        group = ScoreGroup(prompt=task["question"], reference=task["answer"], responses=[answer])
        j = await self.rewards.score(self.scoring(), group, team)
        verdict = (
            "scored"
            if j.reward is not None
            else "not scored: " + "; ".join(e["message"] for e in j.errors)
        )
        return Step(judged_output(j, f"Submitted; {verdict}."))

    async def call(
        self, tool: Tool, args: Any, task: dict[str, Any], tool_state: dict[str, str], team: str
    ) -> Step:
        return await self.submit(args.answer, task, team)


class MathWithTool(Math):
    """GSM8K with one tool beside ``submit(answer)``, scored as math; a subclass names the
    tool in ``how`` and runs it in ``use``."""

    async def call(
        self, tool: Tool, args: Any, task: dict[str, Any], tool_state: dict[str, str], team: str
    ) -> Step:
        if tool.name == "submit":
            return await self.submit(args.answer, task, team)
        return await self.use(args, tool_state, team)

    async def use(self, args: Any, tool_state: dict[str, str], team: str) -> Step:
        raise NotImplementedError


class Calculator(MathWithTool):
    name = "calculator"
    description = "GSM8K with a calculator; submit the response (the gsm8k recipe)."
    tools = (
        Tool("calculate", "Evaluate an arithmetic expression.", Expression),
        SUBMIT,
    )
    how = " While thinking you may call calculate(expression) for arithmetic."

    async def use(self, args: Any, tool_state: dict[str, str], team: str) -> Step:
        calc = calculator.calculate(args.expression)
        metadata = {"value": calc.value} if calc.error is None else {"error": calc.error}
        return Step(ToolOutput(blocks=text(calc.text), metadata=metadata))


class Python(MathWithTool):
    name = "python"
    description = "GSM8K with a Python interpreter (sandboxed); submit the response."
    tools = (
        Tool(
            "run",
            "Run Python code in this episode's interpreter; what it prints comes back "
            "(stdout, then stderr). Variables, imports and functions persist across calls.",
            Code,
        ),
        SUBMIT,
    )
    needs_sandbox = True
    how = " While thinking you may call run(code) to run Python; print what you want to see."

    def __init__(self, tasks: TaskSet, rewards: Rewards, settings: EnvsSettings):
        super().__init__(tasks, rewards, settings)
        assert settings.sandbox_url is not None  # offered only with a sandbox (serving.py)
        self.interpreters = Interpreters(
            rewards.client.session,
            settings.sandbox_url,
            settings.component_timeout_s,
            settings.run_timeout_s,
        )

    async def use(self, args: Any, tool_state: dict[str, str], team: str) -> Step:
        """The cell, once, in the episode's interpreter (opened at its first run); a lost
        one is the observation ``LOST``, and the next run opens a fresh one."""
        handle = Handle.of(tool_state)
        opened = handle is None
        if handle is None:
            handle = await self.interpreters.open(team)
        try:
            cell = await self.interpreters.run(handle, team, args.code)
        except BaseException:
            if opened:  # the episode will not keep it: not one for the idle reaping to find
                await asyncio.shield(self.interpreters.close(handle, team))
            raise
        if cell is None:
            return Step(ToolOutput(blocks=text(LOST), metadata={"status": "lost"}), tool_state={})
        output = ToolOutput(blocks=text(shown(cell)), metadata={"status": cell.status})
        return Step(output, cpu_ms=math.ceil(cell.cpu_ms), tool_state=handle.dump())

    async def close(self, tool_state: dict[str, str], team: str) -> None:
        handle = Handle.of(tool_state)
        if handle is not None:
            await self.interpreters.close(handle, team)


class CodeEnv(Environment):
    name = "code"
    description = "Write a Python function; run_tests shows the visible tests, submit is "
    "scored by code_tests on the hidden ones."
    tools = (
        Tool("run_tests", "Run your code against the task's visible tests.", Code),
        Tool("submit", "Submit your code; hidden tests score it; this ends the episode.", Code),
    )
    task_model = CodeTask
    needs_sandbox = True

    def prompt(self, task: dict[str, Any]) -> str:
        return (
            f"Write the Python function `{task['entry_point']}`.\n\n{task['prompt']}\n\n"
            f"Visible tests:\n{task['tests']}"
        )

    async def call(
        self, tool: Tool, args: Any, task: dict[str, Any], tool_state: dict[str, str], team: str
    ) -> Step:
        tests = (
            task["tests"] if tool.name == "run_tests" else task.get("hidden_tests") or task["tests"]
        )
        reference = json.dumps({"tests": tests, "entry_point": task["entry_point"]})
        group = ScoreGroup(prompt=task["prompt"], reference=reference, responses=[args.code])
        recipe = (
            run_recipe(self.settings.run_timeout_s)
            if tool.name == "run_tests"
            else self.rewards.recipe("code")
        )
        j = await self.rewards.score(recipe, group, team)
        if tool.name == "submit":
            return Step(judged_output(j, "Submitted."), cpu_ms=j.cpu_ms)
        return Step(ToolOutput(blocks=text(test_report(j)), metadata=j.metadata()), cpu_ms=j.cpu_ms)


def test_report(j: Judged) -> str:
    info = j.info.get("code_tests", {})
    if j.components.get("code_tests") is None:
        return "; ".join(e["message"] for e in j.errors) or "the tests did not run"
    lines = [f"passed {info.get('passed')} of {info.get('tests')} tests"]
    for index, reason in sorted((info.get("failed") or {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"test {index}: {reason}")
    return "\n".join(lines)


@lru_cache(maxsize=4)
def run_recipe(timeout_s: float) -> ResolvedRecipe:
    """code_tests with the run's CPU time (the share passed; not a reward)."""
    params = {"timeout_s": timeout_s}
    return resolve(
        Recipe(
            name="envs-run",
            components=[RecipeComponent(name="code_tests", weight=1.0, params=params)],
        )
    )


ENVIRONMENTS: tuple[type[Environment], ...] = (Math, Calculator, Python, CodeEnv)
