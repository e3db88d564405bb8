"""EMBEDDING_ENCODE_WORKER=process: the model in a child process gives the same rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from arbiter.services.embedding.encoder_process import ProcessEncoder
from arbiter.services.embedding.settings import EmbeddingSettings
from tests.conftest import start_service
from tests.services.embedding.conftest import wait_ready


@pytest.fixture(scope="module")
def process_worker_url(log_dir: Path) -> Iterator[str]:
    env = {"EMBEDDING_ENCODE_WORKER": "process", "EMBEDDING_DEVICE": "cpu"}
    proc, url = start_service("embedding", log_dir, env)
    try:
        wait_ready(url)
        yield url
    finally:
        proc.stop()


def test_process_worker_matches_thread_worker(
    process_worker_url: str, embedding_url: str, gsm8k_answers: list[str]
) -> None:
    body = {"groups": [{"id": "g", "responses": gsm8k_answers[300:306]}], "params": {}}
    a = httpx.post(f"{process_worker_url}/v1/diversity", json=body, timeout=120).json()
    b = httpx.post(f"{embedding_url}/v1/diversity", json=body, timeout=120).json()
    np.testing.assert_allclose(a["groups"][0]["scores"], b["groups"][0]["scores"], atol=1e-6)
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    ready = httpx.get(f"{process_worker_url}/readyz").json()
    assert ready == {"ready": True, "checks": {"model": "ok"}}


def test_process_worker_counts_tokens_as_the_model_does(gsm8k_answers: list[str]) -> None:
    # the parent counts with the child's Rust tokenizer (sent at start, truncation
    # included), for the token budget, without loading the model itself
    settings = EmbeddingSettings(device="cpu")
    texts = [*gsm8k_answers[400:404], "x", " ".join(gsm8k_answers[60:70])]
    child = ProcessEncoder(settings)
    try:
        counted = child.count(texts)
        np.testing.assert_array_equal(counted, child.encode(texts).tokens)
    finally:
        child.close()
