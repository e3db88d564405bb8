"""The batcher's token budget, in-process, with a stand-in encoder whose "tokens" are a
text's characters: no batch is over the budget (unless one text alone), long texts go in
smaller batches, another team's short request is in the next batch behind a bulk team's
queued long texts, and rows and failures still go to their own requests."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from arbiter.errors import Unprocessable
from arbiter.services.embedding.batching import DynamicBatcher
from arbiter.services.embedding.encoder import Encoded
from tests.services.embedding.test_batching import RecordingEncoder, SlowEncoder, vector_of

BUDGET = 400


def chars(texts: list[str]) -> np.ndarray:
    """The stand-in's token count: one token per character."""
    return np.array([len(t) for t in texts], dtype=np.int64)


def budget_batcher(encode: object, **kwargs: object) -> DynamicBatcher:
    opts: dict[str, object] = {
        "count": chars, "max_batch_texts": 64, "token_budget": BUDGET,
        "max_wait_ms": 1.0, "max_queued_texts": 100_000, **kwargs,
    }  # fmt: skip
    batcher = DynamicBatcher(encode, **opts)  # type: ignore[arg-type]
    batcher.start()
    return batcher


async def until_encoding(encoder: RecordingEncoder, batches: int) -> None:
    """Wait until ``encoder`` has been given ``batches`` batches (10 s at most)."""
    for _ in range(2000):
        if len(encoder.batches) >= batches:
            return
        await asyncio.sleep(0.005)


def tokens(batch: list[str]) -> int:
    return sum(len(t) for t in batch)


async def test_no_batch_is_over_the_budget_unless_one_text_alone() -> None:
    # 40 requests of 1-12 texts of 1-120 characters, and 3 texts longer than the budget:
    # each long one is encoded in a batch of its own; every other batch is within it.
    rng = random.Random(7)
    jobs = [
        [f"{j}:{k}:" + "x" * rng.randint(1, 120) for k in range(rng.randint(1, 12))]
        for j in range(40)
    ]
    for j in (3, 17, 31):
        jobs[j].append(f"{j}:long:" + "y" * (BUDGET + 50))
    encoder = RecordingEncoder()
    batcher = budget_batcher(encoder)
    try:
        results = await asyncio.gather(*(batcher.embed(t, team=f"t{j % 3}") for j, t in
                                         enumerate(jobs)))  # fmt: skip
    finally:
        await batcher.stop()
    for batch in encoder.batches:
        assert tokens(batch) <= BUDGET or len(batch) == 1, (tokens(batch), len(batch))
    alone = [b for b in encoder.batches if tokens(b) > BUDGET]
    assert sorted(b[0].split(":")[0] for b in alone) == ["17", "3", "31"]
    # rows scatter back exactly, each request's in its own order
    for texts, got in zip(jobs, results, strict=True):
        np.testing.assert_array_equal(got.vectors, np.stack([vector_of(t) for t in texts]))
    encoded = [t for b in encoder.batches for t in b]
    assert sorted(encoded) == sorted(t for j in jobs for t in j)


async def test_long_texts_go_in_smaller_batches() -> None:
    # One request of 100-character texts: 4 fit the budget of 400, so batches of 4,
    # where short texts of 4 characters fill the 64-text cap.
    encoder = RecordingEncoder()
    batcher = budget_batcher(encoder)
    try:
        await batcher.embed([f"{k:03d}" + "z" * 97 for k in range(12)])
        await batcher.embed([f"s{k:02d}" for k in range(64)])
    finally:
        await batcher.stop()
    assert [len(b) for b in encoder.batches] == [4, 4, 4, 64]


async def test_no_budget_fills_batches_by_texts_only() -> None:
    # token_budget=0: the batch is bounded by max_batch_texts alone, as before the budget
    encoder = RecordingEncoder()
    batcher = budget_batcher(encoder, token_budget=0, max_batch_texts=8)
    try:
        await batcher.embed(["w" * 1000 for _ in range(16)])
    finally:
        await batcher.stop()
    assert [len(b) for b in encoder.batches] == [8, 8]


