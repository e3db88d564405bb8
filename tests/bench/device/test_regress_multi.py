"""bench.device.regress_multi: the verdicts (a goal missed on its card, a regression, a crash
each fail) and bench/device/regress_multi.sh with SMALL=1: the 7B benchmark's FSDP2 path and
the DDP learning run, each on two gloo processes on the CPU. The FSDP2 part is also
bench.trainer.fsdp's CPU check: its summary's steady steps, no checkpoint written."""

from __future__ import annotations

import json
from argparse import Namespace
from collections.abc import Callable
from typing import Any

from bench import record
from bench.device.regress_common import verdict_rows
from bench.device.regress_multi import rules
from tests.bench.device.conftest import SmallRun

GPU = Namespace(small=False, steps={"fsdp7b": 6, "ddp": 300})


def _verdicts(card: str, **parts: dict[str, Any]) -> dict[str, str]:
    rec = {"fsdp7b.s_per_step": 11.0, "ddp.accuracy_after": 35.0}
    return {r[0]: r[4] for r in verdict_rows(parts, rec, rules(GPU), small=False, card_slug=card)}


def test_the_7b_goals_hold_on_an_h200_and_the_recorded_figures_everywhere() -> None:
    fast = {"rc": 0, "steps": 6, "first_step_s": 80.0, "s_per_step": 11.5}
    assert set(_verdicts("h200", fsdp7b=fast).values()) == {"ok"}
    slow_start = fast | {"first_step_s": 297.0}
    assert _verdicts("h200", fsdp7b=slow_start)["fsdp7b.first_step_s"] == "FAIL (past its goal)"
    # no goal for an H100: only the recorded figure (11.0 s, +15 %) holds the steady step
    assert _verdicts("h100", fsdp7b=slow_start)["fsdp7b.first_step_s"] == "ok"
    slower = _verdicts("h100", fsdp7b=fast | {"s_per_step": 13.0})
    assert slower["fsdp7b.s_per_step"] == "FAIL (regression)"


def test_a_crash_a_short_run_and_accuracy_that_does_not_rise_fail() -> None:
    got = _verdicts(
        "h200",
        fsdp7b={"rc": -9, "steps": 2, "first_step_s": 297.0, "s_per_step": None},
        ddp={"rc": 0, "steps": 300, "accuracy_before": 24.2, "accuracy_after": 24.0},
    )
    assert got["fsdp7b.rc"] == "FAIL (crash)" and got["fsdp7b.steps"] == "FAIL (stopped early)"
    assert got["fsdp7b.s_per_step"] == "FAIL (missing)"
    assert got["ddp.accuracy_after"] == "FAIL (did not rise)"


def test_regress_multi_sh_small_runs_both_parts_on_two_cpu_processes(
    small_run: Callable[[str], SmallRun],
) -> None:
    run = small_run("regress_multi")
    figures = run.figures
    assert figures["fsdp7b.rc"] == figures["ddp.rc"] == 0
    assert figures["fsdp7b.steps"] == 5 and figures["ddp.steps"] == 3
    assert figures["fsdp7b.first_step_s"] > 0 and figures["fsdp7b.s_per_step"] > 0
    assert figures["ddp.accuracy_after"] is not None
    fsdp = json.loads((run.out / "fsdp7b" / "trainer_fsdp_7b.json").read_text())
    grpo = fsdp["grpo"]
    assert grpo["cmd"].startswith("torchrun --nproc_per_node 2 -m arbiter.trainer")
    assert fsdp["trainer_settings"]["fsdp"] is True
    steady = grpo["steady"]  # bench.trainer.fsdp's summary: no warm-up step, not the last
    assert steady["steps"] == [3, 4]  # (the pipelined run's last step samples nothing)
    assert steady["generate_s"] > 0 and steady["completion_tokens_per_s"] > 0
    metrics = (run.out / "fsdp7b" / "metrics-fsdp_7b.jsonl").read_text().splitlines()
    last = json.loads(metrics[-1])
    assert last["tokens/sequence"] > 0 and last["decode_steps"] <= 8
    assert not (run.out.parent / "work" / "fsdp7b" / "run" / "checkpoints").exists()
    assert record.missing(fsdp["run"]) == []  # the part's own result carries the header too
    assert "| fsdp7b.steps | 5 |" in run.stdout
    assert run.recorded["figures"] == figures and record.missing(run.recorded["run"]) == []
