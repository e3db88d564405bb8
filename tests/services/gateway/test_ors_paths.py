"""What an ``env_name`` in the gateway's ``/ors`` paths can reach, against the real envs
service.

Guarded: the name is one segment of the envs service's path, so a name that decodes to a
query (``readyz?``), a fragment or a step up (``..``) is an unknown environment (404
naming ``env_name``), never the envs service's internal ``/readyz`` or ``/metrics``
answered to a caller without a key, nor a keyed route other than the one called.
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.services.gateway.envs_stack import EnvsStack, envs_stack

__all__ = ["envs_stack"]


@pytest.mark.parametrize(
    "path",
    [
        "readyz%3F/tools",
        "metrics%3F/splits",
        "healthz%23/tools",
        "%2E%2E/tools",
    ],
)
def test_env_name_reaches_no_other_route(envs_stack: EnvsStack, path: str) -> None:
    r = httpx.get(f"{envs_stack.gateway}/ors/{path}", headers=envs_stack.keys.headers("alpha"))
    assert r.status_code == 404, r.text
    assert r.json()["error"]["param"] == "env_name"
    assert '"checks"' not in r.text and "# HELP" not in r.text


def test_env_name_in_a_keyed_post_stays_in_its_route(envs_stack: EnvsStack) -> None:
    headers = envs_stack.keys.headers("alpha", **{"X-Session-ID": str(uuid.uuid4())})
    r = httpx.post(
        f"{envs_stack.gateway}/ors/create_session%3F/call",
        json={"name": "submit", "input": {}},
        headers=headers,
    )
    # refused as a call of an unknown environment, never a new session's SSE body
    assert r.status_code in (400, 404), r.text
    assert "event: task_id" not in r.text


def test_plain_names_still_served(envs_stack: EnvsStack) -> None:
    r = httpx.get(f"{envs_stack.gateway}/ors/calculator/tools")
    assert r.status_code == 200 and [t["name"] for t in r.json()["tools"]] == [
        "calculate",
        "submit",
    ]