@pytest.mark.parametrize("prepare", [False, True])
async def test_newcomer_is_in_the_next_batch_behind_a_bulk_teams_long_texts(
    prepare: bool,
) -> None:
    # The scenario in miniature: team "bulk" queues 30 requests of 64 texts of
    # 100 "tokens" (4 per batch under the budget: 480 batches); team "new" then sends 8
    # short texts. Counted in batches started between its send and its own batch: the
    # one being encoded (and the one already prepared), then its own; so the tokens
    # encoded ahead of it are at most two budgets, not two batches of 64 long texts.
    encoder = SlowEncoder()
    extra = {"prepare": (lambda texts: texts)} if prepare else {}
    batcher = budget_batcher(encoder, **extra)
    try:
        bulk = [
            asyncio.ensure_future(
                batcher.embed([f"b{r}-{k}:" + "L" * 90 for k in range(64)], team="bulk")
            )
            for r in range(30)
        ]
        await until_encoding(encoder, 3)  # until bulk's batches are running
        started = len(encoder.batches)
        new = await batcher.embed([f"n{k}" for k in range(8)], team="new")
        np.testing.assert_array_equal(new.vectors, np.stack([vector_of(f"n{k}") for k in
                                                             range(8)]))  # fmt: skip
        mine = [i for i, b in enumerate(encoder.batches) if any(t.startswith("n") for t in b)]
        assert len(mine) == 1, mine  # all 8 in one batch
        assert mine[0] - started <= (2 if prepare else 1), (mine[0], started)
        ahead = encoder.batches[started : mine[0]]
        assert all(tokens(b) <= BUDGET for b in ahead)
        assert tokens(encoder.batches[mine[0]]) <= BUDGET
        assert not all(f.done() for f in bulk)  # it was served long before bulk finished
        for f in bulk:
            f.cancel()
        await asyncio.gather(*bulk, return_exceptions=True)
    finally:
        await batcher.stop()


async def test_one_bad_input_fails_only_its_own_request_under_the_budget() -> None:
    # A stand-in tokenizer that refuses one text (see test_batching): the batch it shares
    # with others under the budget fails, each request is encoded alone, only its own
    # request gets the 422, and the others their exact rows.
    encoder = RecordingEncoder()

    def picky(texts: list[str]) -> Encoded:
        if "poison" in texts:
            raise ValueError("tokenizer: cannot encode this text")
        return encoder(texts)

    batcher = budget_batcher(picky, max_wait_ms=20.0)
    try:
        jobs = [[f"req {j} text {k} " + "p" * 30 for k in range(5)] for j in range(16)]
        jobs.insert(7, ["fine", "poison", "fine too"])
        results = await asyncio.gather(*(batcher.embed(t, team=f"t{j % 2}") for j, t in
                                         enumerate(jobs)), return_exceptions=True)  # fmt: skip
    finally:
        await batcher.stop()
    bad = results.pop(7)
    assert isinstance(bad, Unprocessable) and bad.status == 422, bad
    for texts, got in zip(jobs[:7] + jobs[8:], results, strict=True):
        assert isinstance(got, Encoded), got
        np.testing.assert_array_equal(got.vectors, np.stack([vector_of(t) for t in texts]))
    assert all(tokens(b) <= BUDGET for b in encoder.batches)


async def test_cancelled_request_leaves_the_budgeted_queue() -> None:
    # A caller that goes away while its long texts are being batched takes the rest of
    # them with it: at most the batch being encoded and the next one more are encoded.
    encoder = SlowEncoder()
    batcher = budget_batcher(encoder)
    try:
        gone = asyncio.ensure_future(batcher.embed(["g" * 200] * 300, team="a"))
        await until_encoding(encoder, 1)
        gone.cancel()
        at_cancel = len(encoder.batches)
        (outcome,) = await asyncio.gather(gone, return_exceptions=True)
        assert isinstance(outcome, asyncio.CancelledError)
        assert batcher.queued == 0  # its queued texts left with it, not when reached
        kept = await batcher.embed(["kept"], team="b")
    finally:
        await batcher.stop()
    np.testing.assert_array_equal(kept.vectors[0], vector_of("kept"))
    assert len(encoder.batches) <= at_cancel + 3  # in flight, prepared, "kept"'s own
    assert batcher.queued == 0


async def test_teams_share_the_encoder_by_tokens_not_texts() -> None:
    # Both teams keep texts queued: "long" sends 100-token texts, "short" 10-token ones.
    # Shared by tokens (the cost), each team gets about half of every batch's tokens, so
    # "short" gets ~10x the texts; the gap stays within one run (an eighth of a batch)
    # per batch, whatever the order they were queued in.
    encoder = RecordingEncoder()
    batcher = budget_batcher(encoder, max_wait_ms=20.0)
    try:
        await asyncio.gather(
            batcher.embed([f"l{k:03d}" + "L" * 96 for k in range(40)], team="long"),
            batcher.embed([f"s{k:03d}" + "S" * 6 for k in range(400)], team="short"),
        )
    finally:
        await batcher.stop()
    both = [b for b in encoder.batches if {t[0] for t in b} == {"l", "s"}]
    assert len(both) >= 5, [len(b) for b in encoder.batches]
    for batch in both[:5]:
        long_tokens = sum(len(t) for t in batch if t[0] == "l")
        short_tokens = sum(len(t) for t in batch if t[0] == "s")
        assert abs(long_tokens - short_tokens) <= 100 + BUDGET // 8, (long_tokens, short_tokens)
