"""Readers for the deployment files, shared by the tests in tests/deploy/.

No Docker engine or cluster runs here, so the files are read as data: docker-compose.yml
as YAML, the kustomize tree rendered by real kustomize (``kubectl kustomize``), and each
service's settings class read for its env var names and defaults.
"""

from __future__ import annotations

import difflib
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices, ValidationError

from arbiter.serve import SERVICES, default_port, settings_class

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
COMPOSE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
K8S = REPO / "k8s"
OVERLAYS = ("dev", "prod")
# Every service's port, from its settings class (the one place it is written down).
PORTS: dict[str, int] = {name: default_port(name) for name in SERVICES}
# Variables a service container may carry that are not its settings: the Hugging Face
# libraries read these themselves.
LIBRARY_ENV = frozenset({"HF_HUB_OFFLINE", "HF_HOME", "HF_TOKEN", "TRANSFORMERS_OFFLINE"})
# Kubernetes' downward API, read by a setting's value (the sandbox's SANDBOX_SESSION_URL)
LIBRARY_ENV |= {"POD_IP"}

URL_RE = re.compile(r"https?://(?:127\.0\.0\.1|localhost):(\d+)(/[\w/.-]*)")


# --- settings classes --------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceSettingsInfo:
    service: str
    cls_name: str
    port: int
    # field name -> the env var names that set it (upper case; an alias first, then the
    # prefixed name when the class also populates by name)
    fields: dict[str, tuple[str, ...]]
    descriptions: dict[str, str]
    defaults: dict[str, str]

    @property
    def env(self) -> frozenset[str]:
        """Every env var name the class reads."""
        return frozenset(n for names in self.fields.values() for n in names)

    @property
    def configurable(self) -> dict[str, tuple[str, ...]]:
        """Fields a deployment may set: all but host and port, which the image fixes."""
        return {k: v for k, v in self.fields.items() if k not in ("host", "port")}


def settings_info(service: str) -> ServiceSettingsInfo:
    cls = settings_class(service)
    prefix = str(cls.model_config.get("env_prefix", ""))
    populate = bool(cls.model_config.get("populate_by_name", False))
    fields: dict[str, tuple[str, ...]] = {}
    descriptions: dict[str, str] = {}
    defaults: dict[str, str] = {}
    for name, info in cls.model_fields.items():
        alias = info.validation_alias
        names: list[str] = []
        if isinstance(alias, str):
            names.append(alias.upper())
        elif isinstance(alias, AliasChoices):
            names.extend(c.upper() for c in alias.choices if isinstance(c, str))
        if alias is None or populate:
            names.append((prefix + name).upper())
        fields[name] = tuple(dict.fromkeys(names))
        descriptions[name] = " ".join((info.description or "").split())
        defaults[name] = _env_default(info)
    port = cls.model_fields["port"].default
    assert isinstance(port, int), f"{cls.__name__}.port has no integer default"
    return ServiceSettingsInfo(service, cls.__name__, port, fields, descriptions, defaults)


def unknown_names(service: str, names: set[str]) -> list[str]:
    """Names the service's settings class does not read, each with the closest known one.

    The classes ignore unknown variables (extra="ignore"), so a typo in a deployment file
    would otherwise be dropped silently.
    """
    info = settings_info(service)
    out = []
    for name in sorted(names - info.env - LIBRARY_ENV):
        close = difflib.get_close_matches(name, sorted(info.env), n=1)
        out.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return out


def check_settings(
    service: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The service's settings built from ``env`` alone accept it (validators included);
    the port is left to the settings' default (the deployment files publish that one)."""
    info = settings_info(service)
    assert not (set(env) & set(info.fields["port"])), f"{where}: sets the port; leave it"
    with monkeypatch.context() as mp:
        for name in info.env:
            mp.delenv(name, raising=False)
        for name, value in env.items():
            mp.setenv(name, value)
        try:
            settings_class(service)()
        except ValidationError as exc:
            pytest.fail(f"{where}: {info.cls_name} rejects the deployed values {env}:\n{exc}")


def _env_default(info: Any) -> str:
    """The default as it would be written in an env file ('' for none or computed)."""
    if info.default_factory is not None:
        return ""
    value = info.default
    if value is None:
        return ""
    if hasattr(value, "get_secret_value"):
        return ""  # a secret's default (the development one) is never one to write down
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


# --- compose -----------------------------------------------------------------------------


def load_compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def compose_env(service: dict[str, Any]) -> dict[str, str | None]:
    """environment as {NAME: raw value or None for a pass-through}."""
    env = service.get("environment") or []
    if isinstance(env, dict):
        return {k: (None if v is None else str(v)) for k, v in env.items()}
    out: dict[str, str | None] = {}
    for item in env:
        key, sep, value = str(item).partition("=")
        out[key] = value if sep else None
    return out


def substitute_default(value: str) -> str:
    """`${VAR:-default}` → default (the value compose uses when .env does not set VAR);
    `${VAR:?why}` (compose refuses to start without it) → a stand-in for the user's value."""
    value = re.sub(r"\$\{(\w+):\?[^}]*\}", lambda m: f"{USER_GIVEN}{m.group(1)}", value)
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", value)


USER_GIVEN = "given-by-the-user-in-env:"  # long enough for a secret


def compose_variables(text: str) -> set[str]:
    return set(re.findall(r"\$\{(\w+)", text))


def healthcheck_url(test: list[str] | str) -> tuple[int, str]:
    joined = test if isinstance(test, str) else " ".join(test)
    m = URL_RE.search(joined)
    assert m, f"no http://127.0.0.1:PORT/PATH in healthcheck {joined!r}"
    return int(m.group(1)), m.group(2)


# --- .env.example ------------------------------------------------------------------------


def env_example_names(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """NAME -> value for lines `NAME=value` and commented `# NAME=value`."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = re.fullmatch(r"#?\s*([A-Z][A-Z0-9_]*)=(.*)", line.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


# --- kustomize ---------------------------------------------------------------------------


def kustomization(directory: Path) -> dict[str, Any]:
    doc = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert isinstance(doc, dict), f"{directory}/kustomization.yaml is not a mapping"
    return doc


def kustomize(directory: Path, kubectl: str) -> list[dict[str, Any]]:
    """The resources ``kubectl kustomize DIR`` renders (real kustomize, built into kubectl)."""
    proc = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def pod_containers(resource: dict[str, Any]) -> list[dict[str, Any]]:
    spec = resource.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", [])) + list(spec.get("initContainers", []))


def by_kind_name(resources: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in resources:
        key = (r["kind"], r["metadata"]["name"])
        assert key not in out, f"duplicate resource {key}"
        out[key] = r
    return out


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command/args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def container_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
