"""Checkpoints: what is saved comes back on resume, RNG states included."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arbiter.trainer import checkpoint
from arbiter.trainer.generation import Sampler
from arbiter.trainer.grpo import build_optimizer
from arbiter.trainer.sampling import SamplingParams
from arbiter.trainer.setup import Dist, load_model, load_tokenizer


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_resume_restores_rng_so_the_next_sample_is_the_same(
    tiny_model: Path, tmp_path: Path
) -> None:
    tok = load_tokenizer(tiny_model)
    model = load_model(tiny_model, torch.device("cpu"), "fp32", trainable=True)
    opt, sched = build_optimizer(
        model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=2
    )
    opt.step()  # no gradients: changes nothing, but the scheduler steps after it as it must
    sched.step()
    torch.manual_seed(123)
    path = checkpoint.save(
        tmp_path, 7, model, tok, opt, sched, {"recipe_fingerprint": "f"}, keep=1, dist=Dist()
    )
    # the sample drawn right after saving: no generator, so the global RNG decides
    prompt = tok(["What is 3 + 4?"] * 4, return_tensors="pt")
    params = SamplingParams.for_tokenizer(tok, 8)
    sampler = Sampler(model)
    first, _ = sampler(prompt["input_ids"], prompt["attention_mask"], params)
    torch.rand(1000)  # the run goes on and moves the RNG
    state = checkpoint.load(checkpoint.latest(tmp_path) or path, model, opt, rank=0)
    checkpoint.restore_rng(state)
    again, _ = sampler(prompt["input_ids"], prompt["attention_mask"], params)
    assert torch.equal(first, again)
    assert (state["step"], state["recipe_fingerprint"]) == (7, "f")
    assert state["scheduler"]["last_epoch"] == 1


def test_only_complete_checkpoints_count_and_old_ones_go(tiny_model: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(tiny_model)
    model = load_model(tiny_model, torch.device("cpu"), "fp32", trainable=True)
    opt, sched = build_optimizer(
        model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0
    )
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, model, tok, opt, sched, {}, keep=2, dist=Dist())
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["step-000002", "step-000003"]
    (tmp_path / "checkpoints" / "step-000003" / "done").unlink()  # as if cut short by a crash
    assert checkpoint.latest(tmp_path) == tmp_path / "checkpoints" / "step-000002"
