"""The sampler's per-shape state: one KV-cache allocation, static buffers, decode graphs.

A ``Bucket`` (``trainer.generation.Sampler`` keeps a few, one per (rows, capacity, new
tokens, temperature, top-p, cache dtype)) holds

- the KV cache as ONE tensor ``(2, layers, B, kv_heads, C, head_dim)``; ``k_cache[l]`` and
  ``v_cache[l]`` are views of it (``cache[0, l]``, ``cache[1, l]``; non-overlapping, so
  inductor still writes each in place). One allocation frees and comes back as one block,
  so the caching allocator tends to hand the same address back to the next rollout;
- the small static buffers a decode step reads and writes (valid, tokens, pos, slot, step,
  done, out, noise, rope tables, EOS/pad scalars; ~1 MB at 256 x 512), which live as long
  as the bucket;
- the decode step's CUDA graphs (one per attended length) and the ``Addresses`` they were
  captured with: the cache's address, the merged q/k/v buffer's and every parameter's.

``free()`` drops only the cache (the memory goes back to the caching allocator, for the
training step); the graphs stay, and stay unusable (``graph`` answers None) until
``prepare`` has allocated a cache again and found every address as captured
(``replayable``); if any moved, ``prepare`` drops the graphs, to be captured anew. The
cache's tensors change only in ``prepare``/``free``, so a graph can never be replayed over
a cache other than the one it was captured with (it would write into freed memory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch


class Addresses(NamedTuple):
    """Device addresses a captured decode graph reads or writes (besides its own buffers)."""

    cache: int  # the KV cache's data_ptr
    qkv: int  # the merged q/k/v weight buffer's data_ptr (0: none)
    weights: tuple[int, ...]  # every parameter's data_ptr (FSDP2 gathers into fresh memory)


def replayable(captured: Addresses | None, now: Addresses) -> bool:
    """Whether graphs captured at ``captured`` may run now: every address the same."""
    return captured is not None and captured == now


def alloc_cache(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The KV cache storage, zeroed (unfilled slots inside the attended length are masked,
    but NaN garbage there would still poison the probabilities-times-values product)."""
    return torch.zeros(shape, dtype=dtype, device=device)


@dataclass
class Bucket:
    """Static buffers, KV cache and decode graphs for one (batch, capacity, settings) shape."""

    key: tuple[Any, ...]
    cache_shape: tuple[int, ...]  # (2, layers, B, KVH, C, D)
    cache_dtype: torch.dtype
    valid: torch.Tensor  # (B, C) bool: cache slot holds a real token
    tokens: torch.Tensor  # (B,) last sampled token (input of the next step)
    pos: torch.Tensor  # (B,) its rotary position
    slot: torch.Tensor  # (1,) cache slot it is written to
    step: torch.Tensor  # (1,) index of the token the step samples
    done: torch.Tensor  # (B,) bool
    out: torch.Tensor  # (B, N) sampled ids
    noise: torch.Tensor  # (N, B) uniforms
    cache: torch.Tensor | None = None  # the KV cache (None while freed)
    k_cache: list[torch.Tensor] = field(default_factory=list)  # per layer (B, KVH, C, D) views
    v_cache: list[torch.Tensor] = field(default_factory=list)
    graphs: dict[int, Any] = field(default_factory=dict)  # attended length -> decode graph
    captured: Addresses | None = None  # what every graph in ``graphs`` was captured with
    extra: dict[str, Any] = field(default_factory=dict)

    def prepare(self, qkv: int, weights: tuple[int, ...]) -> str | None:
        """Allocate the cache if freed; drop the graphs unless every address is the one they
        were captured with. Returns why graphs were dropped ("cache moved", "weights moved";
        None: kept, or there were none)."""
        if self.cache is None:
            self.cache = alloc_cache(self.cache_shape, self.cache_dtype, self.valid.device)
            self.k_cache = list(self.cache[0].unbind(0))
            self.v_cache = list(self.cache[1].unbind(0))
        now = Addresses(self.cache.data_ptr(), qkv, weights)
        reason = None
        if not replayable(self.captured, now):
            if self.graphs and self.captured is not None:
                reason = "cache moved" if self.captured.cache != now.cache else "weights moved"
            self.graphs.clear()
            self.captured = now
        return reason

    def graph(self, s: int) -> Any:
        """The decode graph attending to ``s`` slots, if one may be replayed now (the cache
        is allocated only by ``prepare``, which drops graphs that do not match it)."""
        return self.graphs.get(s) if self.cache is not None else None

    def step_state(self) -> tuple[torch.Tensor, ...]:
        """The buffers a decode step reads and writes, besides the cache and the outputs."""
        return (self.valid, self.tokens, self.pos, self.slot, self.step, self.done)

    def rewind(self) -> None:
        """Slot, step and position back to 0: in range for a warm-up or captured step."""
        self.slot.zero_(), self.step.zero_(), self.pos.zero_()

    def free(self, graphs: bool) -> None:
        """Drop the KV cache (and with ``graphs`` the decode graphs too); the static buffers
        stay. The graphs kept are unusable until the next ``prepare``."""
        self.cache, self.k_cache, self.v_cache = None, [], []
        if graphs:
            self.graphs.clear()
            self.captured = None


