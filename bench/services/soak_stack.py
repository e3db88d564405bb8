"""The stack a soak runs on (``bench.services.soak``, ``bench.services.soak_teams``): its
processes started in order, each ready before the next starts, the soak run against the
gateway to its end, and every process stopped in reverse order however the soak ended; what a
soak reads of the stack: CPU per process, the usage ledger."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import httpx
import psutil

from arbiter.procs import ManagedProcess

T = TypeVar("T")


def run_on_stack(
    procs: dict[str, ManagedProcess], soak: Callable[[str], Coroutine[Any, Any, T]]
) -> T:
    """Start ``procs`` (one named ``gateway``), run ``soak(gateway_url)``, stop them all."""
    for proc in procs.values():
        proc.start()
        proc.wait_ready(180)
    try:
        url = f"http://127.0.0.1:{procs['gateway'].port}"
        return asyncio.run(soak(url))
    finally:
        for proc in reversed(procs.values()):
            proc.stop()


def cpu_s(procs: dict[str, ManagedProcess]) -> dict[str, float]:
    """CPU seconds used so far by each process (children included) and by this driver."""
    out = {"driver": sum(psutil.Process().cpu_times()[:2])}
    for name, proc in procs.items():
        if proc.proc is None or proc.proc.poll() is not None:
            continue
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(proc.proc.pid)
            out[name] = sum(sum(x.cpu_times()[:2]) for x in [p, *p.children(recursive=True)])
    return out


def usage(url: str, admin: str) -> dict[str, dict[str, int]]:
    """Each team's usage ledger (``GET /v1/usage`` with an admin key), its days summed."""
    r = httpx.get(f"{url}/v1/usage", headers={"Authorization": f"Bearer {admin}"}, timeout=30)
    r.raise_for_status()
    out: dict[str, dict[str, int]] = {}
    for day in r.json()["days"]:
        row = out.setdefault(day["team"], Counter())
        for k, v in day.items():
            if isinstance(v, int):
                row[k] += v
    return out
