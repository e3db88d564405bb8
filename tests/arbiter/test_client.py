"""The Python client against the real gateway + verify + Redis (and a gateway it stops)."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import pickle
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arbiter.client import (
    NO_RETRY,
    ArbiterClient,
    ArbiterError,
    NotConfigured,
    RetryPolicy,
    trl_reward,
)
from arbiter.errors import BadResponse
from arbiter.procs import free_port, service_process
from arbiter.proto.gateway import ScoreResponse
from tests.arbiter.scripted import Scripted, envelope, serve

GOOD = "<think>9 + 9 = 18</think><answer>18</answer>"
WRONG = "<think>guess</think><answer>17</answer>"
BARE = "The answer is 18."
GROUP = {"id": "q", "prompt": "9+9?", "reference": "18", "responses": [GOOD]}
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02)


def test_score_returns_typed_response(gateway_url: str) -> None:
    client = ArbiterClient(gateway_url)
    out = client.score([{"id": "q", "prompt": "9+9?", "reference": "18",
                         "responses": [GOOD, WRONG, BARE]}])  # fmt: skip
    g = out.groups[0]
    assert g.components["math_accuracy"] == [1.0, 0.0, 1.0]
    assert g.components["format"] == [1.0, 1.0, 0.0]
    assert g.rewards == [1.5, 0.5, 1.0]  # gsm8k = 1.0·math + 0.5·format
    assert out.recipe.fingerprint.startswith("sha256:")
    client.close()


async def test_async_score(gateway_url: str) -> None:
    client = ArbiterClient(gateway_url)
    out = await client.ascore([{"reference": "18", "responses": [GOOD]}], "gsm8k")
    assert out.groups[0].rewards == [1.5]
    await client.aclose()


def test_bad_input_raises_with_envelope(gateway_url: str) -> None:
    client = ArbiterClient(gateway_url, retry=FAST)
    with pytest.raises(ArbiterError) as info:
        client.score([{"reference": "18", "responses": [GOOD]}], "no-such-recipe")
    assert info.value.status in (400, 422) and not info.value.retryable
    assert info.value.error is not None and info.value.error.param == "recipe"


@pytest.mark.parametrize(
    ("groups", "recipe", "param"),
    [
        ([{"responses": "one text, not a list"}], "gsm8k", "groups.0.responses"),
        ([{**GROUP, "extra": 1}], "gsm8k", "groups.0.extra"),
        ([GROUP], {"components": [{"name": "math_accuracy", "weight": "heavy"}]}, None),
    ],
    ids=["responses-not-list", "unknown-field", "inline-recipe"],
)
def test_invalid_input_raises_arbiter_error_before_sending(
    groups: list[dict[str, Any]], recipe: Any, param: str | None
) -> None:
    client = ArbiterClient("http://127.0.0.1:9", retry=NO_RETRY)  # nothing listens: not sent
    with pytest.raises(ArbiterError) as info:
        client.score(groups, recipe)
    assert info.value.status == 422 and not info.value.retryable
    assert info.value.code == "validation_error"
    if param is not None:
        assert info.value.param == param and param in info.value.message


def test_trl_reward_regroups_repeated_prompts(gateway_url: str) -> None:
    # TRL's batch: each prompt repeated num_generations (here 2) times in a row,
    # conversational completions, and the dataset's `answer` column passed as a kwarg.
    # (The alias in arbiter.client; tests/arbiter/integrations/test_trl.py covers the rest.)
    reward = trl_reward("gsm8k", base_url=gateway_url, reference_column="answer")
    prompts = [[{"role": "user", "content": "9+9?"}]] * 2 + [
        [{"role": "user", "content": "2+2?"}]
    ] * 2
    completions = [[{"role": "assistant", "content": c}] for c in (GOOD, WRONG, BARE, "4")]
    answer = ["18", "18", "#### 4", "#### 4"]
    rewards = reward(prompts=prompts, completions=completions, answer=answer)
    assert rewards == [1.5, 0.5, 0.0, 1.0]  # BARE says 18 for 2+2; "4" is right, unformatted
    assert reward.__name__ == "arbiter_gsm8k"


def test_url_and_key_from_the_environment(
    gateway_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARBITER_URL", gateway_url + "/")
    monkeypatch.setenv("ARBITER_API_KEY", "team-key")
    client = ArbiterClient()
    assert client.base_url == gateway_url
    assert client._headers["Authorization"] == "Bearer team-key"
    assert client.score([GROUP]).groups[0].rewards == [1.5]
    monkeypatch.delenv("ARBITER_URL")
    assert ArbiterClient().base_url == "http://127.0.0.1:8000"  # the documented default


def test_recipes_and_health(gateway_url: str) -> None:
    with ArbiterClient(gateway_url) as client:
        recipes = {r.name: r for r in client.recipes()}
        weights = {c.name: c.weight for c in recipes["gsm8k"].components}
        assert weights == {"math_accuracy": 1.0, "format": 0.5}
        assert recipes["gsm8k"].fingerprint.startswith("sha256:")
        health = client.health()
        assert health.ready and health.checks


@pytest.mark.parametrize("recipe", ["gsm8k-dj", "gsm8k-verifier", "gsm8k-diverse"])
def test_a_recipe_the_gateway_cannot_serve_is_not_configured(
    gateway_url: str, recipe: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The session gateway has verify only: the refusal is raised once, never retried."""
    with ArbiterClient(gateway_url) as client, caplog.at_level(logging.WARNING, "arbiter.client"):
        listed = {r.name: r for r in client.recipes()}
        assert listed["gsm8k"].available and not listed[recipe].available
        for on_error in ("mask", "fail"):  # fail used to be a 503, retried 5 times
            with pytest.raises(NotConfigured) as info:
                client.score([GROUP], recipe, on_error)
            assert info.value.status == 422 and not info.value.retryable
            assert info.value.message.endswith(listed[recipe].reason or "?")
        for unreachable in ("raise", "warn"):  # a refusal is raised either way
            with pytest.raises(NotConfigured) as checked:
                client.check_recipe(recipe, unreachable=unreachable)
            assert checked.value.message == listed[recipe].reason
        client.check_recipe("gsm8k")  # served: no error
        inline = {"components": [{"name": "format"}, {"name": "judge_quality"}]}
        with pytest.raises(NotConfigured, match=r"^recipe \(inline\): component 'judge_"):
            client.check_recipe(inline)
        with pytest.raises(ArbiterError, match="'nope' is not on the gateway") as unknown:
            client.check_recipe("nope")
        assert unknown.value.code == "unknown_recipe"
    assert "retry" not in caplog.text


