"""NeMo Gym 0.7.0's resources-server ``POST /verify`` against the real gateway.

NeMo Gym 0.7.0 needs Python >= 3.13, so it does not install here; the shapes are from its
source. ``responses_api_agents/simple_agent/app.py`` posts ``body.model_dump() |
{"response": model_response_json}``: the dataset row (``responses_create_params`` plus its
own fields such as ``expected_answer``, as in ``resources_servers/math_with_judge``) and
the Responses-API response. ``nemo_gym/base_resources_server.py``: ``BaseVerifyResponse``
is the request echoed with ``reward: float``, ``mask_sample: bool``, ``failure_kind``,
``failure_reason``; ``BaseMultiRewardVerifyResponse`` adds ``reward_components:
dict[str, float]``. The request below has the field set of a rollout in NeMo Gym's own
``resources_servers/math_with_judge/data/example_rollouts.jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest


def verify_body(question: str, answer_text: str, output_text: str) -> dict[str, Any]:
    return {
        "responses_create_params": {
            "input": [{"content": question, "role": "user", "type": "message"}],
            "instructions": None,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "temperature": None,
        },
        "response": {
            "id": "resp_1",
            "created_at": 1761955953.0,
            "model": "policy",
            "object": "response",
            "output": [
                {"id": "rs_1", "summary": [], "type": "reasoning", "encrypted_content": None},
                {
                    "id": "msg_1",
                    "content": [
                        {
                            "annotations": [],
                            "text": output_text,
                            "type": "output_text",
                            "logprobs": [],
                        },
                    ],
                    "role": "assistant",
                    "status": "completed",
                    "type": "message",
                },
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "status": "completed",
            "usage": {"input_tokens": 84, "output_tokens": 12, "total_tokens": 96},
        },
        "question": question,
        "expected_answer": answer_text,
    }


@pytest.fixture(scope="module")
def item(gsm8k_dir: Path) -> tuple[str, str, int]:
    row = json.loads((gsm8k_dir / "test.jsonl").read_text().splitlines()[320])
    return row["question"], row["answer"], int(row["answer"].split("####")[-1].replace(",", ""))


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url, json=body, timeout=30.0)


def test_nemo_gym_verify_echoes_the_request_with_reward_and_components(
    gateway_url: str, item: tuple[str, str, int]
) -> None:
    question, answer_text, answer = item
    body = verify_body(question, answer_text, f"<think>ok</think><answer>{answer}</answer>")
    r = post(f"{gateway_url}/v1/compat/nemo-gym/gsm8k/verify", body)
    assert r.status_code == 200, r.text
    out = r.json()
    # BaseVerifyRequest echoed unchanged, the dataset row's own fields included
    for key in ("responses_create_params", "response", "question", "expected_answer"):
        assert out[key] == body[key], key
    assert out["reward"] == 1.5
    assert out["reward_components"] == {"math_accuracy": 1.0, "format": 1.0}
    assert out["math_accuracy"] == 1.0 and out["format"] == 1.0  # top level, for metrics
    assert out["mask_sample"] is False
    assert out["failure_kind"] is None and out["failure_reason"] is None


def test_nemo_gym_reference_field_and_masking(
    gateway_url: str, judge_down_url: str, item: tuple[str, str, int]
) -> None:
    question, answer_text, answer = item
    body = verify_body(question, "", f"The answer is {answer}.")
    del body["expected_answer"]
    body["gold"] = answer_text
    url = f"{gateway_url}/v1/compat/nemo-gym/gsm8k/verify"
    # the reference in a field of the caller's choosing
    r = post(f"{url}?reference_field=gold", body)
    assert r.status_code == 200, r.text
    assert r.json()["reward_components"] == {"math_accuracy": 1.0, "format": 0.0}
    # the judge is down: the reward is not a measurement, so mask_sample
    r = post(f"{judge_down_url}/v1/compat/nemo-gym/gsm8k-dj/verify?reference_field=gold", body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["mask_sample"] is True and out["reward"] == 0.0
    assert out["failure_kind"] == "provider_unavailable"
    assert "judge_quality" in out["failure_reason"]
    assert "judge_quality" not in out["reward_components"]
    assert out["reward_components"]["math_accuracy"] == 1.0
    # a request without the Responses-API response is refused, naming the field
    del body["response"]
    r = post(url, body)
    assert r.status_code == 422 and r.json()["error"]["param"] == "response"
