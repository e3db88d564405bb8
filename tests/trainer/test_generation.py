"""arbiter.trainer.generation on CPU with the tiny Qwen2: exact against HF generate, masks, seeding.

The CUDA-graph path runs the same functional forward as the CPU path here; the GPU speed and
graph replay are exercised by bench/trainer/speed.py on the lent GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from arbiter.tiny_model import build
from arbiter.trainer.generation import (
    Sampler,
    SamplingParams,
    completion_mask_from_ids,
    sample,
    sampling_probs,
)
from arbiter.trainer.sampling import _choose, _draw, block_size

PROMPTS = [
    "What is 12 + 7? Think first.",
    "Hi",
    "Tom has 12 apples and buys 7 more. How many apples does he have now?",
    "3 * 4",
]


def _enc(tok: Any, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tok(prompts, return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


def _hf_greedy(model: Any, ids: torch.Tensor, mask: torch.Tensor, n: int, eos: int, pad: int):
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
        eos_token_id=eos, pad_token_id=pad, top_k=None, temperature=None, top_p=None,
    )  # fmt: skip
    return out[:, ids.shape[1] :]


def test_greedy_equals_hf_generate(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    ids, mask = _enc(tok, PROMPTS)
    pad = tok.pad_token_id
    ref = _hf_greedy(model, ids, mask, 24, eos=-1, pad=pad)  # no EOS: all 24 tokens
    assert len(set(ref[0].tolist())) > 3, "test model should produce varied text"
    got, cmask = sample(model, ids, mask, SamplingParams(24, -1, pad, temperature=0.0))
    assert torch.equal(got, ref)
    assert cmask.all()


def test_prefill_in_row_chunks_equals_hf_generate(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefill budget smaller than the batch's prompts: one row per prefill forward, the
    K/V written through row views of the cache; the ids are still HF generate's."""
    import arbiter.trainer.generation as generation

    model, tok = tiny
    ids, mask = _enc(tok, PROMPTS)
    monkeypatch.setattr(generation, "_PREFILL_TOKENS", ids.shape[1])  # 1 row per forward
    pad = tok.pad_token_id
    ref = _hf_greedy(model, ids, mask, 16, eos=-1, pad=pad)
    got, _ = Sampler(model)(ids, mask, SamplingParams(16, -1, pad, temperature=0.0))
    assert torch.equal(got, ref)


