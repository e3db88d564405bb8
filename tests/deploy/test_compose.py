"""docker-compose.yml and .env.example: both validators, profiles, health-gated start order,
GPU reservations, volumes, every variable documented, and the services' settings real:
every name one the service reads, every default value one it accepts, the healthchecks on
the port its settings give."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from arbiter.keys import DEV_SECRET
from arbiter.serve import SERVICES
from arbiter.services.scoring.recipes import RecipeBook
from tests.deploy.deployfiles import (
    COMPOSE,
    ENV_EXAMPLE,
    K8S,
    PORTS,
    REPO,
    check_settings,
    compose_env,
    compose_variables,
    env_example_names,
    healthcheck_url,
    load_compose,
    settings_info,
    substitute_default,
    unknown_names,
)
from tests.deploy.env_example import KEYS_FILE_IN_COMPOSE
from tests.deploy.tools import run, tool

CPU_SERVICES = {"redis", "state-redis", "verify", "embedding", "gateway", "sandbox", "envs"}
PROFILES = {
    "gpu": {"vllm", "judge"},
    "cpu": {"vllm-cpu", "judge"},  # the judge's model on vLLM's CPU build
    "judge": {"judge"},  # the judge alone, against any OpenAI-compatible JUDGE_BASE_URL
    "monitoring": {"prometheus", "grafana"},
    "train": {"trainer"},
}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.mark.parametrize(
    "profiles",
    [
        [],  # `docker compose up` on a laptop: the CPU services
        ["gpu"],  # + vllm and judge
        ["train"],  # + trainer
        ["gpu", "train"],  # everything
        ["cpu"],  # + vllm-cpu and judge
        ["judge", "monitoring"],  # + judge alone, Prometheus and Grafana
    ],
    ids=["cpu", "gpu", "train", "all", "cpu-judge", "judge-monitoring"],
)
def test_docker_compose_v1_accepts_the_file(profiles: list[str]) -> None:
    flags = [a for p in profiles for a in ("--profile", p)]
    run([tool("docker-compose"), "-f", str(COMPOSE), *flags, "config", "-q"], "docker-compose")


def test_docker_compose_v1_accepts_every_value_of_env_example(tmp_path: Path) -> None:
    # Every commented line uncommented, as a user who copies the file and edits it would.
    lines = [
        re.sub(r"^#\s*(?=[A-Z][A-Z0-9_]*=)", "", line)
        for line in ENV_EXAMPLE.read_text().splitlines()
    ]
    env = tmp_path / ".env"
    env.write_text("\n".join(lines) + "\n")
    out = run(
        [tool("docker-compose"), "-f", str(COMPOSE), "--env-file", str(env), "config"],
        "docker-compose with .env.example",
    )
    rendered = yaml.safe_load(out.stdout)
    assert set(rendered["services"]) >= CPU_SERVICES | PROFILES["gpu"]


def test_compose_spec_schema_accepts_the_file() -> None:
    run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        "check-jsonschema (compose-spec)",
    )


@pytest.mark.parametrize(
    ("validator", "snippet"),
    [
        # top-level `name` is newer than compose 1.29
        ("docker-compose", "name: arbiter\nservices:\n  a:\n    image: redis:7\n"),
        # healthcheck start_interval is newer than compose 1.29
        (
            "docker-compose",
            "services:\n  a:\n    image: redis:7\n    healthcheck:\n"
            "      test: [CMD, 'true']\n      start_interval: 1s\n",
        ),
        # depends_on an undefined service (the schema alone does not catch this)
        (
            "docker-compose",
            "services:\n  a:\n    image: redis:7\n    depends_on:\n"
            "      b:\n        condition: service_healthy\n",
        ),
        # a misspelt key
        ("check-jsonschema", "services:\n  a:\n    image: redis:7\n    helthcheck: {}\n"),
    ],
    ids=["v1-top-level-name", "v1-start-interval", "v1-undefined-dependency", "schema-typo"],
)
def test_the_validators_reject_what_they_should(
    validator: str, snippet: str, tmp_path: Path
) -> None:
    bad = tmp_path / "compose.yml"
    bad.write_text(snippet)
    cmd = {
        "docker-compose": [tool("docker-compose"), "-f", str(bad), "config", "-q"],
        "check-jsonschema": [
            tool("check-jsonschema"),
            "--builtin-schema",
            "vendor.compose-spec",
            str(bad),
        ],
    }[validator]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, f"{validator} accepted a bad file:\n{snippet}"


def test_profiles_cpu_by_default_gpu_and_train_on_request(compose: dict[str, Any]) -> None:
    services = compose["services"]
    default = {n for n, s in services.items() if not s.get("profiles")}
    assert default == CPU_SERVICES, "`docker compose up` must start exactly the CPU services"
    for profile, names in PROFILES.items():
        got = {n for n, s in services.items() if profile in s.get("profiles", [])}
        assert got == names, f"profile {profile}: expected {names}, got {got}"


def test_start_order_is_gated_on_health(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on must use the long form with conditions"
        for dep, cond in deps.items():
            assert cond == {"condition": "service_healthy"}, f"{name} -> {dep}: {cond}"
            assert "healthcheck" in services[dep], f"{name} waits for {dep}: no healthcheck"
            # a service must not wait for one that its own profiles do not start
            dep_profiles = set(services[dep].get("profiles", []))
            if dep_profiles:
                assert dep_profiles & set(svc.get("profiles", [])), (
                    f"{name} depends on {dep}, which only starts with profile {dep_profiles}"
                )
    for name in set(services) - {"trainer"}:
        assert "healthcheck" in services[name], f"{name} has no healthcheck"


def test_gpu_services_reserve_nvidia_gpus(compose: dict[str, Any]) -> None:
    for name in ("vllm", "trainer"):
        devices = compose["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        expected = {"driver": "nvidia", "count": devices[0]["count"], "capabilities": ["gpu"]}
        assert devices == [expected], f"{name}: GPU reservation {devices}"
    vllm = compose["services"]["vllm"]
    args = dict(a.split("=", 1) for a in vllm["command"] if "=" in a)
    gpus = vllm["deploy"]["resources"]["reservations"]["devices"][0]["count"]
    assert int(args["--tensor-parallel-size"]) == gpus, "tensor parallel size != reserved GPUs"
    # the judge asks for the model by the name vLLM serves it under
    judge_env = compose_env(compose["services"]["judge"])
    assert substitute_default(args["--model"]) == substitute_default(judge_env["JUDGE_MODEL"] or "")
    assert "--served-model-name" not in args, "served name must stay the model id (JUDGE_MODEL)"
    for flag in ("--enable-prefix-caching", "--max-logprobs", "--structured-outputs-config"):
        assert any(a.split("=")[0] == flag for a in vllm["command"]), f"vllm lacks {flag}"


def test_volumes_for_redis_data_and_model_caches(compose: dict[str, Any]) -> None:
    services = compose["services"]
    declared = set(compose.get("volumes", {}))

    def mounts(name: str) -> dict[str, str]:
        out = {}
        for v in services[name].get("volumes", []):
            source, target = v.split(":")[:2]
            out[target] = source
        return out

    assert mounts("redis")["/data"] in declared
    assert mounts("state-redis")["/data"] in declared
    assert mounts("embedding")["/home/arbiter/.cache/huggingface"] in declared
    assert mounts("vllm")["/root/.cache/huggingface"] in declared
    named = {s for n in services for s in mounts(n).values() if not s.startswith((".", "/", "$"))}
    assert named == declared, f"volumes used {named} != declared {declared}"


def test_images_are_pinned(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        image = substitute_default(svc["image"])
        tag = image.rpartition(":")[2]
        assert ":" in image and tag != "latest" and re.search(r"\d", tag), f"{name}: {image}"


def test_env_example_lists_every_variable_with_its_default(compose: dict[str, Any]) -> None:
    text = COMPOSE.read_text()
    listed = env_example_names()
    read: dict[str, str] = {}  # every variable compose reads -> the default it shows
    for name in compose_variables(text):
        m = re.search(r"\$\{" + name + r"(?::?-([^}]*))?\}", text)
        read[name] = (m.group(1) if m else "") or ""
    for svc_name, svc in compose["services"].items():
        env = compose_env(svc)
        info = settings_info(svc_name) if svc_name in SERVICES else None
        for key, raw in env.items():
            if raw is not None:
                continue  # fixed, or ${...} (counted above)
            default = ""
            if info is not None:
                fields = [f for f, names in info.fields.items() if key in names]
                default = info.defaults[fields[0]] if fields else ""
            read.setdefault(key, default)
    missing = sorted(set(read) - set(listed))
    regen = "; regenerate it: .venv/bin/python -m tests.deploy.env_example"
    assert not missing, f".env.example lacks variables docker-compose.yml reads: {missing}{regen}"
    extra = sorted(set(listed) - set(read) - {"COMPOSE_PROFILES"})
    assert not extra, f".env.example lists variables compose never reads: {extra}{regen}"
    wrong = {k: (listed[k], v) for k, v in read.items() if listed[k] != v}
    assert not wrong, f".env.example shows other values than the defaults: {wrong}{regen}"


def test_recipes_file_loads_and_matches_the_configmap() -> None:
    compose_recipes = REPO / "docker" / "recipes.yaml"
    book = RecipeBook(compose_recipes)  # the gateway's own loader: raises on a bad file
    assert {"gsm8k-full", "gsm8k-math"} <= book.names
    configmap = yaml.safe_load((K8S / "base" / "recipes-configmap.yaml").read_text())
    assert yaml.safe_load(configmap["data"]["recipes.yaml"]) == yaml.safe_load(
        compose_recipes.read_text()
    ), "docker/recipes.yaml and the arbiter-recipes ConfigMap differ"


@pytest.mark.parametrize("service", SERVICES)
def test_compose_service_has_real_settings_and_its_settings_port(
    service: str, compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, info = compose["services"][service], settings_info(service)
    where = f"docker-compose.yml service {service}"
    port, path = healthcheck_url(svc["healthcheck"]["test"])
    assert (port, path in ("/healthz", "/readyz")) == (PORTS[service], True), where
    for published in svc.get("ports", []):
        assert substitute_default(published).rpartition(":")[2] == str(PORTS[service]), where
    env = compose_env(svc)
    assert not unknown_names(service, set(env)), f"{where}: {unknown_names(service, set(env))}"
    uncovered = [names[0] for f, names in info.configurable.items() if not set(names) & set(env)]
    assert not uncovered, (
        f"{where}: settings not passed through (add `- NAME` to environment, and regenerate "
        f".env.example): {uncovered}"
    )
    # the values compose sets by default, with container paths mapped to the repository
    values = {k: substitute_default(v) for k, v in env.items() if v is not None}
    values = {k: v for k, v in values.items() if v != ""}
    for mount in svc.get("volumes", []):
        source, target = substitute_default(mount).split(":")[:2]
        for k, v in values.items():
            if source.startswith(".") and (v == target or v.startswith(target + "/")):
                values[k] = str(REPO / source) + v[len(target) :]  # a file or one inside a dir
    check_settings(service, values, monkeypatch, where)


@pytest.mark.parametrize("service", SERVICES)
def test_env_example_values_are_accepted(
    service: str, compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every line of .env.example uncommented: the service accepts the values it shows.
    info = settings_info(service)
    values = {k: v for k, v in env_example_names().items() if k in info.env and v != ""}
    for k, v in compose_env(compose["services"][service]).items():
        if v is not None and "${" not in v:
            values[k] = v  # fixed by compose
    if "GATEWAY_RECIPES_FILE" in values:
        values["GATEWAY_RECIPES_FILE"] = str(REPO / "docker" / "recipes.yaml")
    if "GATEWAY_KEYS_FILE" in values:
        values["GATEWAY_KEYS_FILE"] = str(REPO / "docker" / "keys" / "keys.yaml")
    check_settings(service, values, monkeypatch, f".env.example ({service})")


def test_first_run_needs_no_env_loopback_only_and_auth_off(compose: dict[str, Any]) -> None:
    # `docker compose up` on a fresh clone: no variable is required, nothing but the
    # gateway is published, and that on the host's loopback only.
    assert ":?" not in COMPOSE.read_text(), "a variable compose refuses to start without"
    for name, svc in compose["services"].items():
        for port in svc.get("ports", []):
            # the gateway is the public API; monitoring UIs bind to the host's loopback only
            published = substitute_default(str(port))
            assert name in ("gateway", "prometheus", "grafana"), (name, port)
            assert published.startswith("127.0.0.1:"), (name, published)
    assert [substitute_default(p) for p in compose["services"]["gateway"]["ports"]] == [
        f"127.0.0.1:8000:{PORTS['gateway']}"
    ]
    env = compose_env(compose["services"]["gateway"])
    assert substitute_default(env["GATEWAY_ENVIRONMENT"] or "") == "production"
    assert substitute_default(env["GATEWAY_KEYS_FILE"] or "") == "", "auth is off by default"
    assert env["GATEWAY_KEY_SECRET"] is None, "passed through from .env, required by nobody"
    mounts = [substitute_default(m) for m in compose["services"]["gateway"]["volumes"]]
    assert "./docker/keys:/etc/arbiter/keys:ro" in mounts  # a directory: replaced files seen


def _gateway_values(compose: dict[str, Any], **extra: str) -> dict[str, str]:
    """The gateway's settings as compose sets them by default, paths mapped to the repo."""
    env = compose_env(compose["services"]["gateway"])
    values = {k: substitute_default(v) for k, v in env.items() if v is not None}
    values = {k: v for k, v in values.items() if v != ""}
    values["GATEWAY_RECIPES_FILE"] = str(REPO / "docker" / "recipes.yaml")
    values.update(extra)
    if values.get("GATEWAY_KEYS_FILE") == KEYS_FILE_IN_COMPOSE:
        values["GATEWAY_KEYS_FILE"] = str(REPO / "docker" / "keys" / "keys.yaml")
    return values


