"""The learning benchmark's SMALL mode runs tool use end to end on the CPU (the tool-use warm
start, GRPO with env=calculator, and without the tool), a few steps each, through
bench/device/trainer_tools_gpu.sh as the GPU runs them. Its third setting, the diversity
reward, is the same ``bench.trainer.learn --embedding`` run that ``regress.sh``'s diverse part
makes: tests/bench/device/test_regress.py checks it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow  # one warm start and three runs of 2 GRPO steps: 55-80 s on 2 shared cores
def test_small_runs_tool_use_with_and_without_the_tool_and_through_the_service(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    env = os.environ | {"SMALL": "1", "PY": sys.executable, "OUT": str(out),
                        "WORK": str(tmp_path / "work"), "RUNS": "tool notool tool-ors"}  # fmt: skip
    proc = subprocess.run(["bash", "bench/device/trainer_tools_gpu.sh"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = {t: json.loads((out / f"trainer_learn_{t}.json").read_text())
            for t in ("tool", "notool", "tool-ors")}  # fmt: skip
    for tag, res in runs.items():
        g = res["grpo"]
        assert g["rc"] == 0 and g["steps"] == 2, (tag, g)
        assert g["accuracy_before"] is not None and g["accuracy_after"] is not None
    # both tool runs start from one warm start, on the calculator's prompt
    assert runs["tool"]["sft"]["reused_from"] == runs["notool"]["sft"]["reused_from"]
    assert runs["tool"]["trainer_settings"]["overrides"][-1] == "env=calculator"
    assert runs["notool"]["trainer_settings"]["overrides"][-1] == "env=calculator-off"
    # the same run with its episodes through the environments service: their own rewards
    assert runs["tool-ors"]["trainer_settings"]["env"] == "ors:calculator"
    assert runs["tool-ors"]["sft"]["reused_from"] == runs["tool"]["sft"]["reused_from"]
    for tag in ("tool", "notool", "tool-ors"):  # tool use is logged per step
        assert {"tools/episode_frac_first_last", "turns/mean_first_last"} <= set(runs[tag]["grpo"])
    with tarfile.open(out / "tools.tgz") as tar:
        assert "./metrics-learn_tool.jsonl" in tar.getnames()
        metrics = tar.extractfile("./metrics-learn_tool-ors.jsonl")
        assert metrics is not None
        train = [json.loads(x) for x in metrics.read().splitlines() if b'"train"' in x]
    # the rewards came from the episodes (the service scored every one of them), not /v1/score
    assert [r["reward/null_frac"] for r in train] == [0.0, 0.0]
    assert all("reward/ors:calculator/mean" in r for r in train)
    # the time inside the episodes' round trips to the service is a share of the step
    assert all(0 < r["time/env"] < r["time/step"] for r in train)
    assert 0 < runs["tool-ors"]["grpo"]["env_wait_share"] < 1
