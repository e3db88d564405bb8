"""The model side: load a sentence-transformers model once, count tokens, encode a batch.

``Encoder.encode`` is called from ONE worker thread (see ``batching.py``). It counts each
text's tokens with the model's own tokenizer, sorts the batch by length so that each
forward pass pads little, cuts it into forward passes under ``batch_size`` texts and
``max_batch_tokens`` padded tokens, and returns L2-normalised float32 rows in the
caller's order.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import numpy as np

from services.embedding.settings import EmbeddingSettings

log = logging.getLogger("arbiter.embedding")

_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


@dataclass(frozen=True)
class Encoded:
    vectors: np.ndarray  # (n, dim) float32, rows of unit length (zero rows stay zero)
    tokens: np.ndarray  # (n,) tokens embedded per text, after truncation
    truncated: np.ndarray  # (n,) bool: the text was longer than max_seq_length


def l2_normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def resolve_device(device: str) -> str:
    import torch

    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def configure_torch(device: str, cudnn_sdpa: bool) -> None:
    """Process-wide torch switches for serving: without cuDNN attention on GPU (see
    EmbeddingSettings.cudnn_sdpa), torch picks flash / memory-efficient attention."""
    import torch

    if device.startswith("cuda") and not cudnn_sdpa:
        torch.backends.cuda.enable_cudnn_sdp(False)


def plan_chunks(lengths: np.ndarray, batch_size: int, max_batch_tokens: int) -> list[np.ndarray]:
    """Split texts into forward passes, longest first: ≤ batch_size texts and
    ≤ max_batch_tokens padded tokens (texts × longest) each. Returns index arrays."""
    order = np.argsort(-lengths, kind="stable")
    chunks: list[np.ndarray] = []
    start = 0
    n = len(order)
    while start < n:
        longest = max(int(lengths[order[start]]), 1)
        size = min(batch_size, max(1, max_batch_tokens // longest), n - start)
        chunks.append(order[start : start + size])
        start += size
    return chunks


class Encoder:
    """One loaded model. Not thread-safe: call ``encode`` from one thread at a time."""

    def __init__(self, settings: EmbeddingSettings):
        import torch
        from sentence_transformers import SentenceTransformer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.settings = settings
        self.device = resolve_device(settings.device)
        if self.device == "cpu" and settings.dtype == "float16":
            raise ValueError(
                "EMBEDDING_DTYPE=float16 resolved to a CPU device; use float32 or bfloat16 on CPU"
            )
        configure_torch(self.device, settings.cudnn_sdpa)
        if self.device == "cpu" and settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        start = time.perf_counter()
        self.model = SentenceTransformer(
            settings.model,
            device=self.device,
            trust_remote_code=settings.trust_remote_code,
            model_kwargs={"dtype": getattr(torch, _DTYPES[settings.dtype])},
        )
        self.model.eval()
        if settings.max_seq_length is not None:
            self.model.max_seq_length = settings.max_seq_length
        limit = self.model.max_seq_length
        if not limit or limit > 1_000_000:  # tokenizers without a limit report a huge sentinel
            raise ValueError(
                f"model {settings.model!r} declares no usable max sequence length; "
                "set EMBEDDING_MAX_SEQ_LENGTH"
            )
        self.max_seq_length = int(limit)
        self.tokenizer = self.model.tokenizer
        get_dim = getattr(self.model, "get_embedding_dimension", None) or getattr(
            self.model, "get_sentence_embedding_dimension", None
        )  # renamed in sentence-transformers 6.x
        dim = get_dim() if get_dim is not None else None
        if dim is None:  # a model without a fixed output size: ask it once
            dim = int(self.model.encode(["dimension probe"]).shape[1])
        self.dim = int(dim)
        log.info(
            "loaded %s on %s (%s) in %.1fs: dim %d, max_seq_length %d",
            settings.model, self.device, settings.dtype, time.perf_counter() - start,
            self.dim, self.max_seq_length,
        )  # fmt: skip

    def count_tokens(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(tokens embedded, truncated?) per text, counted with the model's tokenizer,
        special tokens included, exactly as the model will see them."""
        limit = self.max_seq_length
        ids = self.tokenizer(
            texts,
            add_special_tokens=True,
            truncation=True,
            max_length=limit + 1,  # one past the limit is enough to know it was cut
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]
        raw = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        return np.minimum(raw, limit), raw > limit

    def encode(self, texts: list[str]) -> Encoded:
        """Embed ``texts``; rows come back in the order given."""
        n = len(texts)
        if n == 0:
            return Encoded(
                np.zeros((0, self.dim), np.float32), np.zeros(0, np.int64), np.zeros(0, bool)
            )
        tokens, truncated = self.count_tokens(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        s = self.settings
        for idx in plan_chunks(tokens, s.batch_size, s.max_batch_tokens):
            chunk = [texts[i] for i in idx]
            emb = self.model.encode(
                chunk,
                batch_size=len(chunk),
                convert_to_numpy=True,
                normalize_embeddings=False,
                show_progress_bar=False,
            )
            out[idx] = np.asarray(emb, dtype=np.float32)
        return Encoded(l2_normalize(out), tokens, truncated)