def test_eos_mask_and_padding_match_hf(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    ids, mask = _enc(tok, PROMPTS)
    pad = tok.pad_token_id
    free = _hf_greedy(model, ids, mask, 24, eos=-1, pad=pad)
    eos = int(free[0, 5])  # a token row 0 emits at step 5: rows stop wherever it first appears
    ref = _hf_greedy(model, ids, mask, 24, eos=eos, pad=pad)
    got, cmask = sample(model, ids, mask, SamplingParams(24, eos, pad, temperature=0.0))
    # HF stops when every row is done, so it may be narrower or wider than our trimmed width
    width = got.shape[1]
    assert width == int(cmask.sum(-1).max())
    ref = torch.nn.functional.pad(ref, (0, max(0, width - ref.shape[1])), value=pad)[:, :width]
    assert torch.equal(got, ref)
    first = int((free[0] == eos).nonzero()[0])
    assert cmask[0].sum() == first + 1 and got[0, first] == eos  # EOS itself is in the mask
    assert not cmask[0, first + 1 :].any() and (got[0, first + 1 :] == pad).all()


def test_left_padding_does_not_change_a_row(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    ids, mask = _enc(tok, PROMPTS)
    params = SamplingParams(12, -1, tok.pad_token_id, temperature=0.0)
    batch, _ = sample(model, ids, mask, params)
    for i, prompt in enumerate(PROMPTS):
        one_ids, one_mask = _enc(tok, [prompt])
        alone, _ = sample(model, one_ids, one_mask, params)
        assert torch.equal(alone[0], batch[i]), PROMPTS[i]


@pytest.mark.parametrize(
    ("temperature", "top_p"),
    [
        (1.0, 1.0),  # plain softmax sampling
        (0.7, 0.9),  # temperature and nucleus together
    ],
)
def test_seeded_sampling_is_reproducible(
    tiny: tuple[Any, Any], temperature: float, top_p: float
) -> None:
    model, tok = tiny
    ids, mask = _enc(tok, PROMPTS * 4)

    def params(seed: int) -> SamplingParams:
        gen = torch.Generator().manual_seed(seed)
        return SamplingParams(16, -1, tok.pad_token_id, temperature, top_p, generator=gen)

    a, _ = sample(model, ids, mask, params(1))
    b, _ = sample(model, ids, mask, params(1))
    c, _ = sample(model, ids, mask, params(2))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_fallback_path_greedy_matches_fast(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    ids, mask = _enc(tok, PROMPTS)
    fast = Sampler(model)
    plain = Sampler(model)
    plain.fast = False  # the path used for architectures the functional forward doesn't cover
    params = SamplingParams(10, -1, tok.pad_token_id, temperature=0.0)
    assert torch.equal(fast(ids, mask, params)[0], plain(ids, mask, params)[0])


@pytest.mark.parametrize(
    ("ids", "eos", "expected"),
    [
        ([[5, 6, 7]], 9, [[1, 1, 1]]),  # no EOS: whole row
        ([[5, 9, 7]], 9, [[1, 1, 0]]),  # EOS included, after it excluded
        ([[9, 9, 9]], 9, [[1, 0, 0]]),  # only the first EOS counts
        ([[5, 6, 9], [9, 1, 1]], 9, [[1, 1, 1], [1, 0, 0]]),  # per row
    ],
)
def test_completion_mask(ids: list[list[int]], eos: int, expected: list[list[int]]) -> None:
    got = completion_mask_from_ids(torch.tensor(ids), eos)
    assert got.tolist() == [[bool(x) for x in row] for row in expected]


@pytest.mark.parametrize(
    ("temperature", "top_p"),
    [
        (1.0, 1.0),  # untouched softmax
        (0.5, 1.0),  # sharpened
        (1.3, 0.8),  # flattened, then nucleus
        (1.0, 0.3),  # nucleus keeps only the top tokens
    ],
)
def test_distribution_matches_hf_warpers(temperature: float, top_p: float) -> None:
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(0)
    logits = torch.randn(3, 8) * 2
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    hf = scores.softmax(-1)
    ours = sampling_probs(logits, temperature, top_p)
    torch.testing.assert_close(ours, hf)

    # the inverse-CDF draws used inside the graph reproduce it: 40k draws per row
    n = 40_000
    g = torch.Generator().manual_seed(3)
    rows = logits.repeat_interleave(n, 0)
    u = torch.rand(rows.shape[0], generator=g)
    draws = [_choose(rows, u, temperature, top_p)]
    if top_p == 1.0:  # the blocked draw (no top-p), blocks of 3 with a shorter last one
        draws.append(_draw(rows, u, temperature, block=3))
    for drawn in draws:
        freq = torch.stack(
            [torch.bincount(drawn[i * n : (i + 1) * n], minlength=8).float() / n for i in range(3)]
        )
        assert (freq - hf).abs().max() < 0.012  # ~4.5 sigma at p=0.5
        assert (freq[hf == 0] == 0).all()  # filtered tokens are never drawn


@pytest.mark.parametrize(("vocab", "block"), [(50, 8), (2000, None), (151_936, None)])
def test_blocked_draw_is_the_same_inverse_cdf(vocab: int, block: int | None) -> None:
    """For the same uniform, the two-level draw picks the token the full-width cumulative sum
    picks, bar a float-rounding tie at a boundary (one in thousands); nothing of zero mass."""
    torch.manual_seed(1)
    logits = torch.randn(400 if vocab > 10_000 else 4000, vocab) * 3
    logits[:, 0] = -1e4  # a token of zero probability after exp
    u = torch.rand(logits.shape[0])
    for temperature in (1.0, 0.7):
        got = _draw(logits, u, temperature, block)
        assert (got != _choose(logits, u, temperature, 1.0)).sum() <= 2
        assert (got != 0).all() and (got < vocab).all()
    extreme = torch.tensor([0.0, 1.0 - 2**-24])  # the ends of the uniform's range
    assert (_draw(logits[:2], extreme, 1.0, block) != 0).all()


def test_block_size() -> None:
    assert [block_size(v) for v in (8, 2000, 32_000, 151_936)] == [8, 1000, 1000, 1187]
    assert block_size(100_003) == 1024  # a prime: 1,024 wide, the last block shorter


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),  # nothing to sample
        ({"top_p": 0.0}, "top_p"),  # an empty nucleus
        ({"top_p": 1.5}, "top_p"),  # not a probability
        ({"temperature": -1.0}, "temperature"),  # 0 is greedy; below is meaningless
    ],
)
def test_sampling_params_refuse_bad_values(kw: dict[str, Any], field: str) -> None:
    settings: dict[str, Any] = {"max_new_tokens": 4, "eos_token_id": 1, "pad_token_id": 0, **kw}
    with pytest.raises(ValueError, match=field):
        SamplingParams(**settings)


