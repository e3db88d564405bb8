"""The model side: load a sentence-transformers model once, count tokens, encode a batch.

A batch goes through two steps, each on its own single thread (see ``batching.py``):
``Encoder.prepare`` tokenizes it ONCE with the model's own preprocessing (or the
equivalent, checked, Rust-only path of ``fast_tokenize.py``) and counts each
text's tokens from the attention mask; ``Encoder.forward`` sorts it by length so that
each forward pass pads little, cuts it into forward passes under ``batch_size`` texts and
``max_batch_tokens`` padded tokens, and returns L2-normalised float32 rows in the
caller's order. ``Encoder.encode`` does both.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from arbiter.services.embedding.fast_tokenize import FastTokenizer, TokenCounter
from arbiter.services.embedding.settings import EmbeddingSettings

log = logging.getLogger("arbiter.embedding")

_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


@dataclass(frozen=True)
class Prepared:
    """A tokenized batch, ready for the forward passes (see ``Encoder.prepare``)."""

    features: dict[str, Any]  # the model's own preprocess() output, padded to the longest
    tokens: np.ndarray  # (n,) tokens per text, after truncation
    truncated: np.ndarray  # (n,) bool


@dataclass(frozen=True)
class Encoded:
    vectors: np.ndarray  # (n, dim) float32, rows of unit length (zero rows stay zero)
    tokens: np.ndarray  # (n,) tokens embedded per text, after truncation
    truncated: np.ndarray  # (n,) bool: the text was longer than max_seq_length


def hub_offline() -> bool:
    """Offline unless asked: only ``HF_HUB_OFFLINE=0`` (or false/no/off) lets the model load
    download from the hub; unset means the model must already be on disk."""
    value = os.environ.get("HF_HUB_OFFLINE", "1").strip().lower()
    return value not in ("0", "false", "no", "off")


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
            local_files_only=hub_offline(),
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
        self.fast = (
            FastTokenizer.for_model(self.model, self.max_seq_length)
            if settings.fast_tokenize
            else None
        )
        self.counter = TokenCounter.for_tokenizer(self.tokenizer, self.max_seq_length)
        get_dim = getattr(self.model, "get_embedding_dimension", None) or getattr(
            self.model, "get_sentence_embedding_dimension", None
        )  # renamed in sentence-transformers 6.x
        dim = get_dim() if get_dim is not None else None
        if dim is None:  # a model without a fixed output size: ask it once
            dim = int(self.model.encode(["dimension probe"]).shape[1])
        self.dim = int(dim)
        log.info(
            "loaded %s on %s (%s) in %.1fs: dim %d, max_seq_length %d, tokenizing %s",
            settings.model, self.device, settings.dtype, time.perf_counter() - start,
            self.dim, self.max_seq_length,
            "with the Rust tokenizer directly" if self.fast else "through preprocess()",
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

    def count(self, texts: list[str]) -> np.ndarray:
        """Tokens per text as ``prepare`` will count them (``TokenCounter``), without
        building the batch; the batcher calls it when a request arrives, from any thread."""
        return self.counter(texts)

    def prepare(self, texts: list[str]) -> Prepared:
        """Tokenize ``texts`` once, with the model's own preprocessing (what ``encode``
        would do), and count tokens from the attention mask. Only texts that fill the
        whole ``max_seq_length`` are tokenized a second time, to tell "exactly at the
        limit" from "cut". Runs in its own thread, ahead of the forward pass (the fast
        tokenizer releases the GIL), so tokenizing batch k+1 overlaps the forward of k."""
        import torch

        if self.fast is not None:  # checked equal to preprocess() at load (fast_tokenize.py)
            features = self.fast(texts)
        else:  # preprocess() in sentence-transformers >= 6; tokenize() (deprecated) below it
            features = (getattr(self.model, "preprocess", None) or self.model.tokenize)(texts)
        mask = features.get("attention_mask")
        if not isinstance(mask, torch.Tensor) or mask.shape[0] != len(texts):
            tokens, truncated = self.count_tokens(texts)  # a module without a mask
            return Prepared(features, tokens, truncated)
        tokens = mask.sum(dim=1).numpy().astype(np.int64)
        truncated = np.zeros(len(texts), dtype=bool)
        full = np.flatnonzero(tokens >= self.max_seq_length)
        if full.size:
            truncated[full] = self.count_tokens([texts[i] for i in full])[1]
        return Prepared(features, tokens, truncated)

    def forward(self, prepared: Prepared) -> Encoded:
        """Forward passes over a prepared batch: sorted by length and cut into passes of
        ≤ batch_size texts and ≤ max_batch_tokens padded tokens, each padded only to its
        own longest text; L2-normalised on the device; rows in the caller's order."""
        import torch

        n = len(prepared.tokens)
        out = np.empty((n, self.dim), dtype=np.float32)
        s = self.settings
        width = _seq_width(prepared.features, n)
        left = getattr(self.tokenizer, "padding_side", "right") == "left"
        with torch.inference_mode():
            for idx in plan_chunks(prepared.tokens, s.batch_size, s.max_batch_tokens):
                length = max(int(prepared.tokens[idx].max()), 1)
                rows = torch.from_numpy(idx)
                chunk: dict[str, Any] = {}
                for key, value in prepared.features.items():
                    if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n:
                        value = value[rows]
                        if value.dim() == 2 and value.shape[1] == width and width > length:
                            value = value[:, -length:] if left else value[:, :length]
                        value = value.to(self.model.device, non_blocking=True)
                    chunk[key] = value
                emb = self.model(chunk)["sentence_embedding"].float()
                emb = torch.nn.functional.normalize(emb, p=2, dim=1)  # zero rows stay zero
                out[idx] = emb.cpu().numpy()
        return Encoded(out, prepared.tokens, prepared.truncated)

    def encode(self, texts: list[str]) -> Encoded:
        """Embed ``texts``; rows come back in the order given."""
        if not texts:
            return Encoded(
                np.zeros((0, self.dim), np.float32), np.zeros(0, np.int64), np.zeros(0, bool)
            )
        return self.forward(self.prepare(texts))


def _seq_width(features: dict[str, Any], n: int) -> int:
    """The padded sequence length of a preprocessed batch (from its attention mask)."""
    mask = features.get("attention_mask")
    shape = tuple(getattr(mask, "shape", ()))
    return int(shape[1]) if len(shape) == 2 and shape[0] == n else -1
