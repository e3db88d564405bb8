"""The embedding service over HTTP (real uvicorn, all-MiniLM-L6-v2 on CPU)."""

from __future__ import annotations

import asyncio
import base64
import re
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from arbiter.services.embedding.scoring import diversity_scores, normalize_scores
from tests.services.common.hostile import check_hostile_bodies
from tests.services.embedding.conftest import MAX_INPUTS

MODEL = "all-MiniLM-L6-v2"


def diversity(url: str, groups: list[dict[str, Any]], normalize: str = "none") -> dict[str, Any]:
    body = {"groups": groups, "params": {"normalize": normalize}}
    r = httpx.post(f"{url}/v1/diversity", json=body, timeout=60.0)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def embed(url: str, texts: list[str]) -> np.ndarray:
    r = httpx.post(f"{url}/v1/embeddings", json={"input": texts, "model": MODEL}, timeout=60.0)
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def test_health_ready_models(embedding_url: str) -> None:
    assert httpx.get(f"{embedding_url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{embedding_url}/readyz").json()
    assert ready == {"ready": True, "checks": {"model": "ok"}}
    models = httpx.get(f"{embedding_url}/v1/models").json()
    assert models["data"][0] == {
        "id": MODEL, "object": "model", "owned_by": "arbiter",
        "dimensions": 384, "max_seq_length": 256,
    }  # fmt: skip


def test_identical_responses_score_zero(embedding_url: str, gsm8k_answers: list[str]) -> None:
    same = [gsm8k_answers[0]] * 4
    for mode in ("none", "group_minmax", "group_zscore"):
        out = diversity(embedding_url, [{"id": "g", "responses": same}], mode)
        (group,) = out["groups"]
        assert group["errors"] == []
        assert all(abs(s) < 1e-6 for s in group["scores"]), (mode, group["scores"])


@pytest.mark.parametrize("mode", ["none", "group_minmax", "group_zscore"])
def test_diversity_equals_numpy_on_the_service_embeddings(
    embedding_url: str, gsm8k_answers: list[str], mode: str
) -> None:
    responses = gsm8k_answers[10:18]
    out = diversity(embedding_url, [{"id": "g", "responses": responses}], mode)
    (group,) = out["groups"]
    expected = normalize_scores(diversity_scores(embed(embedding_url, responses)), mode)  # type: ignore[arg-type]
    np.testing.assert_allclose(group["scores"], expected, atol=1e-5)
    assert group["id"] == "g" and group["info"] == {"truncated": []}
    assert out["usage"]["items"] == 8 and out["usage"]["prompt_tokens"] > 8 * 20


def test_groups_are_independent(embedding_url: str, gsm8k_answers: list[str]) -> None:
    a, b = gsm8k_answers[20:24], gsm8k_answers[24:30]
    together = diversity(embedding_url, [{"id": "a", "responses": a}, {"id": "b", "responses": b}])
    alone_a = diversity(embedding_url, [{"id": "a", "responses": a}])
    assert [g["id"] for g in together["groups"]] == ["a", "b"]
    np.testing.assert_allclose(together["groups"][0]["scores"], alone_a["groups"][0]["scores"])


SMALL_GROUPS = [
    # one response: nothing to compare with
    (["only one"], [None], [(0, "group_too_small")]),
    # an empty response is not embedded; the one left is alone
    (["some text", ""], [None, None], [(0, "group_too_small"), (1, "empty_response")]),
    # whitespace only counts as empty
    (["  \n\t", "x"], [None, None], [(0, "empty_response"), (1, "group_too_small")]),
    # all empty
    (["", " "], [None, None], [(0, "empty_response"), (1, "empty_response")]),
]


@pytest.mark.parametrize(("responses", "scores", "errors"), SMALL_GROUPS)
def test_small_and_empty_groups(
    embedding_url: str,
    responses: list[str],
    scores: list[float | None],
    errors: list[tuple[int, str]],
) -> None:
    (group,) = diversity(embedding_url, [{"id": "g", "responses": responses}])["groups"]
    assert group["scores"] == scores
    assert [(e["index"], e["kind"]) for e in group["errors"]] == errors


def test_empty_response_is_left_out_of_the_mean(
    embedding_url: str, gsm8k_answers: list[str]
) -> None:
    texts = gsm8k_answers[30:33]
    (with_empty,) = diversity(embedding_url, [{"responses": [texts[0], "", *texts[1:]]}])["groups"]
    (without,) = diversity(embedding_url, [{"responses": texts}])["groups"]
    assert with_empty["scores"][1] is None
    kept = [s for i, s in enumerate(with_empty["scores"]) if i != 1]
    np.testing.assert_allclose(kept, without["scores"], atol=1e-6)


async def test_concurrent_callers_get_their_own_rows(
    embedding_url: str, gsm8k_answers: list[str]
) -> None:
    callers = 32  # distinct short texts, 2 per caller: the row bookkeeping is what is tested
    texts = [
        [a.split("\n")[0] for a in gsm8k_answers[100 + 2 * c : 102 + 2 * c]] for c in range(callers)
    ]
    before = _metric(embedding_url, "arbiter_embedding_batch_requests_sum")
    batches_before = _metric(embedding_url, "arbiter_embedding_batch_requests_count")
    async with httpx.AsyncClient(base_url=embedding_url, timeout=120.0) as client:

        async def call(chunk: list[str]) -> np.ndarray:
            r = await client.post("/v1/embeddings", json={"input": chunk, "model": MODEL})
            assert r.status_code == 200, r.text
            return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)

        together = await asyncio.gather(*(call(chunk) for chunk in texts))
        requests = _metric(embedding_url, "arbiter_embedding_batch_requests_sum") - before
        batches = _metric(embedding_url, "arbiter_embedding_batch_requests_count") - batches_before
        alone = [await call([t]) for chunk in texts for t in chunk]
    assert requests == callers
    assert batches < callers  # requests were coalesced into shared encode calls
    np.testing.assert_allclose(np.concatenate(together), np.concatenate(alone), atol=2e-5)


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


