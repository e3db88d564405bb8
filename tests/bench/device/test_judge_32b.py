"""The 32B judge script on the CPU (SMALL=1): vLLM CPU serves the tiny model (the session's
server, as VLLM_URL), the judge service is measured against direct calls, and GRPO runs through
the gateway with the judge in the loop; the JSON carries every part's figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import VLLMServer

REPO = Path(__file__).resolve().parents[3]
VLLM_PYTHON = Path(os.environ.get("ARBITER_VLLM_PYTHON") or REPO / ".venv-vllm/bin/python")


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no vLLM CPU venv (make vllm)")
def test_judge_script_measures_the_service_and_the_reward_wait_with_the_judge_in_the_loop(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    env = os.environ | {
        "SMALL": "1",
        "PY": sys.executable,
        "OUT": str(tmp_path),
        "VLLM_URL": vllm_server.base_url,
    }
    proc = subprocess.run(
        ["bash", "bench/device/judge_32b.sh"], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    body = json.loads((tmp_path / "judge_32b.json").read_text())
    for component in ("verifier", "quality"):
        side = body["judge_c8"][component]
        assert side["service_items_s"] > 0 and side["direct_pooled_items_s"] > 0
        assert side["null_kinds"] == {}, side  # every item scored on both sides
    grpo = body["grpo_gsm8k_dj"]
    assert grpo["steps"] == 2
    assert 0.0 <= grpo["reward_wait_share"] <= 1.0
    assert grpo["reward_null_frac"] == [0.0, 0.0]  # the judge scored every rollout
