"""Whole episodes of every environment with the field's own ORS clients, used as their
READMEs show them: ``ors-sdk`` (``ORS(base_url=…)``, ``client.environment(name)``) and
``openreward`` (``OpenReward().environments.get(name=…, base_url=…)``), nothing patched.

Run by ``test_ors_clients.py`` with a Python that has both SDKs (``make ors-clients``:
``.venv-ors``; their dependencies are heavy and not the project's). Standard library and
the SDKs only. Usage::

    ORS_API_KEY=… OPENREWARD_API_KEY=… python ors_clients.py CLIENT BASE_URL [HOLD_S]

CLIENT is ``ors-sdk`` or ``openreward``. Prints one JSON line: per environment, the tools,
the prompt, each tool's observation, the submit's reward and ``finished``. With HOLD_S, a
``calculator`` episode is also held open that long beside the others (``ors-sdk``'s async
client pings it every 10 s) before it submits: ``held`` is its reward. Exits 1 when an
episode is not what it should be (``check``): the pytest test, ``arbiter up``'s test and
``make compose-test`` run it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import traceback
from typing import Any

RIGHT = (
    "def has_close_elements(numbers, threshold):\n"
    "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n"
    "               for b in numbers[i + 1:])\n"
)
OWN_TASK = {"question": "Tom has 3 boxes of 14 pens. How many pens?", "answer": "#### 42"}
ENVIRONMENTS = ("math", "calculator", "python", "code")
COUNTER = "n = globals().get('n', 0) + 1\nprint(n)"


def answer_of(task_spec: dict[str, Any]) -> str:
    number = str(task_spec["answer"]).split("####")[-1].strip().replace(",", "")
    return f"<think>worked it out</think><answer>{number}</answer>"


def actions(env: str, task_spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The tool calls of one episode, the submit last."""
    if env == "code":
        wrong = "def has_close_elements(n, t):\n    return False\n"
        return [("run_tests", {"code": wrong}), ("submit", {"code": RIGHT})]
    tools = {
        "math": [],
        "calculator": [("calculate", {"expression": "6 * 7"})],
        "python": [("run", {"code": COUNTER}), ("run", {"code": COUNTER})],
    }[env]
    return [*tools, ("submit", {"answer": answer_of(task_spec)})]


def environment(client: str, base_url: str, name: str) -> tuple[Any, Any]:
    """(the client, the environment): the client is kept while its environment is used (it
    owns the event loop the synchronous API runs on)."""
    if client == "ors-sdk":
        from ors.client import ORS

        ors = ORS(base_url=base_url)
        return ors, ors.environment(name)
    from openreward import OpenReward

    openreward = OpenReward()
    return openreward, openreward.environments.get(name=name, base_url=base_url)


def first_task(client: str, env: Any, name: str) -> Any:
    """The environment's first test task; a deployment without GSM8K's files (compose's
    default) offers the math environments no split: then a task of our own, as the SDK's
    ``Task``."""
    if "test" in env.list_splits():
        return env.list_tasks(split="test")[0]
    if client == "ors-sdk":
        from ors.client import Task

        return Task(environment_name=name, task_spec=OWN_TASK)
    from openreward.api.environments.types import Task as ORTask

    return ORTask(server_name=name, environment_name=name, task_spec=OWN_TASK, namespace=None)


def episode(client: str, base_url: str, name: str) -> dict[str, Any]:
    _, env = environment(client, base_url, name)
    task = first_task(client, env, name)
    out: dict[str, Any] = {"observations": []}
    with env.session(task=task) as session:
        out["tools"] = sorted(t.name for t in session.list_tools())
        out["prompt"] = [block.text for block in session.get_prompt()]
        for tool, args in actions(name, task.task_spec):
            result = session.call_tool(tool, args)
            out["observations"].append("".join(b.text for b in result.blocks))
        out["reward"], out["finished"] = result.reward, result.finished
    return out


async def held_episode(base_url: str, hold_s: float) -> dict[str, Any]:
    """A calculator episode idle ``hold_s`` before its calls, with ``ors-sdk``'s async API
    (its synchronous one runs its event loop, and so its pings, only inside a call)."""
    from ors.client import AsyncORS

    client = AsyncORS(base_url=base_url)
    env = client.environment("calculator")
    task = (await env.list_tasks(split="test"))[0]  # (the pytest stack has GSM8K)
    async with env.session(task=task) as session:
        await asyncio.sleep(hold_s)
        result = await session.call_tool("submit", {"answer": answer_of(task.task_spec)})
    return {"reward": result.reward, "finished": result.finished}


def main(client: str, base_url: str, hold_s: float) -> dict[str, Any]:
    held: dict[str, Any] = {}
    if hold_s:

        def hold() -> None:
            try:
                held.update(asyncio.run(held_episode(base_url, hold_s)))
            except Exception as exc:  # reported, not lost with the thread
                held["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"

        holder = threading.Thread(target=hold)
        holder.start()
    out = {name: episode(client, base_url, name) for name in ENVIRONMENTS}
    if hold_s:
        holder.join()
        out["held"] = held
    return out


def check(out: dict[str, Any]) -> None:
    """Raises AssertionError when an episode's tools, observations or reward are wrong."""
    assert out["math"]["tools"] == ["submit"]
    assert out["math"]["reward"] == 1.5 and out["math"]["finished"] is True  # math + format
    assert out["calculator"]["tools"] == ["calculate", "submit"]
    assert out["calculator"]["observations"][0] == "42"
    assert out["python"]["observations"][:2] == ["1\n", "2\n"]  # one run each, state kept
    assert out["code"]["observations"][0].startswith("passed 1 of")
    assert out["code"]["reward"] == 1.0
    for env in ("calculator", "python"):
        assert out[env]["reward"] == 1.5 and out[env]["finished"] is True, out[env]
        assert out[env]["prompt"][0].strip()
    if "held" in out:  # idle far past the TTL, kept alive by the SDK's pings
        assert out["held"].get("reward") == 1.5, out["held"]


if __name__ == "__main__":
    hold = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    found = main(sys.argv[1], sys.argv[2], hold)
    print(json.dumps(found))
    try:
        check(found)
    except AssertionError as exc:
        sys.exit(f"{sys.argv[1]}: an episode went wrong: {exc!r}")