def test_openai_client_float_and_base64(embedding_url: str, gsm8k_answers: list[str]) -> None:
    client = openai.OpenAI(base_url=f"{embedding_url}/v1", api_key="unused")
    texts = gsm8k_answers[40:43]
    floats = client.embeddings.create(input=texts, model=MODEL, encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1, 2]
    assert floats.model == MODEL and len(floats.data[0].embedding) == 384
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 3 * 20
    # the client asks for base64 by default and decodes it itself
    default = client.embeddings.create(input=texts, model=MODEL)
    np.testing.assert_allclose(
        [d.embedding for d in default.data], [d.embedding for d in floats.data], atol=1e-6
    )
    one = client.embeddings.create(input=texts[0], model=MODEL)
    assert len(one.data) == 1
    np.testing.assert_allclose(one.data[0].embedding, floats.data[0].embedding, atol=2e-5)
    assert np.linalg.norm(one.data[0].embedding) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(input="x", model="text-embedding-3-small")


def test_base64_is_little_endian_float32(embedding_url: str) -> None:
    body = {"input": ["hello"], "model": MODEL, "encoding_format": "base64"}
    b64 = httpx.post(f"{embedding_url}/v1/embeddings", json=body).json()["data"][0]["embedding"]
    vec = np.frombuffer(base64.b64decode(b64), dtype="<f4")
    np.testing.assert_allclose(vec, embed(embedding_url, ["hello"])[0], atol=0)


def test_truncation_is_reported(embedding_url: str, gsm8k_answers: list[str]) -> None:
    long_text = " ".join(gsm8k_answers[50:60])  # ~1,000 tokens > 256
    responses = [gsm8k_answers[0], long_text, gsm8k_answers[1]]
    (group,) = diversity(embedding_url, [{"responses": responses}])["groups"]
    assert group["info"] == {"truncated": [1]} and None not in group["scores"]
    r = httpx.post(
        f"{embedding_url}/v1/embeddings", json={"input": [long_text, "short"], "model": MODEL}
    ).json()
    assert r["truncated"] == [0]
    single = httpx.post(
        f"{embedding_url}/v1/embeddings", json={"input": [long_text], "model": MODEL}
    ).json()
    assert single["usage"]["prompt_tokens"] == 256  # the model's limit, specials included


OK_GROUP = {"responses": ["a", "b"]}
BAD_REQUESTS = [
    # no groups at all
    ("/v1/diversity", {"groups": [], "params": {}}, 422, "groups"),
    # a group without responses
    ("/v1/diversity", {"groups": [{"responses": []}], "params": {}}, 422, "groups.0.responses"),
    # a response that is not a string
    ("/v1/diversity", {"groups": [{"responses": ["a", 7]}], "params": {}}, 422,
     "groups.0.responses.1"),
    # more texts than EMBEDDING_MAX_INPUTS, across groups: 413 like verify's VERIFY_MAX_ITEMS
    ("/v1/diversity", {"groups": [{"responses": ["t"] * 40}] * 2, "params": {}}, 413, "groups"),
    # unknown normalize mode
    ("/v1/diversity", {"groups": [OK_GROUP], "params": {"normalize": "softmax"}}, 422,
     "params.normalize"),
    # a typo'd field is refused, not ignored
    ("/v1/diversity", {"groups": [OK_GROUP], "params": {}, "normalise": "x"}, 422, "normalise"),
    # empty input list
    ("/v1/embeddings", {"input": [], "model": MODEL}, 422, "input"),
    # token ids / non-strings are not supported
    ("/v1/embeddings", {"input": ["ok", 42], "model": MODEL}, 422, "input.1"),
    ("/v1/embeddings", {"input": [[1, 2, 3]], "model": MODEL}, 422, "input.0"),
    # an empty string (OpenAI refuses it too)
    ("/v1/embeddings", {"input": "", "model": MODEL}, 422, "input.0"),
    # more than EMBEDDING_MAX_INPUTS
    ("/v1/embeddings", {"input": ["t"] * (MAX_INPUTS + 1), "model": MODEL}, 413, "input"),
    # more than the wire limit of 2048
    ("/v1/embeddings", {"input": ["t"] * 2049, "model": MODEL}, 422, "input"),
    # unknown encoding
    ("/v1/embeddings", {"input": "x", "model": MODEL, "encoding_format": "int8"}, 422,
     "encoding_format"),
    # model is required, as in OpenAI's API
    ("/v1/embeddings", {"input": "x"}, 422, "model"),
    # a model this service does not serve
    ("/v1/embeddings", {"input": "x", "model": "other"}, 404, "model"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_REQUESTS)
def test_bad_input_gets_the_envelope(
    embedding_url: str, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    r = httpx.post(f"{embedding_url}{path}", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(r.json()) == {"error"}
    assert error["param"] == param, error
    assert error["type"] in ("invalid_request_error", "not_found", "payload_too_large")
    assert error["message"]


@pytest.mark.parametrize(
    ("path", "body", "nested"),
    [
        ("/v1/diversity", {"groups": [{"responses": ["a", "b"]}], "params": {}}, "params"),
        ("/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": ["a"]}, None),
    ],
)
def test_hostile_keys_are_422_and_short(
    embedding_url: str, path: str, body: dict[str, Any], nested: str | None
) -> None:
    # A lone surrogate in an object key: a 500 once; a 1 MB key:
    # echoed whole before.
    check_hostile_bodies(embedding_url, path, body, nested)
