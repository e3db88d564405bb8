"""Readers for the deployment files, shared by the tests in tests/deploy/.

No Docker engine or cluster runs here, so the files are read as data: the Dockerfile split
into stages, docker-compose.yml as YAML, the kustomize tree rendered by a small renderer
that supports exactly the kustomize features k8s/ uses (and refuses any other, so a new
feature cannot slip past the checks unrendered), and each service's settings class read
for its env var names and port.
"""

from __future__ import annotations

import copy
import importlib
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
COMPOSE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
K8S = REPO / "k8s"
OVERLAYS = ("dev", "prod")

# The HTTP services and their ports (the contract in the brief and DESIGN.md).
SERVICES: dict[str, int] = {"gateway": 8000, "verify": 8001, "embedding": 8002, "judge": 8003}
# Variables a service container may carry that are not its settings: the Hugging Face
# libraries read these themselves.
LIBRARY_ENV = frozenset({"HF_HUB_OFFLINE", "HF_HOME", "HF_TOKEN", "TRANSFORMERS_OFFLINE"})

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


def settings_class(service: str) -> type[Any]:
    """The ServiceSettings subclass defined in services/<service>/settings.py."""
    from arbiter.services.common.settings import ServiceSettings

    module = importlib.import_module(f"arbiter.services.{service}.settings")
    classes = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, ServiceSettings)
        and obj is not ServiceSettings
        and obj.__module__ == module.__name__
    ]
    assert len(classes) == 1, (
        f"services/{service}/settings.py should define exactly one ServiceSettings subclass, "
        f"found {[c.__name__ for c in classes]}"
    )
    return classes[0]


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


def _env_default(info: Any) -> str:
    """The default as it would be written in an env file ('' for none or computed)."""
    if info.default_factory is not None:
        return ""
    value = info.default
    if value is None:
        return ""
    if hasattr(value, "get_secret_value"):
        return str(value.get_secret_value())
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


# --- Dockerfile --------------------------------------------------------------------------


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, rest)

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for rest in self.all("ENV"):
            for token in shlex.split(rest):
                key, sep, value = token.partition("=")
                assert sep, f"stage {self.name}: use ENV KEY=VALUE, not {rest!r}"
                out[key] = value
        return out

    def exec_form(self, keyword: str) -> list[str]:
        """The last CMD/ENTRYPOINT/HEALTHCHECK CMD in exec (JSON) form."""
        found = self.all(keyword)
        assert found, f"stage {self.name} has no {keyword}"
        rest = found[-1]
        if keyword == "HEALTHCHECK":
            rest = rest[rest.index("CMD ") + 4 :] if "CMD " in rest else rest
        value = json.loads(rest)
        assert isinstance(value, list), f"stage {self.name}: {keyword} must be in exec form"
        return [str(v) for v in value]


def dockerfile_stages(path: Path = DOCKERFILE) -> tuple[dict[str, str], dict[str, Stage]]:
    """(global ARGs, stages by name), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = " ".join(rest.split())
        if keyword == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest, flags=re.IGNORECASE)
            assert m, f"every FROM names its stage (FROM image AS name): {line!r}"
            current = Stage(m.group(2), m.group(1))
            stages[current.name] = current
        elif current is None:
            assert keyword == "ARG", f"only ARG may come before the first FROM: {line!r}"
            key, _, value = rest.partition("=")
            args[key] = value
        else:
            current.instructions.append((keyword, rest))
    return args, stages


def stage_chain(stages: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and the stages it is built FROM, nearest first."""
    chain = [stages[name]]
    while chain[-1].base in stages:
        chain.append(stages[chain[-1].base])
    return chain


def resolve_base(args: dict[str, str], base: str) -> str:
    m = re.fullmatch(r"\$\{?(\w+)\}?", base)
    return args.get(m.group(1), base) if m else base


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
    """`${VAR:-default}` → default (the value compose uses when .env does not set VAR)."""
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", value)


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

