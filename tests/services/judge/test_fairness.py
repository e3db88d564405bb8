"""The judge's concurrency slots are shared fairly across requests (stub server: it
answers after 0.2 s, which the real vLLM cannot be made to do on demand)."""

from __future__ import annotations

import asyncio
import time

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
