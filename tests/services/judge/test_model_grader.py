"""OpenAI's model graders (``score_model``, ``label_model``) through the judge: the
official ``openai`` package's ``graders.run`` against a gateway whose judge is the judge
service in front of the real vLLM server (the tiny random model, CPU). A random model's
verdict is not known in advance; what is: structured outputs hold it to the labels, and
a reply outside the shape is a null with OpenAI's parse flag, never a made-up score."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from arbiter.procs import free_port
from tests.conftest import start_service

MESSAGES = [
    {"role": "system", "content": "You grade answers."},
    {"role": "user",
     "content": "Reference: {{ item.reference_answer }}\nAnswer: {{ sample.output_text }}"},
]  # fmt: skip
LABEL = {
    "type": "label_model",
    "name": "label",
    "model": "gpt-4o-2024-08-06",
    "input": MESSAGES,
    "labels": ["correct", "incorrect"],
    "passing_labels": ["correct", "incorrect"],  # whichever it picks passes: 1.0
}
SCORE = {
    "type": "score_model",
    "name": "score",
    "model": "gpt-4o-2024-08-06",
    "input": MESSAGES,
    "range": [0, 10],
    "sampling_params": {"temperature": 0, "max_completions_tokens": 64, "seed": 1},
}
ITEM = {"reference_answer": "Paris"}


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def gateway(log_dir: Path, verify_url: str, redis_url: str, judge_url: str) -> Iterator[str]:
    env = {"GATEWAY_VERIFY_URL": verify_url, "REDIS_URL": redis_url, "GATEWAY_JUDGE_URL": judge_url}
    proc, url = start_service("gateway", log_dir, env)
    yield url
    proc.stop()


def test_a_label_model_grader_picks_a_label_the_grader_lists(gateway: str) -> None:
    out = _client(gateway).fine_tuning.alpha.graders.run(
        grader=_typed(LABEL), model_sample="Paris", item=ITEM
    )
    assert out.reward == 1.0, out
    assert (out.metadata.token_usage or 0) > 0, out
    assert out.api_model_grader_token_usage_per_model == {LABEL["model"]: out.metadata.token_usage}


def test_a_score_model_grader_scores_in_its_range_or_says_it_could_not_parse(gateway: str) -> None:
    out = _client(gateway).fine_tuning.alpha.graders.run(
        grader=_typed(SCORE), model_sample="Paris", item=ITEM
    )
    if out.reward is None:
        assert out.metadata.errors.api_model_grader_parse_error, out
    else:
        assert 0 <= out.reward <= 10, out
    assert (out.metadata.token_usage or 0) > 0, out


def test_a_judge_that_is_down_is_null_with_the_server_error(
    log_dir: Path, verify_url: str, redis_url: str
) -> None:
    env = {"GATEWAY_VERIFY_URL": verify_url, "REDIS_URL": redis_url,
           "GATEWAY_JUDGE_URL": f"http://127.0.0.1:{free_port()}"}  # fmt: skip
    proc, url = start_service("gateway", log_dir, env)
    try:
        sample = f"Paris {time.monotonic_ns()}"  # not in the cache the other tests filled
        out = _client(url).fine_tuning.alpha.graders.run(
            grader=_typed(LABEL), model_sample=sample, item=ITEM
        )
    finally:
        proc.stop()
    assert out.reward is None, out
    assert out.metadata.errors.api_model_grader_server_error, out


def _typed(raw: dict[str, Any]) -> Any:
    """A grader's JSON as the openai package's typed parameter (a TypedDict)."""
    return raw
