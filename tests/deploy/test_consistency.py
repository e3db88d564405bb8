"""Each service's port, env var names and health paths agree between its settings class,
the Dockerfile, docker-compose.yml and k8s/ — and the values deployed there parse.

The settings class is the source of truth: a variable that compose or k8s sets but the
class does not read is an error (a typo would otherwise be ignored silently, because the
settings classes use extra="ignore"). The health paths are read off the app itself
(create_app(settings).routes), built from the very values each deployment sets.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deployfiles import (
    ENV_EXAMPLE,
    K8S,
    LIBRARY_ENV,
    OVERLAYS,
    REPO,
    SERVICES,
    ServiceSettingsInfo,
    by_kind_name,
    compose_env,
    dockerfile_stages,
    env_example_names,
    healthcheck_url,
    load_compose,
    pod_containers,
    render,
    resolve_base,
    settings_class,
    settings_info,
    stage_chain,
    substitute_default,
)

TARGETS = ["base", *(f"overlays/{o}" for o in OVERLAYS)]
STAGES = {s: [s] for s in SERVICES} | {"embedding": ["embedding", "embedding-cpu"]}
# Image-level variables that are not service settings.
IMAGE_ENV = re.compile(r"^(PYTHON\w*|PIP_\w+|HF_\w+|TRANSFORMERS_OFFLINE)$")


@pytest.fixture(scope="module")
def info() -> dict[str, ServiceSettingsInfo]:
    return {s: settings_info(s) for s in SERVICES}


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], dict[str, Any]]:
    return dockerfile_stages()


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    return {t: by_kind_name(render(K8S / t)) for t in TARGETS}


def unknown_names(names: set[str], info: ServiceSettingsInfo) -> list[str]:
    """Names the settings class does not read, each with the closest known name."""
    known = set(info.env) | LIBRARY_ENV
    out = []
    for name in sorted(names - known):
        close = difflib.get_close_matches(name, sorted(info.env), n=1)
        out.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return out


@contextmanager
def environ(values: dict[str, str], clear: frozenset[str]) -> Iterator[None]:
    saved = dict(os.environ)
    try:
        for name in clear:
            os.environ.pop(name, None)
        os.environ.update(values)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def build_app(service: str, info: ServiceSettingsInfo, env: dict[str, str], where: str) -> Any:
    """Settings from a deployment's env (validators included), then the app's routes."""
    from importlib import import_module

    cls = settings_class(service)
    with environ(env, info.env):
        try:
            settings = cls()
        except Exception as exc:
            pytest.fail(f"{where}: {cls.__name__} rejects the deployed values {env}:\n{exc}")
    app = import_module(f"arbiter.services.{service}.app").create_app(settings)
    return {getattr(r, "path", None) for r in app.routes}


def expected_cmd(service: str, port: int) -> list[str]:
    return [
        "uvicorn",
        f"arbiter.services.{service}.app:create_app",
        "--factory",
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
    ]


@pytest.mark.parametrize("service", SERVICES)
def test_settings_port_is_the_contract_port(service: str, info: Any) -> None:
    assert info[service].port == SERVICES[service], f"{info[service].cls_name}.port default"


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_stage_agrees_with_settings(service: str, info: Any, dockerfile: Any) -> None:
    args, stages = dockerfile
    si: ServiceSettingsInfo = info[service]
    prefix = service.upper() + "_"
    for name in STAGES[service]:
        assert name in stages, f"docker/Dockerfile has no stage {name!r}"
        stage = stages[name]
        chain = stage_chain(stages, name)
        where = f"docker/Dockerfile stage {name}"
        assert stage.all("EXPOSE") == [str(si.port)], f"{where}: EXPOSE"
        port, path = healthcheck_url(stage.exec_form("HEALTHCHECK"))
        assert (port, path) == (si.port, "/healthz"), f"{where}: HEALTHCHECK {port}{path}"
        assert stage.exec_form("CMD") == expected_cmd(service, si.port), f"{where}: CMD"
        env = {k: v for s in reversed(chain) for k, v in s.env().items()}
        settings_env = {k for k in env if not IMAGE_ENV.match(k)}
        assert not unknown_names(settings_env, si), (
            f"{where}: ENV {unknown_names(settings_env, si)}"
        )
        assert env[prefix + "PORT"] == str(si.port) and env[prefix + "HOST"] == "0.0.0.0", where
        installs = " ".join(stage.all("RUN"))
        extras = set(re.findall(r"arbiter-\*\.whl\)\[([\w,]+)\]", installs))
        assert extras == {service}, f"{where}: installs extras {extras}, not just [{service}]"
        users = [u for s in chain for u in s.all("USER")]
        assert users and users[0].split(":")[0] not in ("0", "root"), f"{where}: USER {users}"
        base = resolve_base(args, chain[-1].base)
        tag = base.rpartition(":")[2]
        assert ":" in base and tag != "latest" and re.search(r"\d", tag), f"{where}: {base}"


@pytest.mark.parametrize("service", SERVICES)
def test_compose_service_agrees_with_settings(
    service: str, info: Any, dockerfile: Any, compose: Any
) -> None:
    si: ServiceSettingsInfo = info[service]
    svc = compose["services"][service]
    where = f"docker-compose.yml service {service}"
    target = substitute_default(svc["build"]["target"])
    assert target in STAGES[service], f"{where}: build target {target}"
    assert svc["build"]["dockerfile"] == "docker/Dockerfile"
    port, path = healthcheck_url(svc["healthcheck"]["test"])
    assert port == si.port, f"{where}: healthcheck port {port}"
    for published in svc.get("ports", []):
        assert substitute_default(published).rpartition(":")[2] == str(si.port), where
    env = compose_env(svc)
    assert not unknown_names(set(env), si), f"{where}: environment {unknown_names(set(env), si)}"
    uncovered = [f for f, names in si.configurable.items() if not set(names) & set(env)]
    assert not uncovered, (
        f"{where}: settings not passed through (add `- NAME` to environment, and the "
        f"line to .env.example): {[si.fields[f][0] for f in uncovered]}"
    )
    fixed = {si.fields["host"][0], si.fields["port"][0]} & set(env)
    assert not fixed, f"{where}: {fixed} are fixed by the image (uvicorn --host/--port)"
    # the values compose sets by default, with container paths mapped to the repository
    values = {k: substitute_default(v) for k, v in env.items() if v is not None}
    values = {k: v for k, v in values.items() if v != ""}
    for mount in svc.get("volumes", []):
        source, target_path = substitute_default(mount).split(":")[:2]
        for k, v in values.items():
            if v == target_path and source.startswith("."):
                values[k] = str(REPO / source)
    routes = build_app(service, si, values, where)
    assert path in routes and path in ("/healthz", "/readyz"), f"{where}: healthcheck {path}"
    assert {"/healthz", "/readyz"} <= routes


@pytest.mark.parametrize("service", SERVICES)
def test_env_example_values_parse(service: str, info: Any, compose: Any) -> None:
    si: ServiceSettingsInfo = info[service]
    listed = env_example_names(ENV_EXAMPLE)
    values = {k: v for k, v in listed.items() if k in si.env and v != ""}
    for k, v in compose_env(compose["services"][service]).items():
        if v is not None and "${" not in v:
            values[k] = v  # fixed by compose
    if "GATEWAY_RECIPES_FILE" in values:
        values["GATEWAY_RECIPES_FILE"] = str(REPO / "docker" / "recipes.yaml")
    build_app(service, si, values, f".env.example ({service})")


def _k8s_env(res: dict[tuple[str, str], Any], container: dict[str, Any]) -> dict[str, str]:
    out = {}
    for e in container.get("env", []):
        if "value" in e:
            out[e["name"]] = str(e["value"])
        elif "secretKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["secretKeyRef"]
            secret = res.get(("Secret", ref["name"]))  # absent: created out of band (prod)
            out[e["name"]] = str(secret["stringData"][ref["key"]]) if secret else "external"
    return out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("service", SERVICES)
def test_k8s_deployment_agrees_with_settings(
    service: str, target: str, info: Any, rendered: Any, tmp_path: Path
) -> None:
    si: ServiceSettingsInfo = info[service]
    res = rendered[target]
    where = f"k8s/{target} Deployment {service}"
    deployment = res[("Deployment", service)]
    (container,) = pod_containers(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert list(ports.values()) == [si.port], f"{where}: containerPort {ports}"
    probes = {"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/healthz"}
    for probe, path in probes.items():
        get = container[probe]["httpGet"]
        port = ports.get(get["port"], get["port"])
        assert (port, get["path"]) == (si.port, path), f"{where}: {probe} {get}"
    env = _k8s_env(res, container)
    names = {e["name"] for e in container.get("env", [])}
    assert not unknown_names(names, si), f"{where}: env {unknown_names(names, si)}"
    fixed = {si.fields["host"][0], si.fields["port"][0]} & names
    assert not fixed, f"{where}: {fixed} are fixed by the image"
    # ConfigMap volumes are written out, so paths in the env point at real files
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        cm = volumes[mount["name"]].get("configMap")
        if cm is None:
            continue
        local = tmp_path / mount["name"]
        local.mkdir()
        for key, text in res[("ConfigMap", cm["name"])]["data"].items():
            (local / key).write_text(text)
        for k, v in env.items():
            if v.startswith(mount["mountPath"] + "/"):
                env[k] = str(local / v[len(mount["mountPath"]) + 1 :])
    routes = build_app(service, si, env, where)
    assert {"/healthz", "/readyz"} <= routes, f"{where}: app routes {routes}"
    svc = res[("Service", service)]
    assert [p["port"] for p in svc["spec"]["ports"]] == [si.port], f"k8s/{target} Service"


def test_trainer_image_and_compose_command_name_real_config(compose: Any, dockerfile: Any) -> None:
    from arbiter.trainer.config import TrainerConfig

    _, stages = dockerfile
    trainer = stages["trainer"]
    assert trainer.exec_form("ENTRYPOINT") == ["python", "-m", "arbiter.trainer"]
    image_cmd = trainer.exec_form("CMD")
    assert image_cmd[0] == "--config" and (REPO / image_cmd[1]).is_file(), image_cmd
    assert trainer.all("HEALTHCHECK") == ["NONE"], "a batch job has no health endpoint"
    command = [substitute_default(c) for c in compose["services"]["trainer"]["command"]]
    assert command[0] == "--config"
    config = REPO / command[1]
    assert config.is_file(), f"trainer config {command[1]} is not in the repository"
    fields = {f.name for f in dataclasses.fields(TrainerConfig)}
    overrides = dict(c.split("=", 1) for c in command[2:])
    assert set(overrides) <= fields, f"unknown trainer settings {set(overrides) - fields}"
    assert overrides["gateway_url"] == f"http://gateway:{SERVICES['gateway']}"
    yaml.safe_load(config.read_text())
