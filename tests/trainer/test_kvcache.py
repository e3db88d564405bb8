"""arbiter.trainer.kvcache on CPU: when kept decode graphs may be replayed.

The CPU has no CUDA graphs: the sampler's capture is replaced by a fake graph whose replay
runs the eager decode step and asserts it runs over the cache it was captured with; the
allocator's address is forced with a patched ``alloc_cache``.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch

from arbiter.trainer import kvcache
from arbiter.trainer.generation import Sampler, SamplingParams
from arbiter.trainer.kvcache import Addresses, new_bucket, replayable, warm_up

PROMPTS = ["What is 12 + 7? Think first.", "Hi", "3 * 4", "Tom has 12 apples."]


def test_replayable_only_at_the_captured_addresses() -> None:
    at = Addresses(cache=1000, qkv=2000, weights=(1, 2, 3))
    assert replayable(at, Addresses(1000, 2000, (1, 2, 3)))
    assert not replayable(None, at)  # nothing captured yet
    assert not replayable(at, at._replace(cache=1008))  # the cache came back elsewhere
    assert not replayable(at, at._replace(qkv=0))  # merged q/k/v buffer gone or moved
    assert not replayable(at, at._replace(weights=(1, 2, 4)))  # FSDP2 gathered afresh


def _bucket() -> kvcache.Bucket:
    rope = (torch.zeros(64, 4), torch.zeros(64, 4))
    return new_bucket(("k",), layers=3, rows=2, kv_heads=2, capacity=64, head_dim=4,
                      new_tokens=8, cache_dtype=torch.float32, device=torch.device("cpu"),
                      rope=rope)  # fmt: skip


class _Pool:
    """alloc_cache stand-in: hands out held tensors, so the test picks the address."""

    def __init__(self) -> None:
        self.held: list[torch.Tensor] = []
        self.next = 0  # index of the tensor the next allocation returns

    def __call__(self, shape: tuple[int, ...], dtype: torch.dtype, dev: Any) -> torch.Tensor:
        while len(self.held) <= self.next:
            self.held.append(torch.empty(shape, dtype=dtype, device=dev))
        return self.held[self.next].zero_()


def test_bucket_keeps_graphs_only_while_the_cache_stays_put(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = _Pool()
    monkeypatch.setattr(kvcache, "alloc_cache", pool)
    bk = _bucket()
    assert bk.prepare(0, (1, 2)) is None and bk.cache is not None
    assert bk.k_cache[1].data_ptr() == bk.cache[0, 1].data_ptr()  # per-layer views
    assert bk.v_cache[2].shape == (2, 2, 64, 4)
    bk.graphs[128] = "graph"
    assert bk.prepare(0, (1, 2)) is None and bk.graph(128) == "graph"  # cache kept
    bk.free(graphs=False)
    assert bk.cache is None and bk.k_cache == [] and bk.graph(128) is None  # freed: unusable
    assert bk.prepare(0, (1, 2)) is None and bk.graph(128) == "graph"  # back at its address
    bk.free(graphs=False)
    pool.next = 1
    assert bk.prepare(0, (1, 2)) == "cache moved" and bk.graph(128) is None and not bk.graphs
    bk.graphs[128] = "graph2"
    assert bk.prepare(0, (1, 3)) == "weights moved" and not bk.graphs
    bk.graphs[128] = "graph3"
    bk.free(graphs=True)
    pool.next = 0
    assert bk.prepare(0, (1, 3)) is None and not bk.graphs  # dropped with the cache


class _FakeGraph:
    """Replays the eager decode step; refuses to run over any cache but its own."""

    def __init__(self, sampler: Sampler, bk: kvcache.Bucket, s: int) -> None:
        self.sampler, self.bk, self.s = sampler, bk, s
        assert bk.cache is not None
        self.cache_ptr, self.replays = bk.cache.data_ptr(), 0

    def replay(self) -> None:
        assert self.bk.cache is not None and self.bk.cache.data_ptr() == self.cache_ptr
        self.replays += 1
        self.sampler._decode_step(self.bk, self.s)


def test_sampler_replays_kept_graphs_only_over_their_cache(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """keep_cache=False with kept graphs: the next call replays them when the cache comes back
    at its address and captures anew when it does not; the ids are the eager sampler's."""
    model, tok = tiny
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    params = SamplingParams(150, -1, tok.pad_token_id, temperature=0.0)  # 2 attended lengths
    ref, _ = Sampler(model)(enc.input_ids, enc.attention_mask, params)
    pool = _Pool()
    monkeypatch.setattr(kvcache, "alloc_cache", pool)
    sampler = Sampler(model, use_cuda_graphs=True, keep_cache=False, reuse_graphs=True)
    captured: list[_FakeGraph] = []

    def capture(bk: kvcache.Bucket, s: int) -> None:
        captured.append(_FakeGraph(sampler, bk, s))
        bk.graphs[s] = captured[-1]

    monkeypatch.setattr(sampler, "_capture", capture)
    counts = []
    for address in (0, 0, 1, 1, 0):  # the address the next allocation gets
        pool.next, before = address, len(captured)
        got, _ = sampler(enc.input_ids, enc.attention_mask, params)
        assert torch.equal(got, ref)
        counts.append(len(captured) - before)
    n = counts[0]
    assert n >= 2 and counts == [n, 0, n, 0, n]  # captured anew exactly when the cache moved
    assert sampler.graph_stats == {"reused": 2, "cache moved": 2, "weights moved": 0}
    assert all(g.replays > 0 for g in captured)


def test_freed_cache_memory_is_released(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a keep_cache=False call nothing references the KV cache's storage any more
    (so the caching allocator can hand it to training), graphs kept or not."""
    model, tok = tiny
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    params = SamplingParams(8, -1, tok.pad_token_id, temperature=0.0)
    refs: list[weakref.ref[torch.Tensor]] = []
    alloc = kvcache.alloc_cache

    def spy(*a: Any) -> torch.Tensor:
        t = alloc(*a)
        refs.append(weakref.ref(t))
        return t

    monkeypatch.setattr(kvcache, "alloc_cache", spy)
    for reuse in (True, False):
        sampler = Sampler(model, keep_cache=False, reuse_graphs=reuse)
        sampler(enc.input_ids, enc.attention_mask, params)
        gc.collect()
        assert refs and refs[-1]() is None
    kept = Sampler(model)
    kept(enc.input_ids, enc.attention_mask, params)
    gc.collect()
    assert refs[-1]() is not None  # the control: a kept cache is still referenced


def test_capture_warms_up_from_in_range_state(tiny: tuple[Any, Any]) -> None:
    """A kept bucket holds the last call's end state (step == N, slot past the prompt and the
    new tokens); capturing anew (the cache or the weights moved) first runs two eager steps,
    which must not index past the noise rows or the cache (on a GPU: a device-side assert)."""
    model, tok = tiny
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    params = SamplingParams(20, -1, tok.pad_token_id, temperature=0.0)
    sampler = Sampler(model)
    sampler(enc.input_ids, enc.attention_mask, params)
    (bk,) = sampler._buckets.values()
    assert int(bk.step) >= 19  # the end of the last call
    s = bk.key[1]
    with torch.no_grad():
        warm_up(bk, s, sampler._decode_step)  # IndexError before the reset
    assert int(bk.step) == 1 and int(bk.slot) == 1
