"""The Rust-only tokenizing path: exactly preprocess()'s features, or not used at all."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arbiter.services.embedding.encoder import Encoder
from arbiter.services.embedding.fast_tokenize import PROBES, FastTokenizer, TokenCounter, same
from arbiter.services.embedding.settings import EmbeddingSettings


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder(EmbeddingSettings(device="cpu"))


def test_features_equal_preprocess(encoder: Encoder, gsm8k_answers: list[str]) -> None:
    assert encoder.fast is not None  # all-MiniLM-L6-v2 qualifies
    long = " ".join(gsm8k_answers[:20])  # cut at max_seq_length
    for texts in (gsm8k_answers[:200], [long, "", "  x  "], PROBES, gsm8k_answers[7:8]):
        got, want = encoder.fast(texts), encoder.model.preprocess(texts)
        assert list(got) == list(want)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert got[key].dtype == value.dtype, key
                torch.testing.assert_close(got[key], value, rtol=0, atol=0)
            else:
                assert got[key] == value


def test_both_paths_embed_alike(encoder: Encoder, gsm8k_answers: list[str]) -> None:
    slow = Encoder(EmbeddingSettings(device="cpu", fast_tokenize=False))
    assert slow.fast is None
    texts = [*gsm8k_answers[:12], " ".join(gsm8k_answers[30:40]), "x"]
    a, b = encoder.encode(texts), slow.encode(texts)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.truncated, b.truncated)
    np.testing.assert_allclose(a.vectors, b.vectors, atol=1e-6)


def test_refused_where_not_exact(encoder: Encoder) -> None:
    # a truncation limit other than the one preprocess() applies: the long probe differs
    assert FastTokenizer.for_model(encoder.model, encoder.max_seq_length // 2) is None
    assert FastTokenizer.for_model(encoder.model, encoder.max_seq_length) is not None


def test_same_compares_dtype_shape_and_order() -> None:
    x = {"a": torch.zeros(2, 3, dtype=torch.int64), "m": "text"}
    assert same(x, {"a": torch.zeros(2, 3, dtype=torch.int64), "m": "text"})
    assert not same(x, {"a": torch.zeros(2, 3, dtype=torch.int32), "m": "text"})
    assert not same(x, {"a": torch.zeros(2, 4, dtype=torch.int64), "m": "text"})
    assert not same(x, {"m": "text", "a": torch.zeros(2, 3, dtype=torch.int64)})
    assert not same(x, {"a": torch.zeros(2, 3, dtype=torch.int64), "m": "image"})


def test_token_counter_without_a_rust_tokenizer_is_a_bound() -> None:
    # a tokenizer with no Rust backend: UTF-8 bytes + 2 special tokens, cut at the limit,
    # never below the real count (a token covers at least one byte)
    counter = TokenCounter(None, 256)
    assert counter(["abc", "", "é", "x" * 1000]).tolist() == [5, 2, 4, 256]


def test_token_counter_rebuilt_from_json_counts_as_the_model(
    encoder: Encoder, gsm8k_answers: list[str]
) -> None:
    # what the process worker's parent does with the child's counter
    texts = [*gsm8k_answers[500:510], " ".join(gsm8k_answers[:20]), ""]
    copy = TokenCounter(encoder.counter.to_json(), encoder.max_seq_length)
    np.testing.assert_array_equal(copy(texts), encoder.prepare(texts).tokens)
