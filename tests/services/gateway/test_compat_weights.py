"""A team's weight (``GATEWAY_TEAM_WEIGHTS``) reaches the component slots on every route.

The gateway app in this process (its lifespan run, every middleware in place) with keys,
in front of the session's verify service and Redis. The verify slots are wrapped to record
the team and weight of each call they hand out; the calls themselves go through.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.services.gateway.app import create_app
from arbiter.services.gateway.settings import GatewaySettings
from tests.services.gateway.teams import SECRET, Keys


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    k = Keys(tmp_path / "keys.yaml")
    k.add("a", "team-a")
    return k


@pytest.fixture
async def gateway(
    keys: Keys, verify_url: str, redis_url: str
) -> AsyncIterator[tuple[httpx.AsyncClient, list[tuple[str, int]]]]:
    settings = GatewaySettings(
        verify_url=verify_url,
        redis_url=redis_url,
        keys_file=keys.path,
        key_secret=SECRET,
        team_weights={"team-a": 3},
        cache_enabled=False,
    )
    app = create_app(settings)
    seen: list[tuple[str, int]] = []
    async with app.router.lifespan_context(app):
        slots = app.state.scorer.client.slots["verify"]
        slot = slots.slot

        def record(
            team: str, request: Hashable, weight: int = 1
        ) -> AbstractAsyncContextManager[None]:
            seen.append((team, weight))
            return slot(team, request, weight)

        slots.slot = record
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield client, seen


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/score", {"recipe": "gsm8k", "groups": [{"reference": "4", "responses": ["4"]}]}),
        ("/v1/compat/slime/gsm8k", {"prompt": "2+2?", "response": "4", "label": "4"}),
        ("/v1/compat/openrlhf/gsm8k", {"query": ["2+2? 4"], "prompts": ["2+2?"], "labels": ["4"]}),
    ],
)
async def test_the_team_weight_reaches_the_slots(
    gateway: tuple[httpx.AsyncClient, list[tuple[str, int]]],
    keys: Keys,
    path: str,
    body: dict[str, Any],
) -> None:
    # The compat routes' groups were scored with weight 1 whatever the team's weight, and
    # each such call set the team's weight in the slots back to 1 for its /v1/score calls.
    client, seen = gateway
    r = await client.post(path, json=body, headers=keys.headers("a"))
    assert r.status_code == 200, r.text
    assert seen and set(seen) == {("team-a", 3)}, seen
