"""One embedding service (real uvicorn, all-MiniLM-L6-v2 on CPU) for this package's tests."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import start_service

# Small enough that "too many inputs" is cheap to provoke; big enough for every other test.
MAX_INPUTS = 64


def wait_ready(url: str, timeout: float = 120.0) -> None:
    """start_service waits for /healthz; the model loads after that, /readyz says when."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        r = httpx.get(f"{url}/readyz", timeout=5.0)
        if r.status_code == 200:
            return
        last = r.text
        time.sleep(0.2)
    raise TimeoutError(f"embedding not ready after {timeout:.0f}s: {last}")


@pytest.fixture(scope="session")
def embedding_url(log_dir: Path) -> Iterator[str]:
    proc, url = start_service(
        "embedding", log_dir, {"EMBEDDING_MAX_INPUTS": str(MAX_INPUTS), "EMBEDDING_DEVICE": "cpu"}
    )
    try:
        wait_ready(url)
        yield url
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def gsm8k_answers(gsm8k_dir: Path) -> list[str]:
    """GSM8K reference solutions: realistic response-length texts (~100 tokens)."""
    with open(gsm8k_dir / "test.jsonl") as f:
        return [json.loads(line)["answer"] for line in f]
