"""The judge against the real vLLM OpenAI server serving the tiny random model.

The model is random, so its verdicts are noise; these tests assert what must hold for
any model: structured output parses into the range, the verifier probability is exactly
the one the returned log-probs give, tokens are counted, a server error is a null with
its kind. Kept few: CI has 2 cores and every request here runs the real model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.proto.common import TEAM_HEADER
from arbiter.proto.components import ScoreGroup
from arbiter.proto.judge import QualityParams, QualityRequest, VerifierParams, VerifierRequest
from arbiter.services.judge.scoring import Judge
from arbiter.services.judge.settings import JudgeSettings
from tests.conftest import VLLMServer
from tests.services.judge.capture import FIXTURES, capture

GROUP = {
    "id": "natalia",
    "prompt": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
    "many clips in May. How many clips did Natalia sell altogether in April and May?",
    "reference": "Natalia sold 48/2 = 24 clips in May.\n#### 72",
    "responses": [
        "<think>48 / 2 = 24, 48 + 24 = 72</think><answer>72</answer>",
        "<think>48 + 48 = 96</think><answer>96</answer>",
        "The answer is 72.",
    ],
}


def _direct_p_yes(body: dict[str, Any]) -> float | None:
    """Recompute from vLLM's own reply: sum exp over Yes/No spellings, renormalise."""
    top = body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    yes = sum(math.exp(e["logprob"]) for e in top if e["token"].strip().lower() == "yes")
    no = sum(math.exp(e["logprob"]) for e in top if e["token"].strip().lower() == "no")
    return None if yes + no == 0 else yes / (yes + no)


async def test_ready_against_vllm(judge_url: str) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(f"{judge_url}/readyz")
    assert r.status_code == 200, r.text
    assert r.json()["checks"] == {"judge_server": "ok", "model": "ok", "logprobs": "ok"}


async def test_quality_structured_output_in_range(judge_url: str) -> None:
    async with httpx.AsyncClient(timeout=120) as http:
        r = await http.post(f"{judge_url}/v1/quality", json={"groups": [GROUP], "params": {}})
    assert r.status_code == 200, r.text
    body = r.json()
    group = body["groups"][0]
    assert group["errors"] == []
    assert all(s is not None and 0.0 <= s <= 1.0 for s in group["scores"])
    for score, info in zip(group["scores"], group["info"]["judge"], strict=True):
        assert info["source"] == "json_schema"
        assert all(1 <= info[d] <= 5 for d in ("correctness", "reasoning", "clarity", "overall"))
        assert score == pytest.approx((info["overall"] - 1) / 4)
    usage = body["usage"]
    assert usage["items"] == 3
    assert usage["prompt_tokens"] > 3 * 100 and usage["completion_tokens"] >= 3 * 10


async def test_quality_text_mode_nulls_unparseable(vllm_server: VLLMServer) -> None:
    # Without a grammar the random model writes no score: null + judge_parse_error, never 0.
    judge = Judge(
        JudgeSettings(
            base_url=vllm_server.base_url, model=vllm_server.model, structured_output="none"
        )
    )
    try:
        req = QualityRequest(groups=[ScoreGroup(**GROUP)], params=QualityParams(max_tokens=32))
        res = await judge.quality(req)
    finally:
        await judge.aclose()
    group = res.groups[0]
    kinds = {e.index: e.kind for e in group.errors}
    for i, score in enumerate(group.scores):
        if score is None:
            assert kinds[i] == "judge_parse_error"
        else:
            assert 0.0 <= score <= 1.0
    assert res.usage.completion_tokens > 0


