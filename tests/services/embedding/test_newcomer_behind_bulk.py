"""Issue 31's scenario against the real service (uvicorn, all-MiniLM-L6-v2 on CPU, default
settings: the CPU's batch token budget): team "bulk" queues 30 requests of 64 long texts
(~246 tokens each, ~470k tokens in all); team "new" then sends 8 short texts.

Counted, not timed (the CPU is shared; wall time is not asserted): while the newcomer
waited, the service encoded at most the batch in flight, the one already collected and
the newcomer's own, each within the budget. Before the budget, "two batches ahead" were two
batches of 512 long texts (~260k tokens, 41 s on an idle 2-core CPU, past the gateway's
deadline); now it is ~2 s there. Then bulk's clients leave and their queued texts go.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx

from arbiter.proto.common import TEAM_HEADER
from arbiter.services.embedding.settings import CPU_TOKEN_BUDGET

BULK_REQUESTS, BULK_TEXTS = 30, 64


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30.0).text
    names = (
        "arbiter_embedding_batch_texts_count",
        "arbiter_embedding_tokens_total",
        "arbiter_embedding_queued_texts",
    )
    out = {}
    for name in names:
        match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        assert match, name
        out[name] = float(match.group(1))
    return out


def body(responses: list[str]) -> dict[str, Any]:
    return {"groups": [{"id": "g", "responses": responses}], "params": {}}


async def scenario(url: str, long_texts: list[list[str]], short: list[str]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=600.0) as bulk_client:
        bulk = [
            asyncio.ensure_future(
                bulk_client.post("/v1/diversity", json=body(texts), headers={TEAM_HEADER: "bulk"})
            )
            for texts in long_texts
        ]
        deadline = time.monotonic() + 120
        while metrics(url)["arbiter_embedding_queued_texts"] < BULK_TEXTS * BULK_REQUESTS // 2:
            assert time.monotonic() < deadline, "bulk's texts were never queued"
            await asyncio.sleep(0.2)
        before = metrics(url)
        async with httpx.AsyncClient(base_url=url, timeout=600.0) as new_client:
            r = await new_client.post("/v1/diversity", json=body(short),
                                      headers={TEAM_HEADER: "new"})  # fmt: skip
        after = metrics(url)
        still_running = sum(not f.done() for f in bulk)
        for f in bulk:  # bulk's clients leave: the service cancels their requests
            f.cancel()
        await asyncio.gather(*bulk, return_exceptions=True)
    return {"answer": r, "before": before, "after": after, "bulk_running": still_running}


def test_newcomer_waits_for_at_most_two_budgeted_batches_behind_a_bulk_team(
    embedding_url: str, gsm8k_answers: list[str]
) -> None:
    n = BULK_REQUESTS * BULK_TEXTS
    long = [" ".join(gsm8k_answers[(3 * i + j) % 1000] for j in range(3)) for i in range(n)]
    long_texts = [long[r * BULK_TEXTS : (r + 1) * BULK_TEXTS] for r in range(BULK_REQUESTS)]
    short = [a.split("\n")[0] for a in gsm8k_answers[1100:1108]]
    out = asyncio.run(scenario(embedding_url, long_texts, short))

    r = out["answer"]
    assert r.status_code == 200, r.text
    (group,) = r.json()["groups"]
    assert group["errors"] == [] and None not in group["scores"]  # diversity on all 8
    assert out["bulk_running"] > 0  # the newcomer was not simply served after bulk
    before, after = out["before"], out["after"]
    batches = (
        after["arbiter_embedding_batch_texts_count"] - before["arbiter_embedding_batch_texts_count"]
    )
    tokens = after["arbiter_embedding_tokens_total"] - before["arbiter_embedding_tokens_total"]
    # in flight, collected and prepared, the newcomer's own (sharing it with bulk)
    assert batches <= 3, batches
    assert tokens <= 3 * CPU_TOKEN_BUDGET, tokens

    # bulk's queued texts left with its clients: the service is idle again soon
    deadline = time.monotonic() + 300
    while metrics(embedding_url)["arbiter_embedding_queued_texts"] > 0:
        assert time.monotonic() < deadline, "bulk's texts stayed queued after its clients left"
        time.sleep(0.5)
