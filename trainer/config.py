"""Trainer configuration: one flat dataclass, every field documented, checked on creation.

Loaded from YAML, then ``key=value`` overrides from the command line (values parsed as
YAML, so ``beta=0``, ``pipeline=true``, ``recipe={"components": [...]}`` all work).
Errors say how to fix the setting, in the manner of TRL's ``GRPOConfig``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from arbiter import gsm8k


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


class ConfigError(ValueError):
    """A setting that cannot work; the message says how to fix it."""


class RunError(RuntimeError):
    """A run that cannot start or go on for a reason the user can fix (a run_dir that holds a
    run, a model that is not there, a gateway that stays unreachable); the message says how.
    The CLI prints it as one line, without a traceback."""


@dataclass
class TrainerConfig:
    # --- model and data
    model: str = _f("", "Hugging Face causal-LM directory or hub id (offline: a local path).")
    data_dir: str = _f(
        str(gsm8k.default_dir()),
        "Directory with GSM8K train.jsonl/test.jsonl (default: $ARBITER_GSM8K_DIR, else "
        "../shared/data/gsm8k beside the checkout).",
    )
    train_file: str = _f(
        "train.jsonl", "Training problems (jsonl with question/answer), in data_dir."
    )
    eval_file: str = _f("test.jsonl", "Held-out problems for evaluation, in data_dir.")
    max_train_problems: int = _f(0, "Use only the first N training problems (0 = all).")
    system_prompt: str = _f("", "Optional system message put before every prompt.")
    max_prompt_tokens: int = _f(512, "Prompts longer than this (in tokens) are left-truncated.")
    run_dir: str = _f(
        "runs/default", "Output directory: config, metrics.jsonl, curves, checkpoints."
    )
    seed: int = _f(0, "Seed for data order, sampling and initialisation.")

    # --- rollout
    steps: int = _f(100, "Number of optimizer steps (GRPO iterations) to run.")
    rollouts_per_step: int = _f(
        64, "Completions per step per process (= prompts x group_size); each rank its own prompts."
    )
    group_size: int = _f(
        8, "G: completions sampled per prompt; advantages are normalised within it."
    )
    max_new_tokens: int = _f(
        256, "Max tokens per completion (per turn in multi-turn environments)."
    )
    temperature: float = _f(1.0, "Sampling temperature for rollouts (> 0).")
    top_p: float = _f(1.0, "Nucleus sampling threshold for rollouts, in (0, 1].")
    env: str = _f(
        "none",
        "none: single-turn; calculator: multi-turn <calc>expr</calc> tool environment; "
        "calculator-off: its prompt, no calculator (one turn: the baseline without the tool); "
        "ors:<name>: the episodes of environment <name> through the gateway's /ors (its "
        "rewards are the episodes' own; e.g. ors:calculator).",
    )
    max_turns: int = _f(4, "Multi-turn only: max model turns per trajectory.")

    # --- rewards (gateway)
    gateway_url: str = field(
        default_factory=lambda: os.environ.get("ARBITER_URL") or "http://127.0.0.1:8000",
        metadata={
            "help": "Arbiter gateway base URL (POST /v1/score); default $ARBITER_URL, then "
            "http://127.0.0.1:8000. The run's config.json records the one used."
        },
    )
    recipe: Any = field(
        default="gsm8k",
        metadata={"help": "Recipe name registered in the gateway, or an inline recipe mapping."},
    )
    api_key: str = _f(
        "", "Bearer token for the gateway, if it requires one (empty: $ARBITER_API_KEY)."
    )
    reward_concurrency: int = _f(16, "Max /v1/score requests in flight (one request per group).")
    reward_timeout_s: float = _f(120.0, "HTTP timeout of one /v1/score request.")
    reward_retries: int = _f(
        4, "Retries of a retryable failure (connect error, timeout, 429, 5xx)."
    )
    reward_backoff_s: float = _f(
        0.5,
        "First retry delay; doubles per retry (at most 20 s, jittered; a 429's Retry-After wins).",
    )
    max_skipped_batches: int = _f(
        5, "Stop the run after this many consecutive batches skipped for lack of rewards."
    )
    pipeline: bool = _f(
        False,
        "Generate batch k+1 while batch k's rewards are in flight (one step off-policy; the "
        "importance ratio uses the behaviour log-probs).",
    )

    # --- GRPO objective
    scale_rewards: bool = _f(True, "Divide advantages by the group std (false: Dr. GRPO style).")
    adv_eps: float = _f(1e-4, "eps in (r - mean) / (std + eps).")
    eps_low: float = _f(0.2, "Lower clip range: ratio clipped at 1 - eps_low.")
    eps_high: float = _f(0.2, "Upper clip range: ratio clipped at 1 + eps_high (DAPO: 0.28).")
    beta: float = _f(0.0, "KL penalty weight (k3 estimator) to the frozen reference; 0 skips it.")
    loss_agg: Literal["token_mean", "seq_mean"] = _f(
        "token_mean", "token_mean: mean over all completion tokens; seq_mean: per sequence first."
    )
    mu: int = _f(1, "Inner optimisation passes over each batch (mu > 1 makes the ratio != 1).")
    micro_batch_size: int = _f(16, "Sequences per forward/backward; gradients are accumulated.")

    # --- optimiser
    lr: float = _f(1e-6, "AdamW peak learning rate.")
    warmup_steps: int = _f(0, "Linear warm-up steps from 0 to lr; constant afterwards.")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    adam_betas: list[float] = field(
        default_factory=lambda: [0.9, 0.99], metadata={"help": "AdamW betas."}
    )
    max_grad_norm: float = _f(1.0, "Gradient clipping norm (0 disables).")

    # --- hardware
    device: str = _f("auto", "auto (cuda if available, else cpu), cpu, cuda.")
    precision: Literal["auto", "fp32", "bf16-mixed", "bf16"] = _f(
        "auto",
        "auto: bf16-mixed on GPU, fp32 on CPU; bf16-mixed: fp32 weights + bf16 autocast; "
        "bf16: bf16 weights (fastest, loses tiny updates).",
    )
    gradient_checkpointing: bool = _f(
        False,
        "Recompute each decoder layer's activations in backward instead of keeping them "
        "(less memory, about one more forward of compute); generation keeps its KV cache.",
    )
    gradient_checkpointing_keep_layers: int = _f(
        0,
        "With gradient_checkpointing: this many decoder layers, spread evenly, keep their "
        "activations instead of recomputing them (less compute for memory: about 0.3 GiB a "
        "layer at 8 x 751 tokens of Qwen2.5-1.5B).",
    )
    logprob_chunk_tokens: int = _f(
        1024,
        "Tokens per chunk of the output head when computing log-probs: the [tokens, vocab] "
        "fp32 logits are never held whole, only chunk x vocab (recomputed in backward); "
        "0 = the whole micro-batch's logits at once.",
    )
    logprob_keep_logits: bool = _f(
        False,
        "Keep each head chunk's logits (compute dtype) from forward to backward instead of "
        "recomputing them: one output-head product less per chunk, for micro-batch "
        "completion tokens x vocab values held (1.2 GB in bf16 at 8 x 512 tokens, vocab "
        "151,936). No effect with logprob_chunk_tokens=0, which keeps them anyway.",
    )
    shared_prefix: bool = _f(
        True,
        "Training forward: the rows of a micro-batch that share a prompt (GRPO's group) run it "
        "once and attend to that one copy (exact; at GSM8K's shape a fifth fewer tokens). "
        "Qwen2/Qwen3/Llama/Mistral-shaped models; false = every row runs its prompt.",
    )
    fsdp: bool = _f(
        False,
        "Shard parameters, gradients and optimizer state over the torchrun ranks with FSDP2 "
        "(for models whose full fine-tune does not fit one GPU); false = DDP replicas. "
        "Checkpoints are then sharded (torch.distributed.checkpoint).",
    )
    compile_sampler: bool = _f(
        True,
        "torch.compile the sampler's decode step before CUDA-graph capture (GPU only; the CPU "
        "samples eagerly); compiles once per batch/length shape. false = graphs only.",
    )
    compile_train: bool = _f(
        True,
        "torch.compile the decoder layers (regional) and the log-prob head's element-wise "
        "maths for the training forward/backward (GPU only, not with fsdp; the CPU runs "
        "eagerly); the first steps compile (about a minute). false = eager.",
    )
    sampler_keep_cache: bool = _f(
        True,
        "Keep the sampler's KV cache (rows x (longest prompt + max_new_tokens), per layer) "
        "between rollouts; false frees it before each training step (less memory; the CUDA "
        "graphs, their memory pool and the merged q/k/v weights, 176 MB at 1.5B, stay, and "
        "the graphs are replayed when the cache comes back at its address).",
    )
    cpu_threads: int = _f(
        0, "torch intra-op threads on CPU (0 = torch's default); 1 is fastest for tiny models."
    )

    # --- evaluation, logging, checkpoints
    eval_every: int = _f(0, "Evaluate every N steps (and before step 0 and at the end); 0 = never.")
    eval_problems: int = _f(200, "Held-out problems per evaluation (greedy, one sample each).")
    eval_samples: int = _f(
        0,
        "Also sample this many completions per held-out problem (rollout temperature) at each "
        "evaluation: pass@k for k = 1, 2, 4, ... up to it (unbiased estimator) and, with the "
        "diversity component in eval_recipe, the mean pairwise distance within a problem's "
        "samples; 0 = greedy only.",
    )
    eval_max_new_tokens: int = _f(0, "Max new tokens at evaluation (0 = max_new_tokens).")
    eval_recipe: Any = field(
        default_factory=lambda: {
            "components": [{"name": "math_accuracy", "weight": 1.0, "params": {}}]
        },
        metadata={"help": "Recipe for evaluation accuracy (default: inline math_accuracy)."},
    )
    save_every: int = _f(
        0, "Checkpoint every N steps (and at the end); 0 = only at the end; -1 = never."
    )
    keep_checkpoints: int = _f(2, "Keep the latest N checkpoints.")
    resume: bool = _f(False, "Resume from the latest checkpoint in run_dir.")
    progress: bool = _f(True, "Show a tqdm progress bar (rank 0).")
    plot: bool = _f(True, "Write curves.png (reward and accuracy) at the end.")

    def __post_init__(self) -> None:
        self._coerce()
        self.check()

    def _coerce(self) -> None:
        """YAML reads ``1e-6`` as a string (YAML 1.1 wants ``1.0e-6``); coerce by field type."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            try:
                if f.type == "float" and isinstance(v, (str, int)) and not isinstance(v, bool):
                    setattr(self, f.name, float(v))
                elif f.type == "int" and isinstance(v, str):
                    setattr(self, f.name, int(v))
                elif f.type == "str" and not isinstance(v, str):
                    setattr(self, f.name, str(v))
            except ValueError:
                raise ConfigError(f"{f.name}={v!r}: expected a {f.type}.") from None
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                raise ConfigError(f"{f.name}={v!r}: expected true or false.")

    @property
    def prompts_per_step(self) -> int:
        return self.rollouts_per_step // self.group_size

    def check(self) -> None:
        def bad(msg: str) -> None:
            raise ConfigError(msg)

        if not self.model:
            bad("model is empty: set model=PATH (a Hugging Face causal-LM directory).")
        if self.group_size < 2:
            bad(f"group_size={self.group_size}: GRPO needs >= 2 completions per prompt; set 8.")
        if self.rollouts_per_step % self.group_size:
            lo = self.rollouts_per_step // self.group_size * self.group_size or self.group_size
            bad(
                f"rollouts_per_step={self.rollouts_per_step} must be evenly divisible by "
                f"group_size={self.group_size} (whole groups per step); e.g. set "
                f"rollouts_per_step={lo} or {lo + self.group_size}."
            )
        if self.micro_batch_size < 1 or self.rollouts_per_step % self.micro_batch_size:
            bad(
                f"rollouts_per_step={self.rollouts_per_step} must be divisible by "
                f"micro_batch_size={self.micro_batch_size}; choose a divisor."
            )
        if self.steps < 1 or self.max_new_tokens < 1 or self.mu < 1:
            bad("steps, max_new_tokens and mu must be >= 1.")
        if not self.temperature > 0:
            bad(f"temperature={self.temperature}: rollouts must sample; use > 0 (e.g. 1.0).")
        if not 0 < self.top_p <= 1:
            bad(f"top_p={self.top_p} must be in (0, 1].")
        if not (0 <= self.eps_low < 1 and self.eps_high >= 0):
            bad(f"eps_low={self.eps_low} must be in [0, 1) and eps_high={self.eps_high} >= 0.")
        if self.beta < 0:
            bad(f"beta={self.beta} must be >= 0 (0 disables the KL term).")
        if self.loss_agg not in ("token_mean", "seq_mean"):
            bad(f"loss_agg={self.loss_agg!r}: use token_mean or seq_mean.")
        if self.env not in ("none", "calculator", "calculator-off") and not (
            self.env.startswith("ors:") and len(self.env) > 4
        ):
            bad(f"env={self.env!r}: use none, calculator, calculator-off or ors:<name>.")
        if self.eval_samples < 0 or self.eval_samples == 1:
            bad(f"eval_samples={self.eval_samples}: use 0 (off) or >= 2 (e.g. 16 for pass@16).")
        if self.precision not in ("auto", "fp32", "bf16-mixed", "bf16"):
            bad(f"precision={self.precision!r}: use auto, fp32, bf16-mixed or bf16.")
        if len(self.adam_betas) != 2:
            bad(f"adam_betas={self.adam_betas}: give two numbers, e.g. [0.9, 0.99].")
        if self.gradient_checkpointing_keep_layers < 0 or (
            self.gradient_checkpointing_keep_layers and not self.gradient_checkpointing
        ):
            bad(
                f"gradient_checkpointing_keep_layers={self.gradient_checkpointing_keep_layers}: "
                "use >= 0, and > 0 only with gradient_checkpointing=true."
            )
        if self.logprob_chunk_tokens < 0:
            bad(f"logprob_chunk_tokens={self.logprob_chunk_tokens}: use >= 1 (e.g. 1024), or 0.")
        if self.keep_checkpoints < 1:
            bad(f"keep_checkpoints={self.keep_checkpoints}: keep at least 1 (resume needs one).")
        if self.reward_concurrency < 1 or self.reward_retries < 0:
            bad("reward_concurrency must be >= 1 and reward_retries >= 0.")
        for name in ("recipe", "eval_recipe"):
            r = getattr(self, name)
            if not (isinstance(r, str) and r) and not (isinstance(r, dict) and r.get("components")):
                bad(
                    f"{name}={r!r}: give a recipe name (e.g. gsm8k) or an inline mapping "
                    '{"components": [{"name": "math_accuracy", "weight": 1.0}]}.'
                )
            if isinstance(r, dict):
                from arbiter.proto.gateway import Recipe

                try:
                    Recipe.model_validate(r)
                except ValueError as e:
                    first = e.errors()[0] if hasattr(e, "errors") else {"msg": str(e), "loc": ()}
                    where = ".".join(str(x) for x in first["loc"])
                    bad(f"{name}.{where}: {first['msg']} (see proto/gateway.py Recipe).")

    # --- loading
    @classmethod
    def field_names(cls) -> dict[str, dataclasses.Field[Any]]:
        return {f.name: f for f in dataclasses.fields(cls)}

    @classmethod
    def load(
        cls, path: str | Path | None = None, overrides: list[str] | None = None
    ) -> TrainerConfig:
        values: dict[str, Any] = {}
        if path:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
            if not isinstance(loaded, dict):
                raise ConfigError(f"{path}: expected a mapping of setting: value at the top level.")
            values.update(loaded)
        for item in overrides or []:
            key, sep, raw = item.partition("=")
            if not sep:
                raise ConfigError(f"override {item!r}: write key=value, e.g. lr=1e-6.")
            values[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        known = cls.field_names()
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(
                f"unknown setting(s) {unknown}; "
                "see `python -m arbiter.trainer --help-config` for the list."
            )
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def dump(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def help_text() -> str:
    """The settings table (name, default, help) for ``--help-config`` and the README."""
    rows = []
    for f in dataclasses.fields(TrainerConfig):
        default = f.default
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        rows.append(f"{f.name:24} {json.dumps(default)[:40]:42} {f.metadata.get('help', '')}")
    return "\n".join(rows)
