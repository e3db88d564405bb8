"""The trainer's CLI as a user meets it: a user error is one line on stderr (no traceback)
and a non-zero exit; a finished run ends on a summary (steps, reward first -> last,
held-out accuracy, where the curves, metrics and checkpoint are); checkpoints and model
loads print no bars of their own; log lines never share a line with the progress bar; step
numbers agree between the log, metrics.jsonl and the checkpoints (counted from 1)."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from arbiter.procs import free_port
from arbiter.trainer.metrics import run_summary

REPO = Path(__file__).resolve().parents[2]
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def _trainer(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "arbiter.trainer", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _one_line_error(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The process failed with ``code``, no traceback, and its last stderr line is the reason."""
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


def _base(tiny_model: Path, gsm8k_dir: Path, run: Path, gateway_url: str) -> list[str]:
    return [
        f"model={tiny_model}", f"data_dir={gsm8k_dir}", f"run_dir={run}",
        f"gateway_url={gateway_url}", "max_train_problems=64", "rollouts_per_step=8",
        "group_size=4", "micro_batch_size=8", "max_new_tokens=8", "max_prompt_tokens=160",
        "device=cpu", "cpu_threads=1",
    ]  # fmt: skip


def test_a_bad_setting_is_one_line(tmp_path: Path) -> None:
    last = _one_line_error(_trainer("model=/x", "group_size=1"))
    assert last.startswith("config error: group_size=1") and "set 8" in last
    bad_yaml = tmp_path / "c.yaml"
    bad_yaml.write_text("steps: [1,\n")
    last = _one_line_error(_trainer("--config", str(bad_yaml)))
    assert last.startswith("config error: ")
    last = _one_line_error(_trainer("--config", str(tmp_path / "missing.yaml")))
    assert last.startswith("config error: ") and "missing.yaml" in last


