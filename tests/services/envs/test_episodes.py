"""Full episodes of every environment through the real envs, verify and sandbox services."""

from __future__ import annotations

import httpx
import pytest

from tests.services.envs.conftest import Episodes

GSM = {"question": "Tom has 3 apples and buys 4 more. How many apples?", "answer": "#### 7"}


def test_discovery(envs_url: str) -> None:
    envs = httpx.get(f"{envs_url}/list_environments").json()
    assert envs == ["math", "calculator", "python", "code"]
    assert httpx.get(f"{envs_url}/health").json() == {"status": "ok"}
    tools = httpx.get(f"{envs_url}/calculator/tools").json()["tools"]
    assert [t["name"] for t in tools] == ["calculate", "submit"]
    assert tools[0]["input_schema"]["properties"]["expression"]["type"] == "string"
    splits = httpx.get(f"{envs_url}/math/splits").json()
    assert {"name": "test", "type": "test"} in splits
    tasks = httpx.post(f"{envs_url}/code/tasks", json={"split": "test"}).json()
    assert tasks["env_name"] == "code" and len(tasks["tasks"]) >= 10
    assert {"prompt", "entry_point", "tests", "hidden_tests"} <= set(tasks["tasks"][0])


def test_math_episode_scored_by_the_gsm8k_recipe(episodes: Episodes) -> None:
    sid = episodes.create("math", task_spec=GSM)
    prompt = episodes.prompt("math", sid).json()
    assert prompt[0]["type"] == "text" and "3 apples" in prompt[0]["text"]
    done = episodes.call("math", sid, "submit", answer="<think>3+4</think><answer>7</answer>")
    out = done.result["output"]
    # math_accuracy 1.0 + format 0.5: the recipe's weighted sum, as /v1/score gives it
    assert out["reward"] == pytest.approx(1.5) and out["finished"] is True
    assert out["metadata"]["components"] == {"math_accuracy": 1.0, "format": 1.0}
    assert out["metadata"]["recipe"]["name"] == "gsm8k"
    assert done.usage == {"tool_calls": 1, "sandbox_cpu_ms": 0}
    again = episodes.call("math", sid, "submit", answer="7")
    assert again.result == {
        "ok": False,
        "error": "the episode is finished (submit was called)",
        "reason": "episode_finished",
    }


def test_calculator_episode_by_split_and_index(episodes: Episodes) -> None:
    sid = episodes.create("calculator", split="test", index=0)  # Janet's ducks: 18
    calc = episodes.call("calculator", sid, "calculate", expression="(16 - 3 - 4) * 2")
    assert calc.result["output"]["blocks"][0]["text"] == "18"
    assert calc.result["output"]["reward"] is None and not calc.result["output"]["finished"]
    bad = episodes.call("calculator", sid, "calculate", expression="__import__('os')")
    assert (
        bad.result["output"]["blocks"][0]["text"] == "error: unexpected character '_'"
    )  # observed
    wrong = episodes.call("calculator", sid, "submit", answer="17")
    assert wrong.result["output"]["reward"] == 0.0 and wrong.result["output"]["finished"]


def test_python_episode_keeps_state_across_cells(episodes: Episodes) -> None:
    sid = episodes.create("python", task_spec=GSM)
    first = episodes.call("python", sid, "run", code="x = 3 + 4\nprint('first', x)")
    assert first.result["output"]["blocks"][0]["text"] == "first 7\n"
    assert first.result["output"]["metadata"] == {"status": "ok"}
    assert first.usage["tool_calls"] == 1 and first.usage["sandbox_cpu_ms"] > 0
    # the interpreter lives on: x is still there, and nothing ran again
    second = episodes.call("python", sid, "run", code="print(x * 2)\nprint('  spaced  ')")
    assert second.result["output"]["blocks"][0]["text"] == "14\n  spaced  \n"
    err = episodes.call("python", sid, "run", code="1 / 0")
    shown = err.result["output"]["blocks"][0]["text"]
    assert shown.startswith("Traceback") and "ZeroDivisionError: division by zero" in shown
    assert err.result["output"]["metadata"] == {"status": "error"}
    long = episodes.call("python", sid, "run", code="print('y' * 20_000)")
    assert "[... 3617 more bytes of output not shown]" in long.result["output"]["blocks"][0]["text"]
    done = episodes.call("python", sid, "submit", answer="7")
    assert done.result["output"]["reward"] == 1.0


