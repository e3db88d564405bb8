"""One bad input fails only its own request, over HTTP (real uvicorn, the real model).

Before, 16 normal ``/v1/diversity`` calls batched with one holding a lone surrogate all
got 500: the tokenizer refused the batch. Now the bad call alone is refused (422, before
any work, or after its batch failed and each request was encoded alone) and the others
get their scores, round after round.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from tests.services.embedding.test_service import MODEL

BAD = "lone surrogate \ud800 here"


def _raw(body: dict[str, Any]) -> bytes:
    # ensure_ascii writes the surrogate as the JSON escape \ud800 (UTF-8 cannot hold it)
    return json.dumps(body).encode()


async def test_bad_text_fails_only_its_own_request(
    embedding_url: str, gsm8k_answers: list[str]
) -> None:
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=embedding_url, timeout=120.0) as client:

        async def diversity(k: int, bad: bool) -> httpx.Response:
            responses = gsm8k_answers[5 * k : 5 * k + 5]
            if bad:
                responses = [*responses[:2], BAD, *responses[3:]]
            body = {"groups": [{"id": f"g{k}", "responses": responses}], "params": {}}
            return await client.post("/v1/diversity", content=_raw(body), headers=headers)

        async def embeddings(bad: bool) -> httpx.Response:
            body = {"input": ["fine", BAD if bad else "also fine"], "model": MODEL}
            return await client.post("/v1/embeddings", content=_raw(body), headers=headers)

        for _ in range(3):
            calls = [diversity(k, bad=False) for k in range(16)]
            calls.insert(9, diversity(99, bad=True))
            calls += [embeddings(bad=False), embeddings(bad=True)]
            answers = await asyncio.gather(*calls)
            bad_div, bad_emb = answers.pop(9), answers.pop()
            for r in answers:
                assert r.status_code == 200, r.text
            for r in (bad_div, bad_emb):
                assert r.status_code == 422, r.text
                assert r.json()["error"]["type"] == "invalid_request_error"
            scores = [s for r in answers[:16] for s in r.json()["groups"][0]["scores"]]
            assert all(isinstance(s, float) for s in scores)