def test_health_of_nothing_raises_unavailable() -> None:
    client = ArbiterClient(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ArbiterError) as info:
        client.health()
    assert info.value.status == 503 and info.value.retryable
    assert "1 tries" in str(info.value)  # health asks once: a probe must answer promptly


def test_context_managers_close_and_reopen(gateway_url: str) -> None:
    with ArbiterClient(gateway_url) as client:
        assert client.score([GROUP]).groups[0].rewards == [1.5]
    assert client._sync is None  # closed on exit...
    assert client.score([GROUP]).groups[0].rewards == [1.5]  # ...and reopened on use

    async def scored() -> list[float | None]:
        async with ArbiterClient(gateway_url) as c:
            out = await c.ascore([GROUP])
        assert not c._async  # this loop's pool closed
        return out.groups[0].rewards

    assert asyncio.run(scored()) == [1.5]


def test_one_client_across_asyncio_run_calls(gateway_url: str) -> None:
    # Each asyncio.run makes and closes a loop; a pool bound to the first loop would fail
    # in the second ("Event loop is closed"). The client keeps one pool per loop.
    client = ArbiterClient(gateway_url)
    for _ in range(3):
        out = asyncio.run(client.ascore([GROUP]))
        assert out.groups[0].rewards == [1.5]
    assert len(client._async) == 1  # the closed loops' pools were dropped


def test_client_pickles_and_the_copy_scores(gateway_url: str) -> None:
    client = ArbiterClient(gateway_url, api_key="k", retry=FAST)
    client.score([GROUP])
    copy = pickle.loads(pickle.dumps(client))
    assert copy.retry == FAST and copy._headers == client._headers
    assert copy.score([GROUP]).groups[0].rewards == [1.5]


def test_unreachable_gateway_raises_retryable_after_the_retries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = ArbiterClient(url, retry=FAST)
    with caplog.at_level(logging.WARNING, "arbiter.client"), pytest.raises(ArbiterError) as info:
        client.score([GROUP])
    assert info.value.status == 503 and info.value.retryable
    assert url in str(info.value) and "3 tries" in str(info.value)
    assert len([r for r in caplog.records if "retry" in r.getMessage()]) == 2


def test_score_rides_out_a_gateway_restart(
    log_dir: Path, verify_url: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    env = {"GATEWAY_VERIFY_URL": verify_url, "REDIS_URL": redis_url}
    gateway = service_process("gateway", port, env=env, log_path=log_dir / f"gw-{port}.log")
    gateway.start().wait_ready(60)
    try:
        patient = RetryPolicy(attempts=60, base_delay=0.2, max_delay=0.5)
        client = ArbiterClient(f"http://127.0.0.1:{port}", retry=patient)
        assert client.score([GROUP]).groups[0].rewards == [1.5]
        gateway.stop()
        result: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: result.update(out=client.score([GROUP])))
        with caplog.at_level(logging.WARNING, "arbiter.client"):
            worker.start()
            time.sleep(1.0)  # the call fails and retries while nothing listens
            gateway.start().wait_ready(60)
            worker.join(60)
        assert result["out"].groups[0].rewards == [1.5]
        assert any("ConnectError" in r.getMessage() for r in caplog.records)
    finally:
        gateway.stop()


# -- what the client sends and how it retries: a scripted stand-in for the gateway ---------
# The gateway cannot be made to answer 503 on the n-th try, nor a 200 with a proxy's page,
# nor show the headers it received; a small real HTTP server plays the answers instead.


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    yield from serve(Scripted())


