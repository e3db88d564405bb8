"""Fair share of a component service's call slots: across teams first, then a team's requests.

The scoring core's component client (in the gateway, or the envs service) holds at most
``limit`` calls in flight to one component service. With one first-come queue, a team that
posts hundreds of one-sample requests at once (OpenRLHF and slime do) fills every slot and
another team's call waits behind all of them: 10.8 s for a one-response request behind 70
requests x 6 LaTeX responses. Here

- one team holds at most ``per_team`` slots (fewer than ``limit``), so another team's
  call finds a free slot at once while fewer than ``limit / per_team`` teams are busy;
- when every slot is taken, a freed slot goes to the call the fair-share policy picks
  (``common.fairshare``, through ``common.fairness.FairLimiter``): another team's call
  waits for at most one call per other team, whatever those teams sent or were served
  before; a team of weight ``w`` (``GATEWAY_TEAM_WEIGHTS``) gets ``w`` times the call slots.

The component service shares its own work the same way (it learns the team from the
``X-Arbiter-Team`` header), so another team's item waits at most about one item's
deadline, whatever one team sends. A waiter that is cancelled (its client left) leaves
the line; one admitted and then cancelled hands its slot on.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Hashable

from arbiter.services.common.fairness import FairLimiter


class TeamSlots(FairLimiter):
    """At most ``limit`` holders, at most ``per_team`` of one team (see the module doc)."""

    def __init__(self, limit: int, per_team: int) -> None:
        if not 1 <= per_team <= limit:
            raise ValueError(f"need 1 <= per_team <= limit, got {per_team} and {limit}")
        super().__init__(limit, per_team=per_team)

    @contextlib.asynccontextmanager
    async def slot(  # type: ignore[override]  # the scoring core names the team first
        self, team: str, request: Hashable, weight: int = 1
    ) -> AsyncIterator[None]:
        """Hold one slot for ``team``'s ``request``, waiting for their turn if need be."""
        async with super().slot(request, team, weight):
            yield
