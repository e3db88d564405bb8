"""The judge's concurrency slots are shared fairly across teams, then across requests
(stub server: it answers after 0.2 s, which the real vLLM cannot be made to do on demand)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from arbiter.proto.components import ScoreGroup
from arbiter.proto.judge import VerifierParams, VerifierRequest
from arbiter.services.judge.scoring import Judge
from arbiter.services.judge.settings import JudgeSettings


def _request(n: int, tag: str) -> VerifierRequest:
    group = ScoreGroup(id=tag, prompt=f"fairness {tag}", reference="42",
                       responses=[f"{tag} {i}" for i in range(n)])  # fmt: skip
    return VerifierRequest(groups=[group], params=VerifierParams())


async def test_small_request_not_held_behind_a_large_one(stub_root: str) -> None:
    # 2 slots, 0.2 s a call: request A's 40 items take 4 s; B's 2 items, sent just after,
    # are admitted as soon as a slot frees (round-robin), not after A's 40.
    judge = Judge(JudgeSettings(base_url=f"{stub_root}/v1", model="count", max_concurrency=2))
    try:
        big = asyncio.create_task(judge.verifier(_request(40, "a")))
        await asyncio.sleep(0.05)
        start = time.monotonic()
        small = await judge.verifier(_request(2, "b"))
        elapsed = time.monotonic() - start
        assert not big.done()
        assert None not in small.groups[0].scores
        assert elapsed < 1.5, f"{elapsed:.2f}s"  # FIFO: about 4 s
        assert None not in (await big).groups[0].scores
    finally:
        await judge.aclose()


async def test_cancelled_request_leaves_the_line(stub_root: str) -> None:
    # A request whose caller goes away (cancelled, as when its client disconnects) stops
    # taking slots: the next request is served at once.
    judge = Judge(JudgeSettings(base_url=f"{stub_root}/v1", model="count", max_concurrency=2))
    try:
        gone = asyncio.create_task(judge.verifier(_request(40, "gone")))
        await asyncio.sleep(0.1)
        gone.cancel()
        start = time.monotonic()
        kept = await judge.verifier(_request(4, "kept"))
        assert time.monotonic() - start < 1.0
        assert None not in kept.groups[0].scores
        assert judge._slots.held == 0 and judge._slots.waiting == 0
    finally:
        await judge.aclose()


async def test_another_team_is_served_next_whatever_one_team_sent(stub_root: str) -> None:
    # Team a sends 70 requests of 6 items at once (one sample per POST, as OpenRLHF and
    # slime send); team b's 1-item request, sent while they wait for the 2 slots, has its
    # call started as soon as a slot frees: counted in calls started between b's arrival
    # and b's own call, at most the 2 slots' worth. Per request alone it waited for 70.
    judge = Judge(JudgeSettings(base_url=f"{stub_root}/v1", model="count", max_concurrency=2))
    started: list[str] = []  # the group id of every call, in the order it started
    chat = judge.client.chat

    async def recording_chat(
        payload: dict[str, Any], component: str, timeout_s: float | None = None
    ) -> dict[str, Any]:
        started.append("b" if "fairness b" in payload["messages"][1]["content"] else "a")
        return await chat(payload, component, timeout_s)

    judge.client.chat = recording_chat  # type: ignore[method-assign]  # a spy: calls go on
    try:
        flood = [
            asyncio.create_task(judge.verifier(_request(6, f"a{r}"), team="a")) for r in range(70)
        ]
        await asyncio.sleep(0.1)  # a's first calls are running, the rest wait for slots
        before = len(started)
        small = await judge.verifier(_request(1, "b"), team="b")
        assert None not in small.groups[0].scores
        waited = started.index("b") - before
        assert waited <= 2, f"b's call started after {waited} of a's"
        assert sum(t.done() for t in flood) == 0
        for t in flood:
            t.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
        assert judge._slots.held == 0 and judge._slots.waiting == 0
    finally:
        await judge.aclose()
