"""The encoder in a child process (``EMBEDDING_ENCODE_WORKER=process``).

On a GPU the forward pass is short and Python-heavy (one dispatch per op), so an encode
thread and the event loop contend for one GIL: requests are parsed late, batches come out
small. Here the model lives in a spawned child with its own interpreter; the batcher's
single worker thread only sends texts down a pipe and reads the rows back (blocking I/O,
GIL released). Same interface as ``Encoder``.

Pipelined like the in-process encoder: ``prepare`` only sends a batch's texts, and the
child tokenizes it on its main thread while its forward thread still runs the previous
batch; ``forward`` reads the rows back. Answers come back in the order batches were sent.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import threading
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from arbiter.services.common.logs import configure
from arbiter.services.embedding.encoder import Encoded, Encoder
from arbiter.services.embedding.fast_tokenize import TokenCounter
from arbiter.services.embedding.settings import EmbeddingSettings

log = logging.getLogger("arbiter.embedding")


def _child(conn: Connection, settings: dict[str, Any]) -> None:
    configure("embedding", settings["log_level"])  # a spawned process starts unconfigured
    try:
        encoder = Encoder(EmbeddingSettings(**settings))
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", encoder.dim, encoder.max_seq_length, encoder.device,
               encoder.counter.to_json()))  # fmt: skip
    # main thread: receive + tokenize; forward thread: forward passes + answer, in order
    prepared: queue.Queue[Any] = queue.Queue(maxsize=2)

    def forward_loop() -> None:
        while (item := prepared.get()) is not None:
            if item[0] != "ok":
                conn.send(item)
                continue
            try:
                r = encoder.forward(item[1])
                conn.send(("ok", r.vectors, r.tokens, r.truncated))
            except Exception as exc:
                conn.send(("error", f"{type(exc).__name__}: {exc}"))

    worker = threading.Thread(target=forward_loop, name="forward", daemon=True)
    worker.start()
    while True:
        try:
            texts = conn.recv()
        except EOFError:  # the parent went away
            texts = None
        if texts is None:
            prepared.put(None)
            worker.join()
            return
        try:
            prepared.put(("ok", encoder.prepare(texts)))
        except Exception as exc:
            prepared.put(("error", f"{type(exc).__name__}: {exc}"))


class ProcessEncoder:
    """Proxy to an ``Encoder`` in a child process. Call ``encode`` from one thread."""

    def __init__(self, settings: EmbeddingSettings):
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(
            target=_child, args=(child_conn, settings.model_dump()), name="embedding-encoder",
            daemon=True,
        )  # fmt: skip
        self._proc.start()
        child_conn.close()
        try:
            msg = self._conn.recv()
        except EOFError:
            msg = ("error", f"encoder process exited with code {self._proc.exitcode}")
        if msg[0] != "ready":
            self.close()
            raise RuntimeError(f"encoder process failed to load the model: {msg[1]}")
        self.dim: int = msg[1]
        self.max_seq_length: int = msg[2]
        self.device: str = msg[3]
        self.counter = TokenCounter(msg[4], self.max_seq_length)  # the child's, rebuilt here
        log.info("encoder process %d ready", self._proc.pid)

    @property
    def alive(self) -> bool:
        return self._proc.is_alive()

    def count(self, texts: list[str]) -> np.ndarray:
        """Tokens per text, counted here as the child would (``TokenCounter``)."""
        return self.counter(texts)

    def prepare(self, texts: list[str]) -> int:
        """Send a batch to the child (which starts tokenizing it); returns its size."""
        try:
            self._conn.send(texts)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise RuntimeError(f"encoder process died (exit code {self._proc.exitcode})") from exc
        return len(texts)

    def forward(self, _sent: int) -> Encoded:
        """The rows of the oldest batch sent and not yet answered."""
        try:
            msg = self._conn.recv()
        except (EOFError, ConnectionResetError, OSError) as exc:
            raise RuntimeError(f"encoder process died (exit code {self._proc.exitcode})") from exc
        if msg[0] != "ok":
            raise RuntimeError(f"encoder process: {msg[1]}")
        return Encoded(msg[1], msg[2], msg[3])

    def encode(self, texts: list[str]) -> Encoded:
        return self.forward(self.prepare(texts))

    def close(self) -> None:
        try:
            if self._proc.is_alive():
                self._conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._conn.close()
