"""OpenRLHF 0.11.2's remote reward (``--reward.remote_url``) against the real gateway.

OpenRLHF's own code builds and sends the request and reads the answer: ``openrlhf/utils/
agent.py``, ``SingleTurnAgentExecutor.execute`` tokenises the prompt, asks the engine for
a continuation, decodes prompt + response *with* special tokens (so the query ends with
``<|im_end|>``) and calls ``_fetch_rewards_via_http`` (aiohttp, one sample per request).
The engine is the one stand-in: a class that returns the tokenizer's own encoding of a
fixed response, since generation is not what is under test.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from arbiter.tiny_model import _corpus, build_tokenizer

agent = pytest.importorskip("openrlhf.utils.agent", reason="pip install --no-deps openrlhf")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory, gsm8k_dir: Path) -> Any:
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(out, _corpus(gsm8k_dir, limit=500))
    return AutoTokenizer.from_pretrained(out)


class FixedEngine:
    """Stands in for vLLM: 'generates' the tokens of a given text, then EOS."""

    def __init__(self, tokenizer: Any, text: str):
        self.ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]

    async def generate(self, prompt_ids: list[int], params: Any, multi_modal_data: Any = None):
        out = SimpleNamespace(token_ids=self.ids, finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[out])


def gsm8k_item(gsm8k_dir: Path, line: int) -> tuple[str, str, int]:
    item = json.loads((gsm8k_dir / "test.jsonl").read_text().splitlines()[line])
    answer = int(item["answer"].split("####")[-1].strip().replace(",", ""))
    return item["question"], item["answer"], answer


def run_openrlhf(
    url: str, tokenizer: Any, question: str, label: str, response: str
) -> dict[str, Any]:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    executor = agent.SingleTurnAgentExecutor(remote_rm_url=url)
    params = SimpleNamespace(max_tokens=256, logprobs=None)
    out: dict[str, Any] = asyncio.run(
        executor.execute(prompt, label, params, 1024, tokenizer, FixedEngine(tokenizer, response))
    )
    return out


def test_openrlhf_executor_gets_rewards_and_components(
    gateway_url: str, tokenizer: Any, gsm8k_dir: Path
) -> None:
    question, label, answer = gsm8k_item(gsm8k_dir, 300)
    url = f"{gateway_url}/v1/compat/openrlhf/gsm8k"
    cases = [
        # right answer, right layout: the trailing <|im_end|> is stripped, so format is 1
        (f"<think>add them</think><answer>{answer}</answer>", 1.5, 1.0, 1.0),
        # wrong answer, right layout
        (f"<think>add them</think><answer>{answer + 1}</answer>", 0.5, 0.0, 1.0),
        # right answer, no tags
        (f"The answer is {answer}.", 1.0, 1.0, 0.0),
    ]
    for response, reward, math, fmt in cases:
        out = run_openrlhf(url, tokenizer, question, label, response)
        assert out["reward"] == [reward], response
        assert out["scores"] == [reward]
        assert out["extra_logs"] == {"math_accuracy": [math], "format": [fmt], "masked": [0.0]}


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url, json=body, timeout=30.0)


def test_openrlhf_wire_format_batch_and_errors(gateway_url: str, gsm8k_dir: Path) -> None:
    question, label, answer = gsm8k_item(gsm8k_dir, 301)
    prompt = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    good = f"<think>x</think><answer>{answer}</answer>"
    url = f"{gateway_url}/v1/compat/openrlhf/gsm8k"
    # N samples in one request (OpenRLHF's HTTP helper shards a list): one answer each, in order
    r = post(
        url,
        {
            "query": [prompt + good + "<|im_end|>", prompt + "No idea.</s>"],
            "prompts": [prompt, prompt],
            "labels": [label, label],
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["rewards"] == [1.5, 0.0]
    assert r.headers["x-arbiter-recipe-fingerprint"].startswith("sha256:")

    # the query must start with its prompt: 422 naming the field, in the envelope
    r = post(url, {"query": ["something else"], "prompts": [prompt], "labels": [label]})
    assert r.status_code == 422
    assert r.json()["error"]["param"] == "query.0"
    # lists of different lengths
    r = post(url, {"query": [prompt + good], "prompts": [prompt, prompt], "labels": [label]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "prompts"
    assert r.json()["error"]["message"] == "prompts: 2 items for 1 queries"
    # an unknown recipe is refused before any collection window
    r = post(f"{gateway_url}/v1/compat/openrlhf/nope", {"query": [good], "prompts": [""]})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_recipe"


def test_openrlhf_null_reward_is_an_error_unless_a_fill_value_is_named(
    judge_down_url: str, gsm8k_dir: Path
) -> None:
    """gsm8k-dj needs the judge, which is down behind this gateway: judge_quality is null."""
    question, label, answer = gsm8k_item(gsm8k_dir, 302)
    body = {
        "query": [f"{question}<answer>{answer}</answer><|im_end|>"],
        "prompts": [question],
        "labels": [label],
    }
    url = f"{judge_down_url}/v1/compat/openrlhf/gsm8k-dj"
    r = post(url, body)
    # unavailable is retryable: 503, which OpenRLHF's client retries
    assert r.status_code == 503, r.text
    assert "judge_quality: unavailable" in r.json()["error"]["message"]
    r = post(f"{url}?null_reward=-1", body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["rewards"] == [-1.0]
    assert out["extra_logs"]["judge_quality"] == [-1.0]
    assert out["extra_logs"]["math_accuracy"] == [1.0]
    assert out["extra_logs"]["masked"] == [1.0]
    # a bad query parameter names itself
    r = post(f"{url}?window_ms=-5", body)
    assert r.status_code == 422 and r.json()["error"]["param"] == "window_ms"