def test_retries_keep_one_idempotency_key_and_honour_retry_after(scripted: Scripted) -> None:
    scripted.answers += [
        (503, {}, envelope("unavailable")),  # retried after a short backoff
        (429, {"Retry-After": "1"}, envelope("rate_limited")),  # retried after 1 s
    ]
    client = ArbiterClient(scripted.url, api_key="secret", retry=RetryPolicy(base_delay=0.01))
    assert client.score([GROUP]).groups[0].rewards == [1.0]
    seen = scripted.seen
    assert len(seen) == 3
    keys = {headers["Idempotency-Key"] for headers, _ in seen}
    assert len(keys) == 1 and len(keys.pop()) == 32  # one key for the call and its retries
    assert all(h["Authorization"] == "Bearer secret" for h, _ in seen)
    assert seen[2][1] - seen[1][1] >= 0.95  # waited what Retry-After asked
    client.score([GROUP])
    assert seen[3][0]["Idempotency-Key"] not in {h["Idempotency-Key"] for h, _ in seen[:3]}


def test_retry_after_as_an_http_date(scripted: Scripted) -> None:
    # RFC 9110 allows a date instead of seconds; 3 s ahead, written to the second
    when = email.utils.formatdate(time.time() + 3, usegmt=True)
    scripted.answers.append((429, {"Retry-After": when}, envelope("rate_limited")))
    client = ArbiterClient(scripted.url, retry=RetryPolicy(base_delay=0.01))
    assert client.score([GROUP]).groups[0].rewards == [1.0]
    (_, first), (_, second) = scripted.seen
    assert second - first >= 1.5  # the date's 2-3 s, not the 10 ms back-off


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize(
    "body",
    [
        b"<html><body>502 Bad Gateway</body></html>",  # a proxy's page with a 200
        b'{"groups": []}',  # JSON, but not a ScoreResponse
    ],
)
def test_a_200_whose_body_does_not_parse_is_a_bad_response_not_a_retry(
    scripted: Scripted, body: bytes, use_async: bool
) -> None:
    """The same request would get the same body: raised at once (``BadResponse``, not
    retryable), never retried, never a pydantic error."""
    scripted.answers.append((200, {}, body))
    client = ArbiterClient(scripted.url, retry=FAST)
    with pytest.raises(BadResponse, match="body is not a ScoreResponse") as info:
        if use_async:
            asyncio.run(client.ascore([GROUP]))
        else:
            client.score([GROUP])
    assert info.value.status == 502 and not info.value.retryable
    assert scripted.url in info.value.message
    assert len(scripted.seen) == 1


def test_max_connections_bounds_requests_and_waiting_is_not_a_timeout(
    scripted: Scripted,
) -> None:
    """8 calls at once through 2 connections, each answer 0.4 s, each try allowed 1 s: the
    last calls wait ~1.2 s for a place. That wait is not a try: no call times out or
    retries (httpx alone would raise PoolTimeout past 1 s), and at most 2 are in flight."""
    scripted.delay_s = 0.4
    client = ArbiterClient(scripted.url, timeout=1.0, retry=NO_RETRY, max_connections=2)

    async def all_at_once() -> list[ScoreResponse]:
        return await asyncio.gather(*(client.ascore([GROUP]) for _ in range(8)))

    outs = asyncio.run(all_at_once())
    assert [o.groups[0].rewards for o in outs] == [[1.0]] * 8
    assert len(scripted.seen) == 8 and scripted.most_in_flight <= 2


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),  # bad input: the same request fails again
        (413, "payload_too_large"),  # too big: split it, do not resend it
    ],
)
def test_client_errors_are_not_retried(scripted: Scripted, status: int, kind: str) -> None:
    scripted.answers.append((status, {}, envelope(kind)))
    with pytest.raises(ArbiterError) as info:
        ArbiterClient(scripted.url, retry=FAST).score([GROUP])
    assert info.value.status == status and not info.value.retryable
    assert len(scripted.seen) == 1


def test_retries_give_up_with_the_last_answer(scripted: Scripted) -> None:
    scripted.answers += [(504, {}, envelope("timeout"))] * 3
    with pytest.raises(ArbiterError) as info:
        ArbiterClient(scripted.url, retry=FAST).score([GROUP])
    assert info.value.status == 504 and info.value.retryable
    assert len(scripted.seen) == 3  # FAST allows three tries in all


def test_check_recipe_can_ride_out_an_unreachable_gateway(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = ArbiterClient(url, retry=FAST)
    with pytest.raises(ArbiterError, match="not reached after 3 tries"):
        client.check_recipe("gsm8k")  # the default: raise
    with caplog.at_level(logging.WARNING, "arbiter.client"):
        client.check_recipe("gsm8k", unreachable="warn")  # a long job that rides out outages
    assert f"could not check recipe gsm8k at {url}" in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attempts": 0}, "attempts must be >= 1"),  # 1 means: try once, never retry
        ({"base_delay": -1.0}, "delays must be >= 0"),
    ],
)
def test_retry_policy_refuses_nonsense(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)


def test_max_connections_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="max_connections must be >= 1"):
        ArbiterClient("http://127.0.0.1:1", max_connections=0)