def new_bucket(
    key: tuple[Any, ...],
    *,
    layers: int,
    rows: int,
    kv_heads: int,
    capacity: int,
    head_dim: int,
    new_tokens: int,
    cache_dtype: torch.dtype,
    device: torch.device,
    rope: tuple[torch.Tensor, torch.Tensor],
) -> Bucket:
    """A bucket with its static buffers; the cache is allocated by its first ``prepare``."""

    def zeros(*shape: int, dt: torch.dtype = torch.long) -> torch.Tensor:
        return torch.zeros(*shape, device=device, dtype=dt)

    b, c, n = rows, capacity, new_tokens
    return Bucket(
        key=key,
        cache_shape=(2, layers, b, kv_heads, c, head_dim),
        cache_dtype=cache_dtype,
        valid=zeros(b, c, dt=torch.bool),
        tokens=zeros(b),
        pos=zeros(b),
        slot=zeros(1),
        step=zeros(1),
        done=zeros(b, dt=torch.bool),
        out=zeros(b, n),
        noise=zeros(n, b, dt=torch.float32),
        extra={
            "rope": rope,  # kept alive: captured graphs read it
            "eos_t": torch.zeros((), device=device, dtype=torch.long),
            "pad_t": torch.zeros((), device=device, dtype=torch.long),
        },
    )


def warm_up(bk: Bucket, s: int, step: Callable[[Bucket, int], None]) -> None:
    """Two decode steps ``step(bk, s)`` before a capture (allocator, cuBLAS handles, lazy
    init) from in-range indices: a kept bucket holds the last call's end (step == N, slot ==
    C), and its cache is scratch until the prefill."""
    for _ in range(2):
        bk.rewind()
        step(bk, s)


def capture(bk: Bucket, s: int, step: Callable[[Bucket, int], None], pool: Any) -> None:
    """``step(bk, s)``, one decode step attending to ``s`` slots, captured as
    ``bk.graphs[s]`` into the graph memory ``pool`` after a warm-up on the device's side
    stream; the bucket's step state is left as it was."""
    device = bk.valid.device
    saved = [x.clone() for x in bk.step_state()]
    stream = warmup_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        warm_up(bk, s, step)
    torch.cuda.current_stream(device).wait_stream(stream)
    bk.rewind()  # in range (the graph keeps no values)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        step(bk, s)
    for dst, src in zip(bk.step_state(), saved, strict=True):
        dst.copy_(src)
    bk.graphs[s] = graph


_STREAMS: dict[torch.device, Any] = {}


def warmup_stream(device: torch.device) -> Any:
    """One side stream per device for every capture's warm-up: cuBLAS keeps a workspace per
    stream it ran on for life, and a new stream per capture would add one each time."""
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device=device)
    return _STREAMS[device]
