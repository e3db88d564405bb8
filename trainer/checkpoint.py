"""Checkpoints: ``run_dir/checkpoints/step-NNNNNN/`` = save_pretrained model + tokenizer +
``trainer_state.pt`` (optimizer, scheduler, step, recipe fingerprint) + ``rng-RANK.pt``
(each rank's torch RNG states).

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

log = logging.getLogger(__name__)


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
    """Called on every rank: rank 0 writes the weights and trainer state, each rank its RNG."""
    path = checkpoint_dir(run_dir, step)
    if dist.main:
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        state = {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            **extra,
        }
        torch.save(state, path / "trainer_state.pt")
    dist.barrier()
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


def load_state(path: Path, rank: int = 0) -> dict[str, Any]:
    """The trainer state and this rank's RNG states (absent in older checkpoints)."""
    state: dict[str, Any] = torch.load(
        path / "trainer_state.pt", map_location="cpu", weights_only=False
    )
    rng = path / f"rng-{rank}.pt"
    if rng.exists():
        state.update(torch.load(rng, map_location="cpu", weights_only=False))
    return state
