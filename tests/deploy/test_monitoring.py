"""The monitoring that ships: Prometheus config, alert rules, Grafana provisioning, ServiceMonitor.

promtool (Debian's ``prometheus`` package, installed by ``make setup``) checks the config
and the rules and runs the rules' unit tests (monitoring/alerts_test.yml). Every metric a
dashboard panel or an alert rule queries must exist in the ``/metrics`` of the real
services, started here as in production.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from arbiter.serve import SERVICES, default_port
from tests.conftest import start_service
from tests.deploy.deployfiles import COMPOSE, K8S, REPO, by_kind_name, kustomize, load_compose
from tests.deploy.tools import run, tool
from tests.services.embedding.conftest import embedding_url, wait_ready  # noqa: F401  (fixture)

MONITORING = REPO / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "arbiter.json"
PROVISIONING = MONITORING / "grafana" / "provisioning"
ALERTS = MONITORING / "alerts.yml"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool is not installed; install it with: apt-get install -y "
            "--no-install-recommends prometheus (`make setup` does this)"
        )
    return found


def test_promtool_accepts_the_config_and_the_rules() -> None:
    run([promtool(), "check", "config", str(MONITORING / "prometheus.yml")], "promtool config")
    run([promtool(), "check", "rules", str(ALERTS)], "promtool rules")


def test_alert_rules_fire_when_they_should() -> None:
    """monitoring/alerts_test.yml: input series in, expected alerts (and silences) out."""
    run([promtool(), "test", "rules", str(MONITORING / "alerts_test.yml")], "promtool test rules")


def test_the_rules_cover_errors_judge_and_verify_restarts() -> None:
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    names = {r["alert"] for r in rules}
    assert {
        "ArbiterHighErrorRate",
        "ArbiterJudgeUnavailable",
        "ArbiterVerifyWorkerRestarts",
    } <= names
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def variables() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard()["templating"]["list"]}


def test_dashboard_queries_the_chosen_datasource() -> None:
    """No fixed datasource uid: every panel and query follows the $datasource variable
    (any Prometheus; the provisioned one is the default)."""
    source = variables()["datasource"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    sources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    assert sources["datasources"][0]["isDefault"] is True
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    chosen = {"type": "prometheus", "uid": "${datasource}"}
    for panel in panels():
        assert panel["datasource"] == chosen, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == chosen and target["expr"].strip()
    for name in ("instance", "recipe", "team"):
        assert variables()[name]["datasource"] == chosen, name
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "arbiter.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_dashboard_shows_what_operators_need() -> None:
    exprs = " ".join(t["expr"] for p in panels() for t in p["targets"])
    for metric in (
        "arbiter_http_request_seconds_bucket",  # requests and latency
        "arbiter_gateway_component_seconds_bucket",  # latency per component
        "arbiter_gateway_cache_total",  # cache hit ratio
        "arbiter_gateway_component_errors_total",  # errors by kind
        "arbiter_gateway_component_score_bucket",  # reward distribution per component
        "arbiter_judge_tokens_total",  # judge tokens
        "sandbox_items_total",  # the sandbox's responses by outcome
        "sandbox_job_seconds_bucket",  # its job time
        "arbiter_gateway_team_sandbox_cpu_seconds_total",  # its CPU time per team
        "sandbox_failures_total",  # the sandbox's own failures by stage
    ):
        assert metric in exprs, metric


def substituted(expr: str) -> str:
    """A query as Prometheus gets it with every variable at All: Grafana's own intervals,
    and ``.*`` for the dashboard's variables (each used with ``=~``)."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "15m")
    return re.sub(r"\$\{?(instance|recipe|team)\}?", ".*", expr)


def test_dashboard_variables_scope_the_queries() -> None:
    """$instance on every query, $recipe on the recipe's series, $team on the teams'; and no
    query names a variable the dashboard does not define."""
    defined = set(variables())
    assert {"datasource", "instance", "recipe", "team"} <= defined
    for panel in panels():
        for target in panel["targets"]:
            expr = target["expr"]
            used = set(re.findall(r"\$\{?([a-z_]+)", expr)) - {"__rate_interval", "__range"}
            assert used <= defined, (panel["title"], used - defined)
            for metric in re.findall(r"\b(?:arbiter|verify|sandbox)_[a-z0-9_]+\b", expr):
                assert re.search(rf'{metric}{{[^}}]*instance=~"\$instance"', expr), metric
            if "recipe" in expr.split("(")[0] or "by (recipe" in expr:
                assert 'recipe=~"$recipe"' in expr, panel["title"]
            if "team" in expr:
                assert 'team=~"$team"' in expr, panel["title"]
        assert "$" not in substituted(" ".join(t["expr"] for t in panel["targets"]))