def test_python_cell_past_its_cpu_time_is_stopped_and_the_state_stays(
    episodes: Episodes,
) -> None:
    sid = episodes.create("python", task_spec=GSM)
    episodes.call("python", sid, "run", code="n = 41")
    loop = episodes.call("python", sid, "run", code="while True:\n    n += 0")
    shown = loop.result["output"]["blocks"][0]["text"]
    assert "KeyboardInterrupt" in shown, shown
    assert shown.endswith("[stopped at its 2 s of CPU time; its variables are kept]"), shown
    # one run of the loop: its CPU is about ENVS_RUN_TIMEOUT_S
    assert 1500 < loop.usage["sandbox_cpu_ms"] < 3 * 2000
    after = episodes.call("python", sid, "run", code="print(n + 1)")
    assert after.result["output"]["blocks"][0]["text"] == "42\n"


def test_python_run_reads_nothing_of_another_session(episodes: Episodes) -> None:
    secret = "s3cret-" + "x" * 8
    mine = episodes.create("python", task_spec=GSM)
    episodes.call("python", mine, "run", code=f"token = {secret!r}")
    other = episodes.create("python", task_spec=GSM)
    probe = (
        "import os, glob\n"
        "print('token' in globals())\n"
        "hits = []\n"
        "roots = ['/tmp', '/dev/shm', '/run', '/var/tmp', os.getcwd()]\n"
        "paths = [p for r in roots for p in glob.glob(r + '/**', recursive=True)][:5000]\n"
        f"print(any({secret!r} in v for v in os.environ.values()))\n"
        "for p in paths:\n"
        "    try:\n"
        "        if os.path.isfile(p) and os.path.getsize(p) < 1e6 and "
        f"{secret!r}.encode() in open(p, 'rb').read(): hits.append(p)\n"
        "    except Exception: pass\n"
        "print(hits)\n"
    )
    seen = episodes.call("python", other, "run", code=probe).result["output"]["blocks"][0]
    assert secret not in seen["text"]
    assert seen["text"] == "False\nFalse\n[]\n", seen["text"]


def test_code_episode_visible_then_hidden_tests(episodes: Episodes) -> None:
    sid = episodes.create("code", split="test", index=0)  # HumanEval/0 has_close_elements
    prompt = episodes.prompt("code", sid).json()[0]["text"]
    assert "has_close_elements" in prompt and "Visible tests" in prompt
    wrong = "def has_close_elements(numbers, threshold):\n    return False\n"
    shown = episodes.call("code", sid, "run_tests", code=wrong)
    text = shown.result["output"]["blocks"][0]["text"]
    assert text.startswith("passed 1 of 2 tests") and "test 0:" in text
    assert shown.result["output"]["reward"] is None
    right = (
        "def has_close_elements(numbers, threshold):\n"
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n"
        "               for b in numbers[i + 1:])\n"
    )
    done = episodes.call("code", sid, "submit", code=right)
    assert done.result["output"]["reward"] == 1.0 and done.result["output"]["finished"]
    assert done.result["output"]["metadata"]["components"] == {"code_tests": 1.0}
    assert done.usage["sandbox_cpu_ms"] > 0


def test_code_episode_own_task_spec_partial_reward(episodes: Episodes) -> None:
    spec = {
        "prompt": "Return the double of n.",
        "entry_point": "double",
        "tests": "assert double(2) == 4\n",
        "hidden_tests": "assert double(2) == 4\nassert double(3) == 6\n",
    }
    sid = episodes.create("code", task_spec=spec)
    done = episodes.call("code", sid, "submit", code="def double(n):\n    return 4\n")
    assert done.result["output"]["reward"] == 0.5  # one hidden test of two


def test_unknown_tool_and_bad_input_are_ors_errors(episodes: Episodes) -> None:
    sid = episodes.create("calculator", task_spec=GSM)
    nope = episodes.call("calculator", sid, "shell", cmd="ls")
    assert nope.result["ok"] is False and nope.result["reason"] == "not_found"
    bad = episodes.call("calculator", sid, "calculate", expr="1+1")
    assert bad.result["reason"] == "input_validation"
    assert bad.result["error"].startswith("input.expression:"), bad.result
    assert bad.usage == {"tool_calls": 1, "sandbox_cpu_ms": 0}
    metrics = httpx.get(f"{episodes.url}/metrics").text
    counted = 'arbiter_envs_tool_calls_total{env="calculator",outcome="%s",tool="%s"}'
    assert counted % ("not_found", "(unknown)") in metrics
    assert counted % ("input_validation", "calculate") in metrics