def test_gradient_checkpointing_keeps_generation_and_its_cache(tmp_path: Path) -> None:
    """A policy with gradient checkpointing on, in train mode (as in the loop), samples the
    same greedy tokens on both paths (the fast one's static KV cache, HF generate's cache)."""
    from arbiter.trainer.setup import enable_gradient_checkpointing, load_model, load_tokenizer

    path = build(tmp_path / "m", None)
    tok = load_tokenizer(path)
    tok.padding_side = "left"
    ids, mask = _enc(tok, PROMPTS)
    params = SamplingParams(10, -1, tok.pad_token_id, temperature=0.0)
    plain_model = load_model(path, torch.device("cpu"), "fp32", trainable=True)
    ref, _ = Sampler(plain_model)(ids, mask, params)
    model = load_model(path, torch.device("cpu"), "fp32", trainable=True)
    enable_gradient_checkpointing(model)
    assert model.training
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    fallback = Sampler(model)
    fallback.fast = False
    assert torch.equal(Sampler(model)(ids, mask, params)[0], ref)
    assert torch.equal(fallback(ids, mask, params)[0], ref)
    assert model.training  # the fallback path puts train mode back


@pytest.mark.parametrize("reuse_graphs", [True, False])
def test_cache_can_be_freed_between_calls(tiny: tuple[Any, Any], reuse_graphs: bool) -> None:
    """keep_cache=False frees the KV cache after every call (with ``reuse_graphs`` the bucket
    and its static buffers stay, without its cache; without, nothing stays)."""
    model, tok = tiny
    ids, mask = _enc(tok, PROMPTS)
    params = SamplingParams(6, -1, tok.pad_token_id, temperature=0.0)
    kept = Sampler(model)
    freed = Sampler(model, keep_cache=False, reuse_graphs=reuse_graphs)
    for _ in range(2):  # the second call reallocates what the first freed
        assert torch.equal(kept(ids, mask, params)[0], freed(ids, mask, params)[0])
        assert len(kept._buckets) == 1 and next(iter(kept._buckets.values())).cache is not None
        assert len(freed._buckets) == int(reuse_graphs)
        for bk in freed._buckets.values():
            assert bk.cache is None and bk.k_cache == [] and bk.v_cache == []


@pytest.mark.parametrize("reuse_graphs", [True, False])
@pytest.mark.parametrize("merged_qkv", [True, False])
def test_options_keep_the_greedy_ids(
    tiny: tuple[Any, Any], reuse_graphs: bool, merged_qkv: bool
) -> None:
    """The merged q/k/v product and the kept graphs, each on or off, cache kept or freed:
    HF generate's greedy ids, call after call."""
    model, tok = tiny
    ids, mask = _enc(tok, PROMPTS)
    pad = tok.pad_token_id
    ref = _hf_greedy(model, ids, mask, 30, eos=-1, pad=pad)
    params = SamplingParams(30, -1, pad, temperature=0.0)
    for keep in (True, False):
        sampler = Sampler(model, keep_cache=keep, reuse_graphs=reuse_graphs, merged_qkv=merged_qkv)
        for _ in range(2):
            assert torch.equal(sampler(ids, mask, params)[0], ref)
        assert bool(sampler._qkv) == (merged_qkv and (keep or reuse_graphs))  # all freed


def test_options_keep_seeded_sampling(tiny: tuple[Any, Any]) -> None:
    """Seeded samples (temperature 1 with the blocked draw, and top-p) are the same with the
    merged q/k/v product and kept graphs as without."""
    model, tok = tiny
    ids, mask = _enc(tok, PROMPTS * 2)

    def run(sampler: Sampler, top_p: float) -> torch.Tensor:
        gen = torch.Generator().manual_seed(7)
        params = SamplingParams(24, -1, tok.pad_token_id, 1.0, top_p, generator=gen)
        return sampler(ids, mask, params)[0]

    for top_p in (1.0, 0.9):
        new = Sampler(model, keep_cache=False)
        old = Sampler(model, keep_cache=False, reuse_graphs=False, merged_qkv=False)
        for _ in range(2):
            assert torch.equal(run(new, top_p), run(old, top_p))


