"""The stack a soak runs on (``bench.services.soak``, ``bench.services.soak_teams``): its
processes started in order, each ready before the next starts, the soak run against the
gateway to its end, and every process stopped in reverse order however the soak ended."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

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
