"""One episode through the gateway's ``/ors`` with the ``openreward`` SDK's own client.

Run by ``test_ors_openreward_sdk.py`` with a Python that has the SDK (its dependencies are
heavy: it lives in a venv of its own, ``ARBITER_OPENREWARD_PYTHON``); standard library and
``openreward`` only. Usage: ``python ors_sdk_episode.py GATEWAY_URL API_KEY TASK_JSON``;
prints one JSON line: the tools, the prompt and each tool's output.

openreward 0.1.167 joins its paths (``/create_session``, ``/{env}/call``) to the host of
its base URL (aiohttp's URL join drops a base path), so it reaches only an ORS server at a
host's root. Its session here gets one client middleware that puts each path under the
gateway's ``/ors``; everything else (headers, ``X-API-Key``, SSE parsing, retries) is the
SDK's.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import aiohttp
from openreward.api._session.http import set_retry_policy
from openreward.api.environments.client import AsyncEnvironmentsAPI
from openreward.api.environments.types import Task


async def under_ors(
    request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    if not request.url.path.startswith("/ors/"):
        request.url = request.url.with_path("/ors" + request.url.path)
    return await handler(request)


async def main(gateway: str, key: str, task_spec: dict[str, Any]) -> dict[str, Any]:
    api = AsyncEnvironmentsAPI(base_url=gateway, api_key=key)
    session = aiohttp.ClientSession(base_url=gateway, middlewares=(under_ors,))
    set_retry_policy(session, "env-server")
    api._clients[gateway] = session
    env = api.get("arbiter", variant="math")
    task = Task(server_name="arbiter", environment_name="math", task_spec=task_spec, namespace=None)
    answer = task_spec["answer"].split("####")[-1].strip().replace(",", "")
    out: dict[str, Any] = {}
    try:
        async with env.session(task=task) as episode:
            out["sid"] = episode.sid
            out["tools"] = [t.name for t in await episode.list_tools()]
            out["prompt"] = [b.text for b in await episode.get_prompt()]
            result = await episode.call_tool(
                "submit", {"answer": f"<think>sum</think><answer>{answer}</answer>"}
            )
            out["reward"], out["finished"] = result.reward, result.finished
            out["metadata"] = result.metadata
    finally:
        await session.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))))
