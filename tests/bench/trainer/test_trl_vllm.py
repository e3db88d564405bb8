"""The TRL baseline's ``A_vllm`` phase: TRL's GRPOTrainer generating with a real vLLM engine in
colocate mode (vLLM's CPU build, in its own venv) runs GRPO steps at the small shapes and
records its speed and a finite loss. It runs as ``bench/device/trl_vllm_gpu.sh`` runs it with
``SMALL=1``, the device script's CPU variant.

vLLM comes from ``ARBITER_VLLM_PYTHON`` (as for the judge's tests); that venv needs TRL too
(``pip install trl==1.16.0`` with the project venv's accelerate, datasets and pyarrow
versions), which ``make vllm`` does not install: without either the test is skipped.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def vllm_python() -> str:
    path = os.environ.get("ARBITER_VLLM_PYTHON", "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("ARBITER_VLLM_PYTHON is not set: TRL + vLLM colocate needs vLLM's venv")
    probe = subprocess.run([path, "-c", "import trl, vllm"], capture_output=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"{path} cannot import trl and vllm: pip install trl==1.16.0 into that venv")
    return path


def test_trl_with_vllm_colocate_records_speed_and_a_finite_loss(
    vllm_python: str, tmp_path: Path
) -> None:
    env = os.environ | {"SMALL": "1", "PY": vllm_python, "OUT": str(tmp_path)}
    env.pop("BENCH_STEPS", None)
    proc = subprocess.run(
        ["bash", "bench/device/trl_vllm_gpu.sh"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=450,
    )
    log = (tmp_path / "trl_vllm.log").read_text()[-3000:]
    assert proc.returncode == 0, proc.stdout + log
    phases = json.loads((tmp_path / "trl_baseline.json").read_text())["phases"]
    res = phases.get("trl_A_vllm_bs64_ga1")
    assert res is not None and "error" not in res, (phases, log)
    assert res["vllm"]["vllm_mode"] == "colocate" and res["trl_defaults"]["use_vllm"] is True
    # three optimizer steps, each one vLLM rollout after copying the trained weights into it
    assert len(res["step_times_s"]) == 3
    assert len(res["generate_times_s"]) == 3 and len(res["sync_weights_times_s"]) == 3
    assert res["completion_tokens_per_s"] > 0
    assert all(0 < n <= 64 * 16 for n in res["completion_tokens_per_step"])
    losses = [row["loss"] for row in res["logs"] if "loss" in row]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    # the trainer compared its log-probs with vLLM's: the samples came from vLLM
    diffs = [row["sampling/sampling_logp_difference/mean"] for row in res["logs"] if "loss" in row]
    assert all(math.isfinite(x) for x in diffs)
