"""The graders API is a route like every other: the caller's key (401 without one), its
team's quota (429 past it) and usage ledger. A real gateway with a keys file, verify and
Redis; the official ``openai`` package as the client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.services.gateway.teams import Keys, running_gateway, usage

CHECK: Any = {"type": "string_check", "name": "check", "operation": "eq",
              "input": "{{ sample.output_text }}", "reference": "{{ item.label }}"}  # fmt: skip


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    k = Keys(tmp_path_factory.mktemp("graders-keys") / "keys.yaml")
    k.add("free", "free")
    k.add("tight", "tight", responses_per_minute=1)
    return k


@pytest.fixture(scope="module")
def gateway(log_dir: Path, verify_url: str, redis_url: str, keys: Keys) -> Iterator[str]:
    with running_gateway(log_dir, verify_url, redis_url, keys) as url:
        yield url


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def run(c: openai.OpenAI) -> Any:
    sample = f"positive {time.monotonic_ns()}"  # a new sample: no cache hit
    return c.fine_tuning.alpha.graders.run(
        grader=CHECK, model_sample=sample, item={"label": sample}
    )


def test_an_unknown_key_is_401(gateway: str) -> None:
    with pytest.raises(openai.AuthenticationError):
        run(client(gateway, "not-a-key"))
    with pytest.raises(openai.AuthenticationError):
        client(gateway, "not-a-key").fine_tuning.alpha.graders.validate(grader=CHECK)


def test_a_run_is_charged_to_the_teams_ledger(gateway: str, keys: Keys) -> None:
    before = usage(gateway, keys.headers("free"))["days"]
    assert run(client(gateway, keys.keys["free"])).reward == 1.0
    after = usage(gateway, keys.headers("free"))["days"]

    def total(days: list[dict[str, Any]], name: str) -> int:
        return sum(int(d.get(name, 0)) for d in days)

    assert total(after, "requests") - total(before, "requests") == 1
    assert total(after, "responses") - total(before, "responses") == 1


def test_past_the_quota_is_429(gateway: str, keys: Keys) -> None:
    c = client(gateway, keys.keys["tight"])
    assert run(c).reward == 1.0  # the minute's one response
    with pytest.raises(openai.RateLimitError):
        run(c)
