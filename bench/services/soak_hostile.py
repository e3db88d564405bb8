"""The soak's hostile client: requests a careless or malicious caller sends.

Each must be answered with a 4xx or a 200 (slow items come back null + timeout), never a
5xx, and must not stall the well-behaved clients beyond one item's deadline. The counts
of each (kind, status) go into ``seen``; a transport error counts as ``<kind>:<error>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import urlsplit

import httpx

JSON = {"content-type": "application/json"}


async def _announced_huge(url: str) -> int:
    """Headers announcing a 50 MB body, then a few bytes: refused before it is read."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(
            b"POST /v1/score HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 52428800\r\n\r\n" + b'{"recipe": "gsm8k", "groups": [' * 10
        )
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 10)
        return int(status.split()[1])
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _cases() -> list[tuple[str, dict[str, Any]]]:
    slow = "\\boxed{7^{123456789}}"
    big = [
        {"id": f"b{i}", "reference": str(i), "responses": [f"<answer>{i + j}</answer>"
                                                           for j in range(256)]}
        for i in range(128)
    ]  # fmt: skip
    return [
        ("surrogate", {"content": b'{"recipe":"gsm8k","groups":[{"responses":["\\ud800"]}]}',
                       "headers": JSON}),
        ("deep_json", {"content": b"[" * 10_000 + b"]" * 10_000, "headers": JSON}),
        ("wrong_type", {"content": b"recipe=gsm8k", "headers": {
            "content-type": "application/x-www-form-urlencoded"}}),
        ("slow_items", {"json": {"recipe": "gsm8k", "groups": [
            {"reference": "1", "responses": [slow] * 24}]}}),
        ("inf_weights", {"json": {"recipe": {"components": [
            {"name": "format", "weight": 1e308}, {"name": "math_accuracy", "weight": 1e308}]},
            "groups": [{"responses": ["a"]}]}}),
        ("big_valid", {"content": json.dumps({"recipe": "gsm8k", "groups": big}).encode(),
                       "headers": JSON}),
    ]  # fmt: skip


async def hostile(url: str, stop: asyncio.Event, seen: dict[str, int]) -> None:
    cases = _cases()

    def count(key: str) -> None:
        seen[key] = seen.get(key, 0) + 1

    async with httpx.AsyncClient(timeout=120) as http:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                count(f"announced_50mb:{await _announced_huge(url)}")
            except (OSError, TimeoutError, ValueError, IndexError) as exc:
                count(f"announced_50mb:{type(exc).__name__}")
            for kind, kwargs in cases:
                if stop.is_set():
                    return
                try:
                    r = await http.post(f"{url}/v1/score", **kwargs)
                    count(f"{kind}:{r.status_code}")
                except httpx.HTTPError as exc:
                    count(f"{kind}:{type(exc).__name__}")
            # A slow request abandoned after 1 s: its work must leave with it.
            slow = {"recipe": "gsm8k", "groups": [
                {"reference": "1", "responses": ["\\boxed{7^{987654321}}"] * 16}]}  # fmt: skip
            with contextlib.suppress(TimeoutError, httpx.HTTPError):
                await asyncio.wait_for(http.post(f"{url}/v1/score", json=slow), 1.0)
            count("abandoned:sent")
            await asyncio.sleep(0.5)
