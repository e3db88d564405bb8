"""``ManagedProcess``: the resource limits it gives a child hold in the child and in what
the child starts (``arbiter up`` bounds the sandbox service's address space so)."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

from arbiter.procs import ManagedProcess
from arbiter.services.sandbox.memory import SERVICE_MB
from arbiter.stack import sandbox_rlimits

# the child prints its own RLIMIT_AS, then its child's
SHOW = (
    "import resource, subprocess, sys\n"
    "print(resource.getrlimit(resource.RLIMIT_AS))\n"
    "subprocess.run([sys.executable, '-c', "
    "'import resource; print(resource.getrlimit(resource.RLIMIT_AS))'])\n"
)


def test_a_childs_limits_hold_in_it_and_its_children(tmp_path: Path) -> None:
    soft = 1 << 30
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    log = tmp_path / "child.log"
    proc = ManagedProcess(
        "show", [sys.executable, "-c", "import time; time.sleep(0.5)\n" + SHOW], log_path=log
    )
    proc.rlimits = {resource.RLIMIT_AS: (soft, hard)}
    proc.start()
    assert proc.proc is not None
    assert proc.proc.wait(30) == 0
    assert log.read_text().split() == [f"({soft},", f"{hard})"] * 2


def test_arbiter_up_bounds_the_sandbox_service_to_its_own_share() -> None:
    soft, hard = sandbox_rlimits()[resource.RLIMIT_AS]
    assert soft == SERVICE_MB << 20 or soft == hard
    assert hard == resource.getrlimit(resource.RLIMIT_AS)[1]