def test_a_missing_model_is_one_line(gsm8k_dir: Path, gateway_url: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    args = _base(missing, gsm8k_dir, tmp_path / "run", gateway_url)
    last = _one_line_error(_trainer(*args))
    assert last == (
        f"arbiter.trainer: model={missing}: does not exist; give a Hugging Face model "
        "directory (build the tiny CPU one with `python -m arbiter.tiny_model DIR`, or the "
        "demo's with `python -m arbiter.trainer.sft demo DIR`)"
    )
    assert not (tmp_path / "run").exists()


def test_a_rerun_into_a_finished_run_is_one_line(
    tiny_model: Path, gsm8k_dir: Path, gateway_url: str, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    last = _one_line_error(_trainer(*_base(tiny_model, gsm8k_dir, run, gateway_url)))
    assert last == (
        f"arbiter.trainer: {run} already holds a run: set resume=true to continue it, "
        "or pick a new run_dir (e.g. run_dir=runs/NEW)"
    )


def test_an_unreachable_gateway_is_one_line_with_step_numbers_from_1(
    tiny_model: Path, gsm8k_dir: Path, tmp_path: Path
) -> None:
    """Nothing listens at the gateway's port (a real refusal): step 1 is skipped with a
    warning that says "step 1", as its metrics.jsonl line does; step 2 is one skip too many."""
    closed = f"http://127.0.0.1:{free_port()}"
    run = tmp_path / "run"
    args = _base(tiny_model, gsm8k_dir, run, closed)
    args += ["steps=3", "reward_retries=0", "max_skipped_batches=1", "progress=false"]
    proc = _trainer(*args)
    last = _one_line_error(proc)
    assert last.startswith(
        f"arbiter.trainer: 2 batches in a row without rewards: is the gateway at {closed} up?"
    )
    assert "step 1: batch skipped, no rewards" in proc.stderr
    assert "step 0" not in proc.stderr
    skips = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in skips if r["kind"] == "skip"] == [1, 2]


def test_a_run_ends_on_its_summary_with_quiet_checkpoints(
    tiny_model: Path, gsm8k_dir: Path, gateway_url: str, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    args = _base(tiny_model, gsm8k_dir, run, gateway_url)
    args += ["steps=3", "save_every=1", "eval_every=2", "eval_problems=4", "progress=true"]
    proc = _trainer(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = proc.stderr
    # no bars but the run's own: none per checkpoint, none per model load
    assert "Writing model shards" not in err and "Loading weights" not in err
    assert "grpo" in err  # the run's bar is there
    # every log line starts its own line: after the bar's last carriage return, the timestamp
    logged = [line.split("\r")[-1] for line in err.split("\n") if " trainer: " in line]
    assert logged and all(TIMESTAMP.match(x) for x in logged), logged
    # checkpoints are named by the step they follow, as metrics.jsonl counts them
    saved = re.findall(r"saved checkpoint \S+step-(\d+)", err)
    assert [int(s) for s in saved] == [1, 2, 3]
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["kind"] == "train"] == [1, 2, 3]
    assert [r["step"] for r in steps if r["kind"] == "eval"] == [0, 2, 3]
    # the summary, last
    tail = err[err.index("run finished: 3 step(s) trained") :]
    assert re.search(r"reward +\d\.\d{3} -> \d\.\d{3} +\(mean of steps 1 -> 3\)", tail), tail
    assert re.search(r"held-out +\d\.\d{3} -> \d\.\d{3} +\(greedy accuracy at step 0 -> 3\)", tail)
    assert f"curves     {run / 'curves.png'}" in tail and (run / "curves.png").exists()
    assert f"metrics    {run / 'metrics.jsonl'}" in tail
    assert f"checkpoint {run / 'checkpoints' / 'step-000003'}" in tail


def test_the_summary_averages_the_first_and_last_steps(tmp_path: Path) -> None:
    rows = [{"kind": "eval", "step": 0, "eval/accuracy": 0.25}]
    rows += [{"kind": "train", "step": s, "reward/mean": s / 10} for s in range(1, 16)]
    rows += [{"kind": "skip", "step": 16}, {"kind": "eval", "step": 16, "eval/accuracy": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = run_summary(tmp_path)
    assert text.splitlines() == [
        "run finished: 15 step(s) trained, 1 skipped",
        "  reward     0.300 -> 1.300  (mean of steps 1-5 -> 11-15)",
        "  held-out   0.250 -> 0.500  (greedy accuracy at step 0 -> 16)",
        f"  metrics    {tmp_path / 'metrics.jsonl'}",
    ]


def test_steps_without_reward_variance_are_said_and_kl_shows_only_when_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    from arbiter.trainer.metrics import NO_SIGNAL_EVERY, RunLogger

    def steps(logger: RunLogger, fracs: list[float]) -> None:
        for i, frac in enumerate(fracs, 1):
            logger.step({"step": i, "reward/mean": 0.0, "kl": 0.0, "groups/zero_std_frac": frac})

    quiet = RunLogger(tmp_path, total_steps=99, start_step=0, enabled=True, progress=False)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        steps(quiet, [0.5, 1.0, 1.0] + [1.0] * NO_SIGNAL_EVERY + [0.25, 1.0])
    said = [r.getMessage() for r in caplog.records if "no learning signal" in r.getMessage()]
    # the first flat step, again after NO_SIGNAL_EVERY in a row, and after a step with signal
    assert [m.split(":")[0] for m in said] == ["step 2", f"step {2 + NO_SIGNAL_EVERY}", "step 25"]
    assert "(1 step(s) in a row)" in said[0] and "raise group_size" in said[0]
    for kl_term in (False, True):
        bar = RunLogger(tmp_path, total_steps=9, start_step=0, enabled=True, progress=True,
                        kl_term=kl_term)  # fmt: skip
        capsys.readouterr()
        steps(bar, [0.5])
        bar.close()
        shown = capsys.readouterr().err  # the bar's line
        assert "reward=0.000" in shown and ("kl=" in shown) is kl_term, shown
