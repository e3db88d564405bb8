"""FSDP2 on the CPU: two gloo processes under torchrun on the tiny model (fsdp_worker.py).

One sharded step changes every parameter and matches a single-process step on the same 8
sequences; the sharded model samples what the unsharded one samples; resuming from a
sharded checkpoint continues identically (same next sample, same next step)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from arbiter.procs import free_port
from arbiter.trainer.grpo import build_optimizer
from arbiter.trainer.rollout import Rollout
from arbiter.trainer.setup import Dist, load_model
from arbiter.trainer.update import train_on_batch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fsdp_worker import ADV, config  # noqa: E402


@pytest.fixture(scope="module")
def ranks(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("fsdp")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        str(HERE / "fsdp_worker.py"),
        str(tiny_model),
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "run" / "checkpoints" / "step-000001" / "sharded").is_dir()
    return [torch.load(out / f"result-{r}.pt", weights_only=False) for r in (0, 1)]


def single_process_step(tiny_model: Path, roll: dict[str, torch.Tensor]) -> tuple[Any, Any]:
    torch.set_num_threads(1)
    cfg = config(tiny_model)
    policy = load_model(tiny_model, torch.device("cpu"), "fp32", trainable=True)
    opt, _ = build_optimizer(policy, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0)
    whole = Rollout(
        problems=[],
        prompts=[],
        texts=[],
        input_ids=roll["input_ids"],
        attention_mask=roll["attention_mask"],
        loss_mask=roll["loss_mask"],
    )
    train_on_batch(cfg, policy, opt, whole, ADV, Dist(), "fp32")
    params = {n: p.detach() for n, p in policy.named_parameters()}
    return params, {n: p.grad for n, p in policy.named_parameters()}


def test_sharded_step_matches_one_process(tiny_model: Path, ranks: list[dict[str, Any]]) -> None:
    r = ranks[0]
    unchanged = [n for n in r["step1"] if torch.equal(r["step1"][n], r["before"][n])]
    assert unchanged == []
    params, grads = single_process_step(tiny_model, r["roll"])
    for n, g in grads.items():  # the gradient of the same loss over the same 8 sequences
        torch.testing.assert_close(r["grad1"][n], g, rtol=1e-4, atol=1e-6, msg=n)
    for n, p in params.items():
        torch.testing.assert_close(r["step1"][n], p, rtol=0, atol=1e-4, msg=n)
    assert ranks[1]["stats1"]["grad_norm"] == pytest.approx(r["stats1"]["grad_norm"])


def test_sharded_model_samples_like_the_unsharded_one(ranks: list[dict[str, Any]]) -> None:
    assert all(r["greedy_same_as_unsharded"] for r in ranks)


def test_resume_from_sharded_checkpoint_continues_identically(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert torch.equal(r["sample2"], r["sample2_resumed"])  # same next sample
        for n in r["step2"]:  # and the same next step
            assert torch.equal(r["step2"][n], r["step2_resumed"][n]), n
