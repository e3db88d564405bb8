"""The judge's rig: the tiny random model served by the real vLLM OpenAI server (CPU; the
session's ``vllm_server`` in tests/conftest.py), the judge service in front of it, and a stub
server for faults vLLM cannot show.

vLLM comes from its own venv: set ``ARBITER_VLLM_PYTHON`` to that venv's python (``make
unit`` does). Without it these tests fail — the judge is only tested against a real server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from arbiter.procs import free_port, uvicorn_process
from tests.conftest import VLLM_MODEL, VLLMServer, start_service


def judge_env(base_url: str, model: str, **extra: str) -> dict[str, str]:
    env = {"JUDGE_BASE_URL": base_url, "JUDGE_MODEL": model}
    env.update({f"JUDGE_{k.upper()}": v for k, v in extra.items()})
    return env


@pytest.fixture(scope="session")
def judge_url(vllm_server: VLLMServer, log_dir: Path) -> Iterator[str]:
    """The judge service in front of the real vLLM server.

    Labels constrained by default: a random model rarely lists Yes/No in its top 20, so
    unconstrained the verifier would mostly answer judge_no_label (tests that want the
    unconstrained read pass ``constrain_labels: false``).
    """
    env = judge_env(vllm_server.base_url, VLLM_MODEL, constrain_labels="true")
    proc, url = start_service("judge", log_dir, env)
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def stub_root(log_dir: Path) -> Iterator[str]:
    """The fault stub (see stub.py for why each mode is a stub)."""
    port = free_port()
    proc = uvicorn_process(
        "judge-stub",
        "tests.services.judge.stub:create_app",
        port,
        env={"STUB_SLOW_S": "10"},
        log_path=log_dir / f"judge-stub-{port}.log",
        ready_path="/health",
    )
    proc.start()
    try:
        proc.wait_ready(30)
    except Exception:
        proc.stop()
        raise
    yield f"http://127.0.0.1:{port}"
    proc.stop()