def test_shortcuts_keep_the_greedy_ids(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attending only to the filled part of the cache (rounded up to 64 slots), prefilling each
    distinct prompt once and the blocked draw leave the greedy ids as they were; GRPO-style
    duplicated prompts, completions crossing several 64-slot lengths."""
    import arbiter.trainer.generation as generation

    model, tok = tiny
    ids, mask = _enc(tok, [p for p in PROMPTS for _ in range(3)])  # groups of 3 copies
    params = SamplingParams(150, -1, tok.pad_token_id, temperature=0.0)
    before = Sampler(model, length_round=0, share_prompts=False, blocked_draw=False)
    ref, _ = before(ids, mask, params)
    seen: list[tuple[int, int]] = []  # (rows, attended slots) of each decoder forward
    forward = generation.decoder.forward

    def spy(model: Any, ids: torch.Tensor, *a: Any, **kw: Any) -> torch.Tensor:
        seen.append((ids.shape[0], a[4].shape[-1]))
        return forward(model, ids, *a, **kw)

    monkeypatch.setattr(generation.decoder, "forward", spy)
    got, _ = Sampler(model, length_round=64)(ids, mask, params)
    assert torch.equal(got, ref)
    assert seen[0][0] == len(PROMPTS)  # one prefill row per distinct prompt
    p = ids.shape[1]  # decode step i attends to the first p + i slots, rounded up to 64
    assert [w for _, w in seen[1:]] == [-(-(p + i) // 64) * 64 for i in range(1, 150)]
    assert len({w for _, w in seen[1:]}) >= 3


def test_shortcuts_keep_seeded_sampling(tiny: tuple[Any, Any]) -> None:
    """Sampling with the same seed: the blocked draw picks the same tokens as the full-width
    cumulative sum (same uniforms, same inverse CDF) on this small vocabulary."""
    model, tok = tiny
    ids, mask = _enc(tok, PROMPTS * 2)

    def run(sampler: Sampler) -> torch.Tensor:
        gen = torch.Generator().manual_seed(5)
        return sampler(ids, mask, SamplingParams(40, -1, tok.pad_token_id, generator=gen))[0]

    old = Sampler(model, length_round=0, share_prompts=False, blocked_draw=False)
    assert torch.equal(run(Sampler(model)), run(old))


@pytest.mark.parametrize("attention", ["flex", "sdpa"])
def test_fused_decode_attention_keeps_the_greedy_ids(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, attention: str
) -> None:
    """The decode steps through ``decoder.fused_attention`` (eager here, float32 model): the
    greedy ids are HF generate's; prefill keeps the eager attention."""
    import arbiter.trainer.generation as generation

    model, tok = tiny
    ids, mask = _enc(tok, PROMPTS)
    pad = tok.pad_token_id
    ref = _hf_greedy(model, ids, mask, 40, eos=-1, pad=pad)
    kinds: list[tuple[int, str]] = []  # (query tokens, attention) of each decoder forward
    forward = generation.decoder.forward

    def spy(model: Any, ids: torch.Tensor, *a: Any, **kw: Any) -> torch.Tensor:
        kinds.append((ids.shape[1], a[7] if len(a) > 7 else kw.get("attention", "eager")))
        return forward(model, ids, *a, **kw)

    monkeypatch.setattr(generation.decoder, "forward", spy)
    sampler = Sampler(model, attention=attention)
    got, _ = sampler(ids, mask, SamplingParams(40, -1, pad, temperature=0.0))
    assert torch.equal(got, ref)
    assert kinds[0] == (ids.shape[1], "eager") and set(kinds[1:]) == {(1, attention)}


def test_attention_option() -> None:
    """The eager attention is the default (compiled or not); unknown names are refused."""
    model = torch.nn.Linear(2, 2)  # not a supported decoder: plain generate, options still set
    assert Sampler(model).attention == "eager"
    assert Sampler(model, compile=True).attention == "eager"
    assert Sampler(model, attention="flex").attention == "flex"
    with pytest.raises(ValueError, match="attention 'fused'"):
        Sampler(model, attention="fused")
