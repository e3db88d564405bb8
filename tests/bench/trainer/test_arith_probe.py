"""bench.trainer.arith_probe: problem kinds are told apart, and the probe's numbers hang
together."""

from __future__ import annotations

import random
from pathlib import Path

from arbiter.trainer.sft import _add, _mul, _sub, _two_step, build_base, train_sft, write_dataset
from bench.trainer.arith_probe import kind_of, probe


def test_kind_of_names_each_generator() -> None:
    rng = random.Random(0)
    for make, kind in ((_add, "add"), (_sub, "sub"), (_mul, "mul"), (_two_step, "two_step")):
        for _ in range(20):
            assert kind_of(make(rng, "Tom", "apples").question) == kind


def test_probe_on_a_tiny_model(tmp_path: Path, gsm8k_dir: Path) -> None:
    data = write_dataset(tmp_path / "arith", 400, 40)
    base = build_base(tmp_path / "base", gsm8k_dir, hidden=64, layers=1, heads=1, seed=0)
    train_sft(base, data, tmp_path / "sft", steps=2, batch_size=8, device="cpu")
    got = probe(tmp_path / "sft", data, n=40, k=4, temperature=1.0)
    assert set(got) == {"add", "sub", "mul", "two_step", "all"}
    assert sum(v["n"] for k, v in got.items() if k != "all") == got["all"]["n"] == 40
    for v in got.values():  # a problem solved by one of k samples counts in pass@k
        assert 0.0 <= v["sampled"] <= v["pass@4"] <= 1.0
        assert 0.0 <= v["greedy"] <= 1.0