@pytest.mark.parametrize(
    "secret",
    [None, "", "changeme", DEV_SECRET, "x" * 31],
    ids=["unset", "empty", "placeholder", "development", "short"],
)
def test_one_setting_turns_auth_on_and_a_placeholder_secret_is_refused(
    compose: dict[str, Any], secret: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what docs/deploy/compose.md and .env.example tell a shared deployment to set
    docs = (REPO / "docs" / "deploy" / "compose.md").read_text()
    assert f"GATEWAY_KEYS_FILE={KEYS_FILE_IN_COMPOSE}" in docs
    assert f"# Auth on (one setting): GATEWAY_KEYS_FILE={KEYS_FILE_IN_COMPOSE}" in (
        ENV_EXAMPLE.read_text()
    )
    on = {"GATEWAY_KEYS_FILE": KEYS_FILE_IN_COMPOSE}
    if secret is not None:
        on["GATEWAY_KEY_SECRET"] = secret
    with pytest.raises(pytest.fail.Exception, match="GATEWAY_KEY_SECRET"):
        check_settings("gateway", _gateway_values(compose, **on), monkeypatch, "auth on")
    # and a real secret starts it, with auth on; without the setting, auth is off
    real = {**on, "GATEWAY_KEY_SECRET": "9f" * 32}
    check_settings("gateway", _gateway_values(compose, **real), monkeypatch, "auth on")
    check_settings("gateway", _gateway_values(compose), monkeypatch, "first run")


def test_build_arguments_default_to_the_dockerfiles(compose: dict[str, Any]) -> None:
    # compose's build arguments (ARBITER_PYTHON_IMAGE, ...) default to the Dockerfiles' ARGs
    dockerfiles = {
        "docker/Dockerfile": (REPO / "docker" / "Dockerfile").read_text(),
        "docker/vllm-cpu.Dockerfile": (REPO / "docker" / "vllm-cpu.Dockerfile").read_text(),
    }
    seen = 0
    for name, svc in compose["services"].items():
        build = svc.get("build")
        if not isinstance(build, dict):
            continue
        text = dockerfiles[build["dockerfile"]]
        for arg, value in (build.get("args") or {}).items():
            m = re.search(rf"^ARG {arg}=(\S+)$", text, re.M)
            assert m, f"{name}: build argument {arg} is not an ARG of {build['dockerfile']}"
            assert substitute_default(value) == m.group(1), (name, arg, value, m.group(1))
            seen += 1
    assert seen >= 5


def test_the_sandbox_gets_only_the_privileges_bwrap_needs(compose: dict[str, Any]) -> None:
    # Measured with Docker 20.10 (docs/deploy/compose.md): bubblewrap needs no capability,
    # but user namespaces (seccomp), a /proc of its own (systempaths) and, on AppArmor
    # hosts, mounts (apparmor). Nothing else is lifted, and only for the sandbox.
    services = compose["services"]
    sandbox = services["sandbox"]
    assert sandbox["cap_drop"] == ["ALL"] and "cap_add" not in sandbox
    assert not sandbox.get("privileged") and sandbox["read_only"] is True
    assert sorted(sandbox["security_opt"]) == [
        "apparmor=unconfined",
        "no-new-privileges:true",
        "seccomp=unconfined",
        "systempaths=unconfined",
    ]
    for name, svc in services.items():
        if name != "sandbox":
            lifted = [o for o in svc.get("security_opt", []) if "unconfined" in o]
            assert not lifted, f"{name}: {lifted}"
    # its own internal network (no route out), joined by the gateway, the envs service (its
    # python and code environments) and Prometheus only; no port on the host
    assert sandbox["networks"] == ["sandbox"] and "ports" not in sandbox
    assert compose["networks"]["sandbox"] == {"internal": True}
    joined = {n for n, s in services.items() if "sandbox" in (s.get("networks") or [])}
    assert joined == {"sandbox", "gateway", "envs", "prometheus"}, joined
    # the gateway scores the code recipes on a fresh `docker compose up`
    url = compose_env(services["gateway"])["GATEWAY_SANDBOX_URL"] or ""
    assert substitute_default(url) == f"http://sandbox:{PORTS['sandbox']}"
