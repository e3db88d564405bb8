"""The soak's stack lifecycle (bench/services/soak_stack.py): the processes run while the soak
does, the soak gets the gateway's URL, and every process is stopped afterwards, also when the
soak fails. Real processes: a sleeper and Python's HTTP server as the gateway."""

from __future__ import annotations

import sys

import httpx
import pytest

from arbiter.procs import ManagedProcess, free_port
from bench.services.soak_stack import run_on_stack


def _stack() -> dict[str, ManagedProcess]:
    port = free_port()
    server = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    return {
        "sleeper": ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"]),
        "gateway": ManagedProcess("gateway", server, port=port),  # ready when its port opens
    }


@pytest.mark.parametrize("fails", [False, True])  # the soak returns; the soak raises
def test_processes_run_during_the_soak_and_stop_after_it(fails: bool) -> None:
    procs = _stack()
    seen: dict[str, object] = {}

    async def soak(url: str) -> str:
        seen["url"] = url
        seen["running"] = {name: p.running for name, p in procs.items()}
        async with httpx.AsyncClient() as http:
            seen["status"] = (await http.get(url)).status_code
        if fails:
            raise RuntimeError("the soak failed")
        return "result"

    if fails:
        with pytest.raises(RuntimeError, match="the soak failed"):
            run_on_stack(procs, soak)
    else:
        assert run_on_stack(procs, soak) == "result"
    assert seen["url"] == f"http://127.0.0.1:{procs['gateway'].port}"
    assert seen["running"] == {"sleeper": True, "gateway": True}
    assert seen["status"] == 200
    assert not any(p.running for p in procs.values())  # stopped, also after a failure
