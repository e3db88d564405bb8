"""bench.trainer.decode_micro's code paths on the CPU (``--small``): each attention layout
agrees with eager attention on a cache whose groups share their prompt slots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_small_run_writes_every_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUT", str(tmp_path))
    from bench.trainer import decode_micro as micro

    for name in ("LAYERS", "ROWS", "INTER", "VOCAB", "PROMPT", "NEW"):  # main() shrinks them
        monkeypatch.setattr(micro, name, getattr(micro, name))
    micro.main(["--small"])
    res = json.loads((tmp_path / "trainer_decode_micro.json").read_text())
    att = res["attention"]
    assert set(att) == {f"{k}_S{s}" for k in ("eager", "grouped", "grouped_kv") for s in (24, 32)}
    assert all(r["max_abs_diff_vs_eager"] < 0.05 for r in att.values())  # bf16 rounding
    assert {"gate_cublas", "gate_up_cublas", "head_cublas"} <= set(res["products"])
