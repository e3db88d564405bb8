"""slime's remote reward (``--rm-type remote_rm --rm-url URL --reward-key reward``).

slime is not installable here (Megatron, SGLang); its wire format is from its source,
``slime/rollout/rm_hub/__init__.py``, ``remote_rm``: aiohttp POSTs ``{"prompt":
sample.prompt, "response": sample.response, "label": sample.label}`` to ``args.rm_url``,
``raise_for_status()`` (retried with backoff), and the JSON answer becomes
``sample.reward``; with ``--reward-key reward`` slime reads ``sample.reward["reward"]``.
The request below is built and sent exactly that way.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest


async def remote_rm(url: str, prompt: Any, response: str, label: Any) -> tuple[int, Any]:
    """slime's remote_rm, one attempt: the same payload, client and status handling."""
    payload = {"prompt": prompt, "response": response, "label": label}
    connector = aiohttp.TCPConnector(force_close=True, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(total=30)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        session.post(url, json=payload) as resp,
    ):
        return resp.status, await resp.json()


def call(url: str, prompt: Any, response: str, label: Any) -> tuple[int, Any]:
    return asyncio.run(remote_rm(url, prompt, response, label))


@pytest.fixture(scope="module")
def item(gsm8k_dir: Path) -> tuple[str, str, int]:
    row = json.loads((gsm8k_dir / "test.jsonl").read_text().splitlines()[310])
    return row["question"], row["answer"], int(row["answer"].split("####")[-1].replace(",", ""))


@pytest.mark.parametrize(
    ("shape", "response", "reward", "math", "fmt"),
    [
        # templated prompt string; SGLang may leave the EOS marker on: stripped, format 1
        ("text", "<think>so</think><answer>{a}</answer><|im_end|>", 1.5, 1.0, 1.0),
        # chat messages (slime without --apply-chat-template): the last user message counts
        ("messages", "<think>so</think><answer>{w}</answer>", 0.5, 0.0, 1.0),
        # a label that is a number, not a string: used as the reference all the same
        ("number", "The answer is {a}.</s>", 1.0, 1.0, 0.0),
    ],
)
def test_slime_remote_rm_reads_reward_and_components(
    gateway_url: str,
    item: tuple[str, str, int],
    shape: str,
    response: str,
    reward: float,
    math: float,
    fmt: float,
) -> None:
    question, answer_text, answer = item
    prompt: Any = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    label: Any = answer_text
    if shape == "messages":
        prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
    if shape == "number":
        label = answer
    text = response.format(a=answer, w=answer + 1)
    status, out = call(f"{gateway_url}/v1/compat/slime/gsm8k", prompt, text, label)
    assert status == 200, out
    assert out == {"reward": reward, "math_accuracy": math, "format": fmt, "masked": 0.0}
    # what slime keeps with --reward-key reward
    assert out["reward"] == reward


def test_slime_null_reward(
    gateway_url: str, judge_down_url: str, item: tuple[str, str, int]
) -> None:
    question, answer_text, answer = item
    url = f"{judge_down_url}/v1/compat/slime/gsm8k-dj"  # the judge is down: null
    status, out = call(url, question, f"<answer>{answer}</answer>", answer_text)
    assert status == 503 and out["error"]["code"] == "component_unavailable"
    status, out = call(f"{url}?null_reward=0", question, f"<answer>{answer}</answer>", answer_text)
    assert status == 200
    assert out["reward"] == 0.0 and out["masked"] == 1.0 and out["math_accuracy"] == 1.0
    # no label: math_accuracy has nothing to compare with; retrying cannot help, so 422
    status, out = call(f"{gateway_url}/v1/compat/slime/gsm8k", question, "x", None)
    assert status == 422 and out["error"]["code"] == "unscorable"
    assert "math_accuracy" in out["error"]["message"]


def test_slime_missing_field_is_named(gateway_url: str) -> None:
    async def post() -> tuple[int, Any]:
        url = f"{gateway_url}/v1/compat/slime/gsm8k"
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json={"prompt": "p", "label": "1"}) as resp,
        ):
            return resp.status, await resp.json()

    status, out = asyncio.run(post())
    assert status == 422 and out["error"]["param"] == "response"
