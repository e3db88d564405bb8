"""A pool worker as the pool sees it: its process, its socket end (``multiprocessing
.Connection``'s framing, which the worker's blocking ``recv``/``send`` read and write; uvloop
makes the parent's end non-blocking, so the pool reads it with asyncio streams) and the
chunks it has in flight. ``pool.py`` runs the workers."""

from __future__ import annotations

import asyncio
import pickle
import struct
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from arbiter.services.verify.queue import Job


@dataclass(eq=False)
class Chunk:
    id: int
    jobs: list[Job]
    sent: float
    answered: int = 0  # results received: jobs[:answered]
    asked: bool = False  # asked to hand back early
    yield_at: float = 0.0  # when to ask, if others wait (from when it became the head)


@dataclass(eq=False)
class Worker:
    proc: BaseProcess
    writer: asyncio.StreamWriter
    # RawArray('d', 4): [index of the running item (-1: not started, len: sending), its
    # start time, the "yield" mark (a chunk id), the id of the chunk it runs] (worker.py)
    shared: Any
    inbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    reader: asyncio.Task[None] | None = None
    getter: asyncio.Task[Any] | None = None  # the pending ``inbox.get()``
    dead: bool = False  # its socket reached EOF
    inflight: deque[Chunk] = field(default_factory=deque)  # sent, in the order it runs them
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # work sent, or it died


def frame(msg: Any) -> bytes:
    """``msg`` in ``multiprocessing.Connection``'s framing (what the worker's recv reads)."""
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    n = len(data)
    return (struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)) + data


async def read_frame(reader: asyncio.StreamReader) -> Any:
    (n,) = struct.unpack("!i", await reader.readexactly(4))
    if n == -1:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    return pickle.loads(await reader.readexactly(n))
