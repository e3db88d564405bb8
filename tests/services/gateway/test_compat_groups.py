"""Group-aware batching: samples of one prompt sent together are scored as one group.

Real processes: gateway → verify + embedding (all-MiniLM-L6-v2 on CPU), Redis. The
samples are posted concurrently in slime's shape (one sample per request); the group
components (diversity) must equal what ``/v1/score`` gives for the same group, and the
gateway's ``arbiter_gateway_compat_group_size`` histogram says how many were scored together.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from tests.conftest import start_service
from tests.services.embedding.conftest import embedding_url  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def diverse_url(
    request: pytest.FixtureRequest, log_dir: Path, verify_url: str, redis_url: str
) -> Iterator[str]:
    embedding: str = request.getfixturevalue("embedding_url")  # imported from its package
    env = {
        "GATEWAY_VERIFY_URL": verify_url,
        "GATEWAY_EMBEDDING_URL": embedding,
        "REDIS_URL": redis_url,
        "GATEWAY_CACHE_ENABLED": "false",  # every case scores afresh
    }
    proc, url = start_service("gateway", log_dir, env)
    yield url
    proc.stop()


def group_of(gsm8k_dir: Path, line: int) -> tuple[str, str, list[str]]:
    row = json.loads((gsm8k_dir / "test.jsonl").read_text().splitlines()[line])
    ans = row["answer"].split("####")[-1].strip().replace(",", "")
    steps = row["answer"].split("####")[0].strip()
    responses = [
        f"<think>{steps}</think><answer>{ans}</answer>",
        f"The answer is {ans}.",
        f"<think>I am not sure, maybe {ans}1?</think><answer>{ans}1</answer>",
        f"<think>Let me think step by step.\n{steps}</think>\n<answer>{ans}</answer>",
    ]
    return row["question"], row["answer"], responses


async def send_all(url: str, bodies: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    """All requests at once, over connections opened beforehand."""
    async with aiohttp.ClientSession() as session:

        async def one(body: dict[str, Any]) -> tuple[int, Any]:
            async with session.post(url, json=body) as resp:
                return resp.status, await resp.json()

        return await asyncio.gather(*(one(b) for b in bodies))


def group_sizes(url: str) -> tuple[float, float]:
    """(count, sum) of the compat group-size histogram."""
    text = httpx.get(f"{url}/metrics").text
    count = re.search(r"^arbiter_gateway_compat_group_size_count (\S+)$", text, re.M)
    total = re.search(r"^arbiter_gateway_compat_group_size_sum (\S+)$", text, re.M)
    return float(count.group(1)) if count else 0.0, float(total.group(1)) if total else 0.0


def slime_bodies(prompt: str, label: str, responses: list[str]) -> list[dict[str, Any]]:
    return [{"prompt": prompt, "response": r, "label": label} for r in responses]


@pytest.mark.parametrize(
    "query",
    [
        "group_size=4&window_ms=10000",  # closes as soon as the fourth sample arrives
        "window_ms=1500",  # closes when the window does: all four arrived within it
    ],
)
def test_samples_sent_together_are_scored_as_one_group(
    diverse_url: str, gsm8k_dir: Path, query: str
) -> None:
    prompt, label, responses = group_of(gsm8k_dir, 400 if "group_size" in query else 401)
    before = group_sizes(diverse_url)
    url = f"{diverse_url}/v1/compat/slime/gsm8k-diverse?{query}"
    answers = asyncio.run(send_all(url, slime_bodies(prompt, label, responses)))
    after = group_sizes(diverse_url)
    assert after[0] - before[0] == 1 and after[1] - before[1] == 4  # one call, four samples
    direct = httpx.post(
        f"{diverse_url}/v1/score",
        json={"recipe": "gsm8k-diverse",
              "groups": [{"prompt": prompt, "reference": label, "responses": responses}]},
        timeout=60.0,
    ).json()["groups"][0]  # fmt: skip
    for j, (status, out) in enumerate(answers):
        assert status == 200, out
        assert out["diversity"] == pytest.approx(direct["components"]["diversity"][j], abs=1e-6)
        assert out["reward"] == pytest.approx(direct["rewards"][j], abs=1e-6)
        assert out["masked"] == 0.0


def test_different_prompts_are_different_groups(diverse_url: str, gsm8k_dir: Path) -> None:
    a = group_of(gsm8k_dir, 402)
    b = group_of(gsm8k_dir, 403)
    bodies = slime_bodies(a[0], a[1], a[2][:2]) + slime_bodies(b[0], b[1], b[2][:3])
    before = group_sizes(diverse_url)
    url = f"{diverse_url}/v1/compat/slime/gsm8k-diverse?window_ms=1500"
    answers = asyncio.run(send_all(url, bodies))
    after = group_sizes(diverse_url)
    assert after[0] - before[0] == 2 and after[1] - before[1] == 5
    assert all(status == 200 for status, _ in answers)


def test_a_lone_sample_has_no_diversity(diverse_url: str, gsm8k_dir: Path) -> None:
    prompt, label, responses = group_of(gsm8k_dir, 404)
    url = f"{diverse_url}/v1/compat/slime/gsm8k-diverse?window_ms=0"
    [(status, out)] = asyncio.run(send_all(url, slime_bodies(prompt, label, responses[:1])))
    # a group of one has no diversity; retrying cannot change that: 422, not 503
    assert status == 422 and out["error"]["code"] == "unscorable"
    assert "group_too_small" in out["error"]["message"]
    [(status, out)] = asyncio.run(
        send_all(f"{url}&null_reward=0", slime_bodies(prompt, label, responses[:1]))
    )
    assert status == 200 and out["masked"] == 1.0 and out["diversity"] == 0.0


def test_a_group_whose_clients_all_left_is_not_scored(diverse_url: str, gsm8k_dir: Path) -> None:
    """The clients give up (disconnect) inside the window: nothing is scored for them."""
    prompt, label, responses = group_of(gsm8k_dir, 405)
    url = f"{diverse_url}/v1/compat/slime/gsm8k-diverse?window_ms=1000"
    before = group_sizes(diverse_url)

    async def give_up() -> None:
        timeout = aiohttp.ClientTimeout(total=0.3)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def one(body: dict[str, Any]) -> None:
                with pytest.raises(asyncio.TimeoutError):
                    async with session.post(url, json=body) as resp:
                        await resp.read()

            await asyncio.gather(*(one(b) for b in slime_bodies(prompt, label, responses[:2])))

    asyncio.run(give_up())
    time.sleep(1.5)  # past the window: a batch with a waiter left would have been scored
    assert group_sizes(diverse_url) == before
    # the same prompt right after: a new group, scored normally
    answers = asyncio.run(
        send_all(f"{url}&group_size=2", slime_bodies(prompt, label, responses[:2]))
    )
    assert [s for s, _ in answers] == [200, 200]
    assert group_sizes(diverse_url)[1] - before[1] == 2
