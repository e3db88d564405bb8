"""bench.trainer.speed: the GRPO-step phase runs on the CPU at the TRL baseline's small shapes, and
the card-limit arithmetic is right."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.trainer.phases import CARDS, card_limits


def test_grpo_steps_run_with_the_memory_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("BENCH_SMALL", "1")
    from bench.trainer.speed import main

    main(
        [
            "--phases",
            "ours",
            "--steps",
            "1",
            "--micro-batch",
            "16",
            "--logprob-chunk",
            "64",
            "--gradient-checkpointing",
            "--sampler-modes",
            "",
        ]
    )
    res = json.loads((tmp_path / "trainer_speed.json").read_text())
    ours = res["ours"]
    assert ours["loss_code"] == "arbiter.trainer.update.train_on_batch"
    assert len(ours["steps"]) == 3 and ours["completion_tokens_per_s"] > 0  # 2 warm-up + 1


def test_gsm8k_prompts_and_equal_step_counts_on_both_sides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--gsm8k puts GSM8K questions in both sides' prompts; TRL times as many steps as ours."""
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("BENCH_SMALL", "1")
    monkeypatch.delenv("BENCH_STEPS", raising=False)
    data = tmp_path / "train.jsonl"
    rows = [{"question": f"Ann has {i} pens and buys 3 more. How many now?", "answer": "#### 1"}
            for i in range(4)]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from bench.trainer.speed import main

    main(["--phases", "ours,trl", "--steps", "1", "--micro-batch", "16",
          "--trl-batch", "16", "--gsm8k", str(data), "--sampler-modes", ""])  # fmt: skip
    res = json.loads((tmp_path / "trainer_speed.json").read_text())
    assert "GSM8K" in res["setting"]["prompts_from"]
    assert len(res["ours"]["steps"]) == 3  # 2 warm-up + 1 timed
    assert len(res["trl"]["step_times_s"]) == 3 and res["trl"]["completion_tokens_per_s"] > 0
    # the prompt is the trainer's: instruction + question, longer than the arithmetic ones
    assert res["ours"]["prompt_tokens_padded"] > 30


def test_card_limits_arithmetic() -> None:
    # a 2-layer model: 1000 matmul parameters beside a tied 10 x 4 embedding
    cfg = SimpleNamespace(
        vocab_size=10,
        hidden_size=4,
        tie_word_embeddings=True,
        num_hidden_layers=2,
        num_key_value_heads=1,
        num_attention_heads=2,
        head_dim=2,
    )
    model = SimpleNamespace(config=cfg, parameters=lambda: [SimpleNamespace(numel=lambda: 1000)])
    flops, bw = CARDS["H200"]
    train_s = 6 * 1000 * 60 / (0.4 * flops)  # a train step at 40 % of the peak
    step = {"decode_steps": 10, "generate_s": 1.0, "seq_tokens": 3 * 20, "train_s": train_s}
    got = card_limits(model, [step], prompt_len=10, rows=3, card="NVIDIA H200")
    kv = 3 * 15 * 2 * 2 * 1 * 2 * 2  # rows x mean context x layers x (K, V) x heads x dim x 2 B
    assert got["decode_ms_per_step"] == 100.0
    assert math.isclose(got["decode_bound_ms_per_step"], round(1000 * (2000 + kv) / bw, 6))
    assert got["train_mfu"] == 0.4
    assert card_limits(model, [step], prompt_len=10, rows=3, card="cpu")["note"]
