"""Checkpoints: ``run_dir/checkpoints/step-NNNNNN/`` = save_pretrained model + tokenizer +
``trainer_state.pt`` (optimizer, scheduler, step, recipe fingerprint) + ``rng-RANK.pt``
(each rank's torch RNG states).

A sharded (FSDP2) model is saved without gathering it: ``sharded/`` holds every rank's
shard of the weights and AdamW state (torch.distributed.checkpoint; it can be resumed on
another number of ranks), beside the HF ``config.json``, the tokenizer and
``trainer_state.pt`` (no optimizer there). To get HF weights out of it:
``python -m torch.distributed.checkpoint.format_utils dcp_to_torch_save sharded model.pt``.

Resume loads the newest complete checkpoint (a ``done`` marker is written last, so a
checkpoint cut short by a crash is ignored) and restores the RNG states with
``restore_rng``. The data order and the sampling generators are functions of the step,
so nothing else is needed to continue exactly where the run stopped.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from arbiter.trainer.config import RunError
from arbiter.trainer.parallel import is_sharded
from arbiter.trainer.setup import no_progress_bars

log = logging.getLogger(__name__)
SHARDED = "sharded"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:06d}"


def latest(run_dir: Path) -> Path | None:
    root = run_dir / "checkpoints"
    if not root.exists():
        return None
    done = sorted(p for p in root.glob("step-*") if (p / "done").exists())
    return done[-1] if done else None


def rng_state() -> dict[str, Any]:
    return {
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Put back the RNG states ``rng_state`` saved (the CUDA ones where GPUs are visible)."""
    if state.get("rng_cpu") is not None:
        torch.set_rng_state(state["rng_cpu"])
    if state.get("rng_cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng_cuda"])


def save(
    run_dir: Path,
    step: int,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    extra: dict[str, Any],
    keep: int,
    dist: Any,
) -> Path:
    """Called on every rank: rank 0 writes the trainer state (and the weights, unless they are
    sharded: then every rank writes its shard), each rank its RNG states."""
    path = checkpoint_dir(run_dir, step)
    sharded = is_sharded(model)
    if dist.main:
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        state = {"step": step, "scheduler": scheduler.state_dict(), **extra}
        with no_progress_bars():  # no "Writing model shards" bar per checkpoint
            tokenizer.save_pretrained(path)
            if sharded:
                model.config.save_pretrained(path)
            else:
                model.save_pretrained(path)
                state["optimizer"] = optimizer.state_dict()
        torch.save(state, path / "trainer_state.pt")
    dist.barrier()
    if sharded:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=path / SHARDED)
    torch.save(rng_state(), path / f"rng-{dist.rank}.pt")
    dist.barrier()
    if dist.main:
        _finish(run_dir, path, step, keep)
    return path


def _finish(run_dir: Path, path: Path, step: int, keep: int) -> None:
    """Mark ``path`` complete, then drop all but the newest ``keep`` complete checkpoints."""
    (path / "done").write_text(str(step))
    done = sorted(p for p in (run_dir / "checkpoints").glob("step-*") if (p / "done").exists())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("saved checkpoint %s", path)


def check_layout(path: Path, *, sharded: bool) -> None:
    """Refuse to resume a sharded checkpoint without FSDP, or a replicated one with it."""
    if (path / SHARDED).exists() != sharded:
        was = "with fsdp=true" if (path / SHARDED).exists() else "without fsdp"
        raise RunError(f"{path} was saved {was}: resume with the same fsdp setting")


def load(path: Path, model: Any, optimizer: torch.optim.Optimizer, rank: int) -> dict[str, Any]:
    """Load the optimizer state (and a sharded model's weights: a replicated model was loaded
    from ``path`` already) into ``model`` and ``optimizer``; returns the trainer state with
    this rank's RNG states (absent in older checkpoints) for ``restore_rng``."""
    state: dict[str, Any] = torch.load(
        path / "trainer_state.pt", map_location="cpu", weights_only=False
    )
    if is_sharded(model):
        model_sd, optim_sd = get_state_dict(model, optimizer)
        shards: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd}
        dcp.load(shards, checkpoint_id=path / SHARDED)
        set_state_dict(
            model, optimizer, model_state_dict=shards["model"], optim_state_dict=shards["optimizer"]
        )
    else:
        optimizer.load_state_dict(state["optimizer"])
    rng = path / f"rng-{rank}.pt"
    if rng.exists():
        state.update(torch.load(rng, map_location="cpu", weights_only=False))
    return state
