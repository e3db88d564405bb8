"""bench.trainer.fsdp on the CPU: the TRL baseline's tiny model, verify + gateway started as in
production, ``torchrun`` with two gloo ranks and fsdp=true; the summary's steady steps leave
out warm-up and the pipelined run's last step, and no checkpoint is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_fsdp_run_on_two_cpu_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gsm8k_dir: Path
) -> None:
    monkeypatch.setenv("BENCH_SMALL", "1")  # inherited by the model-building child
    from bench.trainer.fsdp import main

    out, work = tmp_path / "out", tmp_path / "work"
    main(["--corpus", str(gsm8k_dir), "--work", str(work), "--out", str(out),
          "--nproc", "2", "--steps", "5", "--verify-workers", "1", "--timeout", "300",
          "device=cpu", "max_new_tokens=8", "rollouts_per_step=8",
          "micro_batch_size=4"])  # fmt: skip
    res = json.loads((out / "trainer_fsdp.json").read_text())
    grpo = res["grpo"]
    assert grpo["rc"] == 0 and grpo["steps"] == 5
    assert grpo["cmd"].startswith("torchrun --nproc_per_node 2 -m arbiter.trainer")
    assert res["trainer_settings"]["fsdp"] is True
    steady = grpo["steady"]
    assert steady["steps"] == [3, 4]  # not the warm-up steps, not the last (samples nothing)
    assert steady["generate_s"] > 0 and steady["completion_tokens_per_s"] > 0
    rows = [json.loads(x) for x in (out / "metrics-fsdp.jsonl").read_text().splitlines()]
    assert rows[-1]["tokens/sequence"] > 0 and rows[-1]["decode_steps"] <= 8
    assert not (work / "run" / "checkpoints").exists()  # save_every=-1
