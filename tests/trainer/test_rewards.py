"""The trainer's rewards client: scoring in the background through ``arbiter.client`` (its
pool, its one retry policy), and what each failure does to the run. The answers come from
a scripted stand-in for the gateway (``tests/arbiter/scripted.py``); the real gateway is in
``test_e2e.py``."""

from __future__ import annotations

import email.utils
import logging
import time
from collections.abc import Iterator

import pytest

from arbiter.client import ArbiterClient, RetryPolicy
from arbiter.errors import ArbiterError, BadResponse, NotConfigured, Unprocessable
from arbiter.procs import free_port
from arbiter.proto.gateway import ScoreGroup
from arbiter.trainer.config import TrainerConfig
from arbiter.trainer.rewards import RewardClient, RewardsUnavailable, check_recipes, gateway_client
from tests.arbiter.scripted import Answer, Scripted, envelope, serve

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02)


def _groups(n: int) -> list[ScoreGroup]:
    return [
        ScoreGroup(id=f"g{i}", prompt="9+9?", reference="18", responses=["18"]) for i in range(n)
    ]


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    yield from serve(Scripted())


def test_submit_returns_while_the_groups_are_scored(scripted: Scripted) -> None:
    """The overlap with GPU work: ``submit`` returns while the requests are held open, one
    request per group, at most ``reward_concurrency`` (here 2) of them in flight."""
    scripted.release.clear()  # the stand-in holds every request until released
    with RewardClient(ArbiterClient(scripted.url, max_connections=2)) as rewards:
        future = rewards.submit("gsm8k", _groups(5))
        scripted.wait_for(2)
        assert not future.done()
        scripted.release.set()
        batch = future.result(timeout=60)
    assert [g.id for g in batch.groups] == ["g0", "g1", "g2", "g3", "g4"]
    assert batch.flat() == [1.0] * 5 and batch.fingerprint == "sha256:0"
    assert len(scripted.seen) == 5 and scripted.most_in_flight == 2
    assert len({h["Idempotency-Key"] for h, _ in scripted.seen}) == 5  # a key per group


# What each answer of the gateway does to a batch: (answers in order, error, requests sent).
FAILURES: list[tuple[list[Answer], type[ArbiterError], int]] = [
    # a 200 whose body does not parse (a proxy's page) is a hard error that stops the run,
    # not a retry: the same request would get the same body
    ([(200, {}, b"<html>502 Bad Gateway</html>")], BadResponse, 1),
    # the request's fault (an unknown recipe): stops the run, never retried
    ([(422, {}, envelope("invalid_request_error"))], Unprocessable, 1),
    # the recipe needs a component the gateway has not configured: stops the run
    ([(422, {}, b'{"error": {"type": "invalid_request_error", "message": "no judge",'
                b' "code": "component_not_configured"}}')], NotConfigured, 1),
    # an outage past the retries: RewardsUnavailable, the batch is skipped
    ([(503, {}, envelope("unavailable"))] * 3, RewardsUnavailable, 3),
]  # fmt: skip


@pytest.mark.parametrize(("answers", "error", "sent"), FAILURES)
def test_what_a_failure_does_to_the_batch(
    scripted: Scripted, answers: list[Answer], error: type[ArbiterError], sent: int
) -> None:
    scripted.answers += answers
    with (
        RewardClient(ArbiterClient(scripted.url, retry=FAST)) as rewards,
        pytest.raises(error) as info,
    ):
        rewards.score("gsm8k", _groups(1))
    assert isinstance(info.value, RewardsUnavailable) == info.value.retryable
    assert len(scripted.seen) == sent


def test_retries_follow_the_client_policy(scripted: Scripted) -> None:
    """A 503 then a 429 whose ``Retry-After`` is an HTTP date (which the trainer's own loop
    used to ignore): the group is scored on its third try, with one ``Idempotency-Key``."""
    when = email.utils.formatdate(time.time() + 3, usegmt=True)
    scripted.answers += [
        (503, {}, envelope("unavailable")),
        (429, {"Retry-After": when}, envelope("rate_limited")),
    ]
    with RewardClient(ArbiterClient(scripted.url, retry=FAST)) as rewards:
        batch = rewards.score("gsm8k", _groups(1))
    assert batch.flat() == [1.0]
    (first, _), (_, asked), (third, scored) = scripted.seen
    assert first["Idempotency-Key"] == third["Idempotency-Key"]
    assert scored - asked >= 1.5  # the date's 2-3 s, not FAST's 20 ms


def test_the_settings_make_the_client() -> None:
    cfg = TrainerConfig(
        model="unused", gateway_url="http://gw:8000/", api_key="k", reward_concurrency=7,
        reward_timeout_s=9.0,
        reward_retries=2, reward_backoff_s=0.25,
    )  # fmt: skip
    client = gateway_client(cfg)
    assert client.base_url == "http://gw:8000" and client.timeout == 9.0
    assert client.max_connections == 7 and client._headers["Authorization"] == "Bearer k"
    assert (client.retry.attempts, client.retry.base_delay) == (3, 0.25)  # 2 retries: 3 tries


def test_start_check_warns_when_the_gateway_is_down(caplog: pytest.LogCaptureFixture) -> None:
    """An outage at start only warns (the loop rides it out); asked once per recipe."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cfg = TrainerConfig(model="unused", gateway_url=url, eval_every=1, eval_recipe="gsm8k")
    with caplog.at_level(logging.WARNING, "arbiter.client"):
        check_recipes(cfg)
    warned = [r.getMessage() for r in caplog.records if "could not check recipe" in r.getMessage()]
    assert len(warned) == 1 and url in warned[0]
