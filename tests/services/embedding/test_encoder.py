"""The encoder in-process (all-MiniLM-L6-v2 on CPU): one tokenization per batch, forward
passes cut by length and budget, against plain ``SentenceTransformer.encode``."""

from __future__ import annotations

import numpy as np
import pytest

from arbiter.services.embedding.encoder import Encoder
from arbiter.services.embedding.settings import EmbeddingSettings


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    # small passes and a tight token budget so that one batch is cut into several,
    # each sliced out of the batch's one padded tokenization
    return Encoder(EmbeddingSettings(device="cpu", batch_size=3, max_batch_tokens=512))


def test_rows_match_plain_encode(encoder: Encoder, gsm8k_answers: list[str]) -> None:
    texts = [*gsm8k_answers[:9], "short", "x", " ".join(gsm8k_answers[20:30])]
    got = encoder.encode(texts)
    want = encoder.model.encode(texts, batch_size=64, normalize_embeddings=True)
    np.testing.assert_allclose(got.vectors, want, atol=2e-5)
    norms = np.linalg.norm(got.vectors, axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)


def test_token_counts_and_truncation(encoder: Encoder, gsm8k_answers: list[str]) -> None:
    limit = encoder.max_seq_length
    texts = [gsm8k_answers[0], "hello world", " ".join(gsm8k_answers[40:50])]
    got = encoder.encode(texts)
    # counted with the tokenizer directly: special tokens included, capped at the limit
    ids = encoder.tokenizer(texts, truncation=False)["input_ids"]
    np.testing.assert_array_equal(got.tokens, [min(len(x), limit) for x in ids])
    np.testing.assert_array_equal(got.truncated, [len(x) > limit for x in ids])
    assert got.truncated.tolist() == [False, False, True]


def test_prepare_then_forward_equals_encode(encoder: Encoder, gsm8k_answers: list[str]) -> None:
    texts = gsm8k_answers[100:107]
    a = encoder.forward(encoder.prepare(texts))
    b = encoder.encode(texts)
    np.testing.assert_array_equal(a.vectors, b.vectors)
    np.testing.assert_array_equal(a.tokens, b.tokens)


def test_count_before_the_batch_equals_the_batch_tokens(
    encoder: Encoder, gsm8k_answers: list[str]
) -> None:
    # the batcher's token budget counts each text when its request arrives: the same
    # numbers the batch's tokenization gives (special tokens in, cut at the limit)
    texts = [*gsm8k_answers[200:205], "", "x", " ".join(gsm8k_answers[50:60])]
    counted = encoder.count(texts)
    np.testing.assert_array_equal(counted, encoder.prepare(texts).tokens)
    assert counted[-1] == encoder.max_seq_length
