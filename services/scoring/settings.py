"""What the scoring core reads of a service's settings: ``ComponentSettings``.

The component client (``fanout.ComponentClient``) and the scorer read only these: where
each component service is, the deadlines of its calls, how many calls may be in flight,
and how big one call may be. Each service that scores builds them from its own settings
(``GatewaySettings.components()``; the envs service from its ``ENVS_*`` settings,
``envs.rewards``), so the core reads no environment variable of its own and no service
imports another's settings. The defaults are the gateway's (``GATEWAY_*``), which the
envs service takes for what it does not set.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The component services a recipe's components are served by (``recipes.COMPONENTS``).
SERVICES = ("verify", "embedding", "judge", "sandbox")


class ComponentSettings(BaseModel):
    """The component services' URLs, deadlines, slots and batch sizes (see the module doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    service_urls: dict[str, str] = Field(
        default_factory=dict,
        description="Base URL per component service (one of SERVICES); a service left out "
        "is not configured, and a recipe that needs it is refused at admission.",
    )
    component_urls: dict[str, str] = Field(
        default_factory=dict, description="Per-component base-URL overrides."
    )
    component_timeout_s: float = Field(
        default=30.0, gt=0, description="Deadline of one component call, queueing included."
    )
    component_timeouts: dict[str, float] = Field(
        default_factory=dict, description="Per-component deadline overrides."
    )
    connect_timeout_s: float = Field(default=2.0, gt=0, description="TCP connect timeout.")
    max_concurrency: int = Field(default=64, ge=1, description="In-flight calls per service.")
    team_concurrency: int = Field(
        default=32, ge=1, description="In-flight calls per service of one team."
    )
    batch_groups: int = Field(default=64, ge=1, description="Groups per component call.")
    batch_responses: int = Field(default=512, ge=1, description="Responses per component call.")

    @model_validator(mode="after")
    def _services(self) -> ComponentSettings:
        unknown = set(self.service_urls) - set(SERVICES)
        if unknown:
            raise ValueError(f"unknown services {sorted(unknown)}; known: {', '.join(SERVICES)}")
        return self

    def service_url(self, service: str) -> str | None:
        return self.service_urls.get(service)

    def component_url(self, component: str, service: str) -> str | None:
        """Base URL serving ``component``: its override, else its service's URL."""
        return self.component_urls.get(component) or self.service_url(service)

    def timeout_for(self, component: str) -> float:
        return self.component_timeouts.get(component, self.component_timeout_s)
