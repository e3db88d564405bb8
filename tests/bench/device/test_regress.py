"""bench.device.regress: the verdicts (a crash, a regression past its allowance, accuracy that
does not rise each fail) and bench/device/regress.sh with SMALL=1, every part run on the CPU."""

from __future__ import annotations

import json
from argparse import Namespace
from collections.abc import Callable

from bench import record
from bench.device.regress import CHECKS, verdicts
from tests.bench.device.conftest import SmallRun

GPU = Namespace(small=False, learn_steps=300, steps={"tool": 60, "diverse": 60})


def _run(**parts: dict[str, object]) -> dict[str, str]:
    rec = {"learn.accuracy_after": 36.2, "speed.ratio": 2.5, "speed.ours_peak_GiB": 13.0}
    return {r[0]: r[4] for r in verdicts(GPU, parts, rec)}


def test_a_figure_inside_its_allowance_passes_and_one_outside_fails() -> None:
    ok = _run(speed={"rc": 0, "ratio": 2.5 * (1 - CHECKS["speed.ratio"][1]) + 0.01,
                     "ours_peak_GiB": 13.3})  # fmt: skip
    assert set(ok.values()) == {"ok"}
    bad = _run(speed={"rc": 0, "ratio": 2.5 * (1 - CHECKS["speed.ratio"][1]) - 0.01,
                      "ours_peak_GiB": 14.0})  # fmt: skip
    assert bad["speed.ratio"] == bad["speed.ours_peak_GiB"] == "FAIL (regression)"


def test_a_crash_a_short_run_and_accuracy_that_does_not_rise_fail() -> None:
    got = _run(
        learn={"rc": 0, "steps": 120, "accuracy_before": 24.2, "accuracy_after": 24.0},
        embed={"rc": -9, "texts_per_s": None},
    )
    assert got["learn.steps"] == "FAIL (stopped early)"
    assert got["learn.accuracy_after"] == "FAIL (did not rise)"
    assert got["embed.rc"] == "FAIL (crash)" and got["embed.texts_per_s"] == "FAIL (missing)"
    # risen, but past the allowance below the recorded figure
    low = _run(learn={"rc": 0, "steps": 300, "accuracy_before": 20.0, "accuracy_after": 29.0})
    assert low["learn.accuracy_after"] == "FAIL (regression)"


def test_tool_use_must_pass_its_goal_and_the_reward_wait_its_limit() -> None:
    # risen, but not past 30 %: GRPO did not learn to use the tool
    low = _run(tool={"rc": 0, "steps": 60, "accuracy_before": 0.8, "accuracy_after": 25.0})
    assert low["tool.accuracy_after"] == "FAIL (did not rise)"
    ok = _run(tool={"rc": 0, "steps": 60, "accuracy_before": 0.8, "accuracy_after": 97.0},
              diverse={"rc": 0, "steps": 60, "reward_wait_share": 0.01})  # fmt: skip
    assert ok["tool.accuracy_after"] == ok["diverse.reward_wait_share"] == "ok"
    # the embedding service in the loop may take at most 5 % of the step
    slow = _run(diverse={"rc": 0, "steps": 60, "reward_wait_share": 0.2})
    assert slow["diverse.reward_wait_share"] == "FAIL (over its limit)"


def test_regress_sh_small_runs_every_part_on_the_cpu(small_run: Callable[[str], SmallRun]) -> None:
    run = small_run("regress")
    figures = run.figures
    assert all(figures[f"{p}.rc"] == 0 for p in ("learn", "tool", "diverse", "speed", "embed"))
    assert figures["learn.steps"] == 3 and figures["tool.steps"] == figures["diverse.steps"] == 2
    assert figures["tool.turns_last"] >= 1 and figures["tool.tool_share_last"] is not None
    assert figures["diverse.pass16_after"] is not None and figures["diverse.pairwise_after"] > 0
    div = json.loads((run.out / "diverse" / "trainer_learn_diverse.json").read_text())["grpo"]
    # gsm8k-diverse: the diversity component reached the trainer, held-out samples gave pass@k
    assert div["groups/pairwise_distance_first_last"][0] > 0
    assert [s for s, _ in div["pass@16"]] == [0, 2] and div["pairwise_distance"][0][1] > 0
    assert 0 <= div["reward_wait_share"] < 1
    assert figures["speed.ours_tokens_per_s"] > 0 and figures["speed.trl_tokens_per_s"] > 0
    assert figures["embed.texts_per_s"] > 0
    assert "| learn.steps | 3 |" in run.stdout
    # --record: this run's figures under the run header, as bench/results/regress_<card>.json
    assert run.recorded["figures"] == figures and record.missing(run.recorded["run"]) == []
