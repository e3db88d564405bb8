"""bench.trainer.train_probe runs its train-step variants on the CPU at the TRL baseline's small
shapes (eager there: compile_train is GPU-only), and every variant trains the same batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_variants_run_and_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("BENCH_SMALL", "1")
    monkeypatch.setenv("BENCH_PROMPTS", "2")
    monkeypatch.setenv("BENCH_G", "4")
    from bench.trainer.train_probe import main

    variants = "base,trim,compile_mb2_ckpt4,shared_keep_logits_keep14"
    main(["--variants", variants, "--steps", "1"])
    res = json.loads((tmp_path / "trainer_train_probe.json").read_text())
    runs = res["variants"]
    assert set(runs) == set(variants.split(","))
    assert all(r["train_s"] > 0 for r in runs.values())
    assert res["shape"]["real_tokens"] < res["shape"]["padded_tokens"]
    # the same batch and loss each way (fp32 on the CPU): same entropy
    ents = [r["entropy"] for r in runs.values()]
    assert max(ents) - min(ents) < 1e-4
    assert res["agreement"]["eager_trimmed"]["logp_max_abs_diff"] < 1e-2
