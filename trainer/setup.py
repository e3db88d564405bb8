"""Process set-up: distributed (torchrun), device and precision, models, run directory."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from arbiter.trainer.config import RunError, TrainerConfig

log = logging.getLogger("trainer")


@dataclass
class Dist:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def all_sum(self, values: list[float], device: torch.device) -> list[float]:
        """Sum a list of floats over ranks (identity on one process)."""
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=device)
        torch_dist.all_reduce(t)
        return [float(x) for x in t.tolist()]

    def any(self, flag: bool, device: torch.device) -> bool:
        return self.all_sum([1.0 if flag else 0.0], device)[0] > 0

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()


def init_distributed(device_pref: str, cpu_threads: int = 0) -> tuple[Dist, torch.device]:
    """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK: one process per GPU (gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and device_pref in ("auto", "cuda")
    if device_pref == "cuda" and not torch.cuda.is_available():
        raise RunError("device=cuda but no GPU is visible; set device=cpu or device=auto")
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if not cuda and cpu_threads > 0:
        torch.set_num_threads(cpu_threads)
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not torch_dist.is_initialized():
        # device_id binds each rank to its GPU up front (NCCL otherwise guesses from the rank)
        torch_dist.init_process_group(
            backend="nccl" if cuda else "gloo", device_id=device if cuda else None
        )
    return Dist(rank=rank, world=world), device


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision == "auto":
        return "bf16-mixed" if device.type == "cuda" else "fp32"
    if precision != "fp32" and device.type != "cuda":
        log.warning(
            "precision=%s on CPU: using fp32 (bf16 on CPU is slow and inexact here)", precision
        )
        return "fp32"
    return precision


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' (and huggingface_hub's) tqdm bars off for the block, then as they were."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def load_model(
    path: str | Path,
    device: torch.device,
    precision: str,
    *,
    trainable: bool,
    gradient_checkpointing: bool = False,
    keep_layers: int = 0,
) -> Any:
    """The causal LM on ``device``; trainable: in train mode, with gradient checkpointing
    (``keep_layers`` of its decoder layers excepted) when asked; else frozen, in eval mode."""
    from transformers import AutoModelForCausalLM

    # bf16-mixed keeps fp32 master weights for the policy; the frozen reference needs no
    # master copy, so it is held in bf16 whenever the policy computes in bf16.
    bf16 = precision == "bf16" or (precision == "bf16-mixed" and not trainable)
    with no_progress_bars():  # no "Loading weights" bar
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=torch.bfloat16 if bf16 else torch.float32
        )
    model = model.to(device=device)
    if trainable:
        model.train()
        if gradient_checkpointing:
            enable_gradient_checkpointing(model, keep_layers)
    else:
        model.eval()
        model.requires_grad_(False)
    return model


def enable_gradient_checkpointing(model: Any, keep_layers: int = 0) -> None:
    """Recompute each decoder layer in backward (non-reentrant), except ``keep_layers`` of
    them, spread evenly (``kept_layers``), which keep their activations. Only the training
    forward is affected: it passes use_cache=False anyway, and the sampler keeps its own KV
    cache."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if keep_layers <= 0:
        return
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(
            f"gradient_checkpointing_keep_layers={keep_layers}: {type(model).__name__} keeps no "
            "decoder layers at model.layers; use 0 (every layer checkpointed) for it"
        )
    for i in kept_layers(len(layers), keep_layers):
        layers[i].gradient_checkpointing = False


def kept_layers(n: int, keep: int) -> list[int]:
    """``keep`` of ``n`` layer indices spread evenly from the first (all when keep >= n)."""
    keep = min(keep, n)
    return sorted({i * n // keep for i in range(keep)}) if keep else []


def check_model_path(model: str) -> None:
    """A model given as a path (absolute, ./, ../ or ~) must be a directory that holds a
    config.json: a clear line before anything is loaded, not transformers' traceback."""
    looks_local = model.startswith(("/", "./", "../", "~")) or Path(model).exists()
    if not looks_local:
        return  # a hub id: transformers resolves it (load_tokenizer reports a failure)
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        what = "holds no config.json" if path.is_dir() else "does not exist"
        raise RunError(
            f"model={model}: {what}; give a Hugging Face model directory (build the tiny CPU "
            "one with `python -m arbiter.tiny_model DIR`, or the demo's with "
            "`python -m arbiter.trainer.sft demo DIR`)"
        )


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except OSError as e:  # a hub id that cannot be resolved (offline, misspelt, gated)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RunError(f"model={path}: cannot load its tokenizer: {first}") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def setup_logging(main: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if main else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def prepare_run_dir(cfg: TrainerConfig, dist: Dist) -> Path:
    run_dir = Path(cfg.run_dir)
    if dist.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not cfg.resume and (run_dir / "metrics.jsonl").exists():
            raise RunError(
                f"{run_dir} already holds a run: set resume=true to continue it, "
                "or pick a new run_dir (e.g. run_dir=runs/NEW)"
            )
        cfg.dump(run_dir / "config.yaml")
    dist.barrier()
    return run_dir
