"""CPU time of processes, from Linux /proc: the benchmarks' CPU columns."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (which may hold spaces)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of processes and their reaped children; one gone: 0."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += sum(int(f) for f in _stat(pid)[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [pid], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out
