"""Each Kubernetes target's gateway divides the quotas by its HPA's maxReplicas while Redis
cannot answer (``GATEWAY_QUOTA_REPLICAS``): with fewer, the pods together could serve a
team past its quota during an outage."""

from __future__ import annotations

import pytest

from tests.deploy.deployfiles import K8S, by_kind_name, container_env, kustomize, pod_containers
from tests.deploy.test_k8s import TARGETS
from tests.deploy.tools import tool


@pytest.mark.parametrize("target", TARGETS)
def test_the_gateway_quota_share_matches_its_hpa(target: str) -> None:
    rendered = by_kind_name(kustomize(K8S / target, tool("kubectl")))
    hpa = rendered[("HorizontalPodAutoscaler", "gateway")]
    [gateway] = [
        c for c in pod_containers(rendered[("Deployment", "gateway")]) if c["name"] == "gateway"
    ]
    replicas = container_env(gateway)["GATEWAY_QUOTA_REPLICAS"]
    assert int(replicas) == hpa["spec"]["maxReplicas"], target
