"""Tokenize a batch with the model's Rust tokenizer directly, only where that is exact.

sentence-transformers' ``preprocess`` goes through the Hugging Face tokenizer wrapper, whose
Python side (per-text lists, padding, tensor conversion) costs ~9x the Rust encoding itself:
on the H200 machine, 128 GSM8K answers took 31 ms through ``preprocess``, 3.5 ms in
``Tokenizer.encode_batch`` and 5.6 ms in the forward pass of all-MiniLM-L6-v2 — so a GPU
embedding service spends most of its time tokenizing.

``FastTokenizer.for_model`` takes a copy of the wrapper's Rust tokenizer (same vocabulary,
normalizer, pre-tokenizer, special-token template), sets its truncation to the model's
``max_seq_length``, pads with numpy, and then checks itself: on probe texts (whitespace,
case, unicode, empty, longer than the limit) its features must equal ``preprocess``'s
exactly — same keys, dtypes, shapes and values. Any model where they differ (a prompt, a
lowercasing step of sentence-transformers' own, an extra input) gets ``None``, and the
encoder keeps using ``preprocess``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger("arbiter.embedding")

# the tensors it builds: feature name -> attribute of a tokenizers.Encoding
_FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
PROBES = [
    "A short answer. #### 42",
    "  Leading and trailing spaces, Mixed CASE, tabs\tand\nnewlines  ",
    "Unicode: café, naïve, 3½ × 4 = 14, 東京, emoji 🙂",
    "",
    "x",
    "word " * 2000,  # longer than any max_seq_length: truncated
    "She sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72",
]


class FastTokenizer:
    """``preprocess``-equivalent features for a list of texts; see the module docstring."""

    def __init__(self, backend: Any, pad_id: int, pad_type_id: int, left: bool,
                 keys: list[str], extras: dict[str, Any]):  # fmt: skip
        self.backend, self.pad_id, self.pad_type_id, self.left = backend, pad_id, pad_type_id, left
        self.keys, self.extras = keys, extras  # feature order; constant non-tensor entries

    @classmethod
    def for_model(cls, model: Any, max_seq_length: int) -> FastTokenizer | None:
        """The fast path for this sentence-transformers model, or None where it is not exact."""
        from tokenizers import Tokenizer

        hf = model.tokenizer
        backend = getattr(hf, "backend_tokenizer", None)
        preprocess = getattr(model, "preprocess", None) or model.tokenize
        if backend is None:
            return None
        fast = Tokenizer.from_str(backend.to_str())
        fast.no_padding()
        side = getattr(hf, "truncation_side", "right")
        fast.enable_truncation(max_seq_length, strategy="longest_first", direction=side)
        try:
            a, b = preprocess(PROBES), preprocess(PROBES[:3])
        except Exception as exc:  # a model that cannot tokenize the probes: no fast path
            log.info("fast tokenizer off: preprocess failed on the probes (%s)", exc)
            return None
        keys = list(a)
        extras = {k: v for k, v in a.items() if k not in _FIELDS}
        if any(hasattr(v, "shape") or b.get(k) != v for k, v in extras.items()):
            log.info("fast tokenizer off: preprocess returns per-batch inputs %s", list(extras))
            return None
        pad_id = hf.pad_token_id if hf.pad_token_id is not None else 0
        left = getattr(hf, "padding_side", "right") == "left"
        me = cls(fast, int(pad_id), int(getattr(hf, "pad_token_type_id", 0)), left, keys, extras)
        if not (same(me(PROBES), a) and same(me(PROBES[:3]), b)):
            log.info("fast tokenizer off: its features differ from preprocess on the probes")
            return None
        return me

    def __call__(self, texts: list[str]) -> dict[str, Any]:
        import torch

        encodings = self.backend.encode_batch(texts)
        n = len(encodings)
        width = max((len(e.ids) for e in encodings), default=0)
        pads = {"input_ids": self.pad_id, "attention_mask": 0, "token_type_ids": self.pad_type_id}
        wanted = [key for key in self.keys if key in _FIELDS]  # only what preprocess() returns
        arrays = {key: np.full((n, width), pads[key], dtype=np.int64) for key in wanted}
        for i, e in enumerate(encodings):
            k = len(e.ids)
            cols = slice(width - k, width) if self.left else slice(0, k)
            for key in wanted:
                arrays[key][i, cols] = getattr(e, _FIELDS[key])
        return {
            key: torch.from_numpy(arrays[key]) if key in arrays else self.extras[key]
            for key in self.keys
        }


class TokenCounter:
    """Tokens per text for the batcher's token budget, counted when a request arrives, before
    any batch is built: with a copy of the model's Rust tokenizer, truncation set to
    ``max_seq_length`` (the fast path's own counts, exactly; for a model without the fast
    path the same tokenizer without sentence-transformers' extra steps, a close estimate).
    Only ``encode_batch`` is called on its own copy, so it is safe beside the prepare thread.
    Without a Rust tokenizer, or where it fails on a text, a bound: UTF-8 bytes + 2 special
    tokens, at most ``max_seq_length`` (a token covers at least one byte)."""

    def __init__(self, backend_json: str | None, max_seq_length: int):
        self.limit = max_seq_length
        self.backend: Any = None
        if backend_json is not None:
            from tokenizers import Tokenizer

            self.backend = Tokenizer.from_str(backend_json)

    @classmethod
    def for_tokenizer(cls, hf: Any, max_seq_length: int) -> TokenCounter:
        """The counter of a Hugging Face tokenizer (its backend, when it has one)."""
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            return cls(None, max_seq_length)
        from tokenizers import Tokenizer

        copy = Tokenizer.from_str(backend.to_str())
        copy.no_padding()
        side = getattr(hf, "truncation_side", "right")
        copy.enable_truncation(max_seq_length, strategy="longest_first", direction=side)
        return cls(copy.to_str(), max_seq_length)

    def to_json(self) -> str | None:
        """What a counter in another process is built from (``encoder_process``)."""
        return self.backend.to_str() if self.backend is not None else None

    def __call__(self, texts: list[str]) -> np.ndarray:
        if self.backend is not None:
            try:
                encodings = self.backend.encode_batch(texts)
                return np.fromiter((len(e.ids) for e in encodings), dtype=np.int64,
                                   count=len(encodings))  # fmt: skip
            except Exception:  # the batch's own tokenization reports it; a bound will do
                log.debug("token count fell back to the byte bound", exc_info=True)
        raw = np.fromiter((len(t.encode("utf-8", "surrogatepass")) + 2 for t in texts),
                          dtype=np.int64, count=len(texts))  # fmt: skip
        return np.minimum(raw, self.limit)


def same(x: dict[str, Any], y: dict[str, Any]) -> bool:
    """Same keys in the same order, tensors equal in dtype, shape and value."""
    import torch

    if list(x) != list(y):
        return False
    for k, v in x.items():
        w = y[k]
        if isinstance(v, torch.Tensor) or isinstance(w, torch.Tensor):
            if not (isinstance(v, torch.Tensor) and isinstance(w, torch.Tensor)):
                return False
            if v.dtype != w.dtype or v.shape != w.shape or not torch.equal(v, w):
                return False
        elif v != w:
            return False
    return True