def _vocab(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


@pytest.mark.parametrize(
    "params",
    [
        # top 5, unconstrained (a random model rarely lists Yes/No there: judge_no_label)
        {"top_logprobs": 5, "constrain_labels": False},
        # the whole vocabulary (vLLM --max-logprobs -1): both labels always listed
        {"top_logprobs": "vocab", "constrain_labels": False},
        # vLLM's choice constraint: both labels in the top 5, ratio unchanged
        {"top_logprobs": 5, "constrain_labels": True},
    ],
)
async def test_verifier_equals_direct_logprobs(
    judge_url: str, vllm_server: VLLMServer, tiny_model_dir: Path, params: dict[str, Any]
) -> None:
    if params["top_logprobs"] == "vocab":
        params = {**params, "top_logprobs": _vocab(tiny_model_dir)}
    async with httpx.AsyncClient(timeout=120) as http:
        r = await http.post(f"{judge_url}/v1/verifier", json={"groups": [GROUP], "params": params})
        assert r.status_code == 200, r.text
        got = r.json()
        # The same request, straight to vLLM, built by the judge's own payload code.
        judge = Judge(JudgeSettings(base_url=vllm_server.base_url, model=vllm_server.model))
        req = VerifierRequest(groups=[ScoreGroup(**GROUP)], params=VerifierParams(**params))
        direct = []
        for resp in GROUP["responses"]:
            payload = judge.verifier_payload(req.groups[0], resp, req)
            d = await http.post(
                f"{vllm_server.base_url}/chat/completions",
                json={"model": vllm_server.model, **payload},
            )
            assert d.status_code == 200, d.text
            direct.append(_direct_p_yes(d.json()))
        await judge.aclose()
    group = got["groups"][0]
    kinds = {e["index"]: e["kind"] for e in group["errors"]}
    for i, (score, expected) in enumerate(zip(group["scores"], direct, strict=True)):
        if expected is None:
            assert score is None and kinds[i] == "judge_no_label"
        else:
            assert score == pytest.approx(expected, abs=1e-4)
            assert 0.0 <= score <= 1.0
    if params["top_logprobs"] > 5 or params.get("constrain_labels"):
        assert None not in group["scores"]
    assert got["usage"]["prompt_tokens"] > 0 and got["usage"]["completion_tokens"] == 3


async def test_prompt_too_long_is_bad_response(judge_url: str) -> None:
    # vLLM answers 400 (context length): that item is null with the server's reason
    group = {**GROUP, "prompt": "seven " * 3000, "responses": ["72"]}
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{judge_url}/v1/verifier", json={"groups": [group], "params": {}})
    assert r.status_code == 200, r.text
    g = r.json()["groups"][0]
    assert g["scores"] == [None]
    assert g["errors"][0]["kind"] == "bad_response"
    assert "context length" in g["errors"][0]["message"]


async def test_metrics_count_tokens_and_prefix_cache(judge_url: str) -> None:
    # two groups share the rubric (system message first): the server's prefix cache serves it
    async with httpx.AsyncClient(timeout=120) as http:
        for _ in range(2):
            r = await http.post(f"{judge_url}/v1/quality", json={"groups": [GROUP], "params": {}})
            assert r.status_code == 200
        text = (await http.get(f"{judge_url}/metrics")).text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("arbiter_judge_tokens_total{")
    }
    quality = 'component="judge_quality"'
    assert samples[f'arbiter_judge_tokens_total{{{quality},type="prompt"}}'] > 0
    assert samples[f'arbiter_judge_tokens_total{{{quality},type="completion"}}'] > 0
    assert samples[f'arbiter_judge_tokens_total{{{quality},type="cached_prompt"}}'] > 0


async def _cached_tokens(http: httpx.AsyncClient, url: str) -> float:
    text = (await http.get(f"{url}/metrics")).text
    line = 'arbiter_judge_tokens_total{component="judge_quality",type="cached_prompt"} '
    return sum(float(x.split(" ")[1]) for x in text.splitlines() if x.startswith(line))


async def test_prefix_cache_is_shared_within_a_team_only(judge_url: str) -> None:
    # Each team's calls carry their own cache_salt: team a's second call reuses a's cached
    # prefix; team b sending the very same prompt reuses nothing of a's (not even the
    # rubric), so b cannot tell from its call's time what a sent (the shared-cache
    # finding, here in vLLM's prefix cache).
    group = {**GROUP, "id": "salted", "responses": GROUP["responses"][:1]}
    body = {"groups": [group], "params": {}}
    async with httpx.AsyncClient(timeout=120) as http:

        async def cached(team: str) -> float:
            before = await _cached_tokens(http, judge_url)
            r = await http.post(f"{judge_url}/v1/quality", json=body, headers={TEAM_HEADER: team})
            assert r.status_code == 200 and r.json()["groups"][0]["scores"][0] is not None
            return await _cached_tokens(http, judge_url) - before

        await cached("salt-a")
        assert await cached("salt-a") > 0  # its own prefix: reused
        assert await cached("salt-b") == 0  # the same prompt from another team: not


def test_cache_salt_is_per_team_unpredictable_and_valid_for_vllm() -> None:
    judge = Judge(JudgeSettings(base_url="http://127.0.0.1:1/v1", model="m"))
    other = Judge(JudgeSettings(base_url="http://127.0.0.1:1/v1", model="m"))
    a, b = judge.cache_salt("a")["cache_salt"], judge.cache_salt("b")["cache_salt"]
    assert a != b and judge.cache_salt("a")["cache_salt"] == a  # per team, stable
    assert other.cache_salt("a")["cache_salt"] != a  # keyed: not derivable from the name
    assert len(a) <= 128 and not set(a) & set("@/\\\x00")  # vLLM's rules for a salt
    off = Judge(JudgeSettings(base_url="http://127.0.0.1:1/v1", model="m",
                              cache_salt_per_team=False))  # fmt: skip
    assert off.cache_salt("a") == {}


def _shape(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _shape(v) for k, v in x.items() if k not in ("_trimmed",)}
    if isinstance(x, list):
        return [_shape(x[0])] if x else []
    return type(x).__name__ if x is not None else None


def test_fixture_shapes_match_live_server(vllm_server: VLLMServer, tmp_path: Path) -> None:
    # the parsing tests' captured bodies still have the shape this vLLM sends
    capture(vllm_server.base_url, vllm_server.model, tmp_path)
    for name in ("quality_json_schema", "verifier_constrained", "verifier_full_vocab"):
        live = json.loads((tmp_path / f"{name}.json").read_text())["response"]
        saved = json.loads((FIXTURES / f"{name}.json").read_text())["response"]
        for key in ("id", "created", "system_fingerprint"):
            live.pop(key, None), saved.pop(key, None)
        assert _shape(live["choices"]) == _shape(saved["choices"]), name
        assert set(live["usage"]) == set(saved["usage"]), name