CLUSTER_SCOPED = frozenset({"Namespace", "PersistentVolume", "ClusterRole", "ClusterRoleBinding"})
# Lists that strategic merge patches merge by key (the subset k8s/ patches).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}
SUPPORTED = frozenset(
    {"apiVersion", "kind", "resources", "namespace", "labels", "images", "replicas", "patches"}
)


def kustomization(directory: Path) -> dict[str, Any]:
    doc = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert isinstance(doc, dict), f"{directory}/kustomization.yaml is not a mapping"
    return doc


def strategic_merge(base: Any, patch: Any, key: str = "") -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = strategic_merge(out[k], v, k)
            else:
                out[k] = copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        mk = MERGE_KEYS[key]
        out_list = [copy.deepcopy(item) for item in base]
        for item in patch:
            index = next((i for i, b in enumerate(out_list) if b.get(mk) == item.get(mk)), None)
            if index is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[index] = strategic_merge(out_list[index], item)
        return out_list
    return copy.deepcopy(patch)


def pod_containers(resource: dict[str, Any]) -> list[dict[str, Any]]:
    spec = resource.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", [])) + list(spec.get("initContainers", []))


def render(directory: Path) -> list[dict[str, Any]]:
    """Render a kustomization the way `kubectl kustomize` does, for the features used here."""
    k = kustomization(directory)
    unsupported = set(k) - SUPPORTED
    assert not unsupported, (
        f"{directory}/kustomization.yaml uses {sorted(unsupported)}, which "
        "tests/deploy/deployfiles.py's renderer does not implement; extend render() "
        "(and the kubectl cross-check will compare it with kustomize)"
    )
    out: list[dict[str, Any]] = []
    for entry in k.get("resources", []):
        path = directory / entry
        if path.is_dir():
            out.extend(render(path))
        else:
            out.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    for patch in k.get("patches", []):
        assert set(patch) == {"patch"}, f"{directory}: only inline `patch:` entries are rendered"
        doc = yaml.safe_load(patch["patch"])
        target = [
            i
            for i, r in enumerate(out)
            if r["kind"] == doc["kind"] and r["metadata"]["name"] == doc["metadata"]["name"]
        ]
        assert len(target) == 1, (
            f"{directory}: patch for {doc['kind']}/{doc['metadata']['name']} matches "
            f"{len(target)} resources"
        )
        if doc.get("$patch") == "delete":
            del out[target[0]]
        else:
            out[target[0]] = strategic_merge(out[target[0]], doc)
    for label in k.get("labels", []):
        assert not label.get("includeSelectors") and not label.get("includeTemplates"), (
            f"{directory}: labels with includeSelectors/includeTemplates are not rendered"
        )
        for r in out:
            r.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    for rep in k.get("replicas", []):
        hits = [
            r
            for r in out
            if r["kind"] in ("Deployment", "StatefulSet") and r["metadata"]["name"] == rep["name"]
        ]
        assert hits, f"{directory}: replicas entry {rep['name']!r} matches no workload"
        for r in hits:
            r["spec"]["replicas"] = rep["count"]
    for image in k.get("images", []):
        changed = 0
        for r in out:
            for c in pod_containers(r):
                name, _, tag = c["image"].partition(":")
                if name == image["name"]:
                    changed += 1
                    c["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
        assert changed, f"{directory}: images entry {image['name']!r} matches no container"
    if "namespace" in k:
        for r in out:
            if r["kind"] not in CLUSTER_SCOPED:
                r["metadata"]["namespace"] = k["namespace"]
    return out


def canonical(value: Any) -> Any:
    """Order-insensitive form for comparing renders (kustomize reorders merged lists)."""
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        items = [canonical(v) for v in value]
        if items and all(isinstance(v, dict) and "name" in v for v in items):
            return sorted(items, key=lambda v: str(v["name"]))
        return items
    return value


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
