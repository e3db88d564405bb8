"""Gateway test helpers: GSM8K-shaped groups, raw TCP servers for faults, and a gateway
whose judge and embedding are configured but down.

The raw servers are real sockets (not mocks): one never answers (a hung component, to
cause a real timeout), one answers 200 with a body that is not the contract. Neither
fault can be produced on demand by a real component service.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.procs import free_port
from tests.conftest import start_service


def gsm8k_groups(gsm8k_dir: Path, n: int, offset: int = 0) -> list[dict[str, Any]]:
    """Groups whose verify scores are known: per group 6 responses, one duplicated."""
    out = []
    lines = (gsm8k_dir / "test.jsonl").read_text().splitlines()[offset : offset + n]
    for i, line in enumerate(lines):
        item = json.loads(line)
        ans = int(item["answer"].split("####")[-1].strip().replace(",", ""))
        good = f"<think>work {i}</think><answer>{ans}</answer>"
        responses = [
            good,  # right answer, right format: math 1, format 1
            f"<think>work {i}</think><answer>{ans + 1}</answer>",  # wrong answer: math 0
            f"The answer is {ans}.",  # right answer, no tags: math 1, format 0
            f"<think>guess {i}</think><answer>{ans + 7}</answer> trailing",  # 0 and 0
            good,  # the same text twice in one group: scored once, both indices filled
            f"<think>again {i}</think>\n<answer>{ans}</answer>\n",  # 1 and 1
        ]
        out.append(
            {
                "id": f"gsm8k-{offset + i}",
                "prompt": item["question"],
                "reference": item["answer"],
                "responses": responses,
            }
        )
    return out


EXPECTED_MATH = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
EXPECTED_FORMAT = [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]


async def score(url: str, body: dict[str, Any], wait_s: float = 30.0) -> httpx.Response:
    async with httpx.AsyncClient(timeout=wait_s) as client:
        return await client.post(f"{url}/v1/score", json=body)


class RawServer:
    """A TCP listener on 127.0.0.1: ``reply=None`` never answers, else sends ``reply`` to
    every request (keep-alive unless ``close_after``)."""

    def __init__(self, reply: bytes | None, close_after: bool = False):
        self.reply = reply
        self.close_after = close_after  # close the connection after each reply
        self.accepted = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.accepted += 1
            if self.reply is not None:
                threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        assert self.reply is not None
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(rest) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    rest += chunk
                buf = rest[length:]
                conn.sendall(self.reply)
                if self.close_after:
                    conn.close()
                    return
        except OSError:
            return

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        self.sock.close()
        for conn in self.conns:
            conn.close()


def http_reply(status: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


@pytest.fixture
def hung_server() -> Iterator[RawServer]:
    server = RawServer(None)
    yield server
    server.close()


@pytest.fixture
def garbage_server() -> Iterator[RawServer]:
    server = RawServer(http_reply("200 OK", b'{"component": "x", "groups": "not a list"}'))
    yield server
    server.close()


@pytest.fixture(scope="session")
def judge_down_url(log_dir: Path, verify_url: str, redis_url: str) -> Iterator[str]:
    """A gateway whose judge, embedding and sandbox services are configured but down
    (nothing listens at their URLs): a fault, so their scores are null with kind
    ``unavailable`` (the session ``gateway_url`` has none configured: their recipes are
    refused)."""
    env = {
        "GATEWAY_VERIFY_URL": verify_url,
        "REDIS_URL": redis_url,
        "GATEWAY_JUDGE_URL": f"http://127.0.0.1:{free_port()}",
        "GATEWAY_EMBEDDING_URL": f"http://127.0.0.1:{free_port()}",
        "GATEWAY_SANDBOX_URL": f"http://127.0.0.1:{free_port()}",
    }
    proc, url = start_service("gateway", log_dir, env)
    yield url
    proc.stop()