def test_dashboard_has_per_team_panels() -> None:
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in panels()}
    team = {t: e for t, e in exprs.items() if "by (team" in e}
    for metric in (
        "arbiter_gateway_team_responses_total",  # responses
        "arbiter_gateway_quota_rejections_total",  # quota refusals
        "arbiter_gateway_team_nulls_total",  # null rate (over responses)
        "arbiter_gateway_team_judge_tokens_total",  # judge tokens
        "arbiter_gateway_team_sandbox_cpu_seconds_total",  # sandbox CPU time
    ):
        assert any(metric in e for e in team.values()), metric


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query, variables substituted as Prometheus would get them."""
    exprs = [substituted(t["expr"]) for p in panels() for t in p["targets"]]
    rules = [{"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run([promtool(), "check", "rules", str(path)], "promtool check rules (dashboard queries)")


def queried_metrics() -> dict[str, set[str]]:
    """Metric name → where it is queried (panel titles, alert names)."""
    where: dict[str, set[str]] = {}
    sources = [(p["title"], t["expr"]) for p in panels() for t in p["targets"]]
    rules = yaml.safe_load(ALERTS.read_text())["groups"]
    sources += [(r["alert"], r["expr"]) for g in rules for r in g["rules"]]
    for name, expr in sources:
        expr = re.sub(r'"[^"]*"', '""', expr)  # label values are not metric names
        for token in re.findall(r"\b(?:arbiter|verify|sandbox)_[a-z0-9_]+\b", expr):
            where.setdefault(token, set()).add(name)
    return where


@pytest.fixture(scope="module")
def judge_url(log_dir: Path) -> Iterator[str]:
    # No judge server behind it: /metrics is served all the same, which is all this needs.
    proc, url = start_service("judge", log_dir, {"JUDGE_BASE_URL": "http://127.0.0.1:9/v1"})
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def sandbox_url(log_dir: Path) -> Iterator[str]:
    proc, url = start_service("sandbox", log_dir, {"SANDBOX_WORKERS": "1", "SANDBOX_SPARE": "0"})
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def exported(
    request: pytest.FixtureRequest,
    gateway_url: str,
    verify_url: str,
    judge_url: str,
    sandbox_url: str,
) -> set[str]:
    """Every sample name the running services' /metrics can show."""
    embedding: str = request.getfixturevalue("embedding_url")
    wait_ready(embedding)
    names: set[str] = set()
    for url in (gateway_url, verify_url, embedding, judge_url, sandbox_url):
        text = httpx.get(f"{url}/metrics", timeout=10.0).text
        for kind_line in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M):
            name, kind = kind_line.groups()
            names.add(name)
            if kind == "counter":
                names.add(name.removesuffix("_total") + "_total")
            if kind == "histogram":
                names.update(f"{name}_{s}" for s in ("bucket", "count", "sum"))
        names.update(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.M))
    return names


def test_every_queried_metric_is_exported(exported: set[str]) -> None:
    queried = queried_metrics()
    assert len(queried) >= 15, sorted(queried)  # the parser found the queries
    missing = {m: sorted(w) for m, w in queried.items() if m not in exported}
    assert not missing, f"queried but no service exports them: {missing}"


def test_the_service_monitor_matches_the_services() -> None:
    """Its selector and port name match every scraped Service the base renders."""
    monitor = kustomize(K8S / "monitoring", tool("kubectl"))
    [sm] = [r for r in monitor if r["kind"] == "ServiceMonitor"]
    selector = sm["spec"]["selector"]["matchLabels"]
    [endpoint] = sm["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    base = by_kind_name(kustomize(K8S / "base", tool("kubectl")))
    for name in ("gateway", "verify", "embedding", "judge", "sandbox"):
        service = base[("Service", name)]
        assert selector.items() <= service["metadata"]["labels"].items(), name
        ports = {p["name"] for p in service["spec"]["ports"]}
        assert endpoint["port"] in ports, name


def test_compose_monitoring_profile_mounts_what_ships() -> None:
    compose = load_compose()
    services = compose["services"]
    mounts = {
        name: {v.split(":")[1]: v.split(":")[0] for v in services[name]["volumes"]}
        for name in ("prometheus", "grafana")
    }
    assert (REPO / mounts["prometheus"]["/etc/prometheus/prometheus.yml"]).is_file()
    assert (REPO / mounts["prometheus"]["/etc/prometheus/alerts.yml"]) == ALERTS
    assert (REPO / mounts["grafana"]["/etc/grafana/provisioning"]) == PROVISIONING
    assert (REPO / mounts["grafana"]["/var/lib/grafana/dashboards"]) == DASHBOARD.parent
    # Prometheus scrapes each service by its compose name on its settings' port
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    targets = {j["job_name"]: j["static_configs"][0]["targets"] for j in config["scrape_configs"]}
    for service in SERVICES:
        assert service in services, service
        assert targets[service] == [f"{service}:{default_port(service)}"], service


def test_the_embedding_publish_override_is_valid_compose() -> None:
    override = REPO / "docker" / "compose.embedding.yml"
    cmd = [tool("docker-compose"), "-f", str(COMPOSE), "-f", str(override), "config"]
    rendered = yaml.safe_load(run(cmd, "docker-compose with the embedding override").stdout)
    [port] = rendered["services"]["embedding"]["ports"]
    # docker-compose 1.29 renders the short form: 127.0.0.1:8002:8002/tcp (localhost only)
    assert port == f"127.0.0.1:8002:{default_port('embedding')}/tcp"
