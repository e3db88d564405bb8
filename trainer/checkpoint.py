"""Checkpoints: ``run_dir/checkpoints/step-NNNNNN/`` = save_pretrained model + tokenizer +
``trainer_state.pt`` (optimizer, scheduler, step, RNG states, recipe fingerprint).

Resume loads the newest complete checkpoint (a ``done`` marker is written last, so a
checkpoint cut short by a crash is ignored). The data order is a function of the step,
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


def save(
    run_dir: Path,
    step: int,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    extra: dict[str, Any],
    keep: int,
) -> Path:
    path = checkpoint_dir(run_dir, step)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    state = {
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        **extra,
    }
    torch.save(state, path / "trainer_state.pt")
    (path / "done").write_text(str(step))
    for old in sorted(p for p in (run_dir / "checkpoints").glob("step-*") if (p / "done").exists())[
        :-keep
    ]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("saved checkpoint %s", path)
    return path


def load_state(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(
        path / "trainer_state.pt", map_location="cpu", weights_only=False
    )
    return state
