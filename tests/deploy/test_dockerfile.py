"""docker/Dockerfile: every service image runs ``arbiter serve NAME`` (its port is the
service's own setting), installs only its own extra, runs as a user, and publishes and
probes that port; the trainer image and compose's trainer command name real config."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from arbiter.serve import SERVICES
from tests.deploy.deployfiles import (
    DOCKERFILE,
    PORTS,
    REPO,
    load_compose,
    substitute_default,
    unknown_names,
)

# The image stages of each service (embedding has a CUDA and a CPU build).
STAGES = {s: [s] for s in SERVICES} | {"embedding": ["embedding", "embedding-cpu"]}
IMAGE_ENV = re.compile(r"^(PYTHON\w*|PIP_\w+|HF_\w+)$")  # not service settings


def stages() -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its (KEYWORD, rest) instructions, continuation lines joined."""
    out: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for raw in re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text()).splitlines():
        keyword, _, rest = raw.strip().partition(" ")
        if keyword == "FROM":
            current = out.setdefault(rest.split()[-1], [])
            current.append(("FROM", rest.split()[0]))
        elif keyword and not keyword.startswith("#"):
            current.append((keyword, rest.strip()))
    return out


def _chain(all_stages: dict[str, list[tuple[str, str]]], name: str) -> list[tuple[str, str]]:
    """The stage's instructions after those of the stages it is built FROM."""
    own = all_stages[name]
    base = own[0][1]
    return (_chain(all_stages, base) if base in all_stages else []) + own


@pytest.mark.parametrize("service", SERVICES)
def test_service_images_run_arbiter_serve_on_the_settings_port(service: str) -> None:
    all_stages = stages()
    port = PORTS[service]
    for name in STAGES[service]:
        where = f"docker/Dockerfile stage {name}"
        chain = _chain(all_stages, name)
        last = {kw: rest for kw, rest in chain}  # the instruction in force
        assert json.loads(last["CMD"]) == ["arbiter", "serve", service], f"{where}: CMD"
        assert last["EXPOSE"] == str(port), f"{where}: EXPOSE"
        assert f"http://127.0.0.1:{port}/healthz" in last["HEALTHCHECK"], f"{where}: HEALTHCHECK"
        env = dict(
            token.split("=", 1) for kw, rest in chain if kw == "ENV" for token in rest.split()
        )
        settings = {k for k in env if not IMAGE_ENV.match(k)}
        assert settings == {f"{service.upper()}_HOST"}, f"{where}: ENV {settings}"
        assert env[f"{service.upper()}_HOST"] == "0.0.0.0", f"{where}: binds only loopback"
        assert not unknown_names(service, settings), where
        installs = " ".join(rest for kw, rest in all_stages[name] if kw == "RUN")
        extras = set(re.findall(r"arbiter\*\.whl\)\[([\w,]+)\]", installs))
        assert extras == {service}, f"{where}: installs extras {extras}, not just [{service}]"
        # the dependencies' own layer (docker/deps.py) installs the same extra's
        deps = set(re.findall(r"deps\.py /deps/pyproject\.toml (\w+)", installs))
        assert deps == {service}, f"{where}: dependency layer of {deps}, not [{service}]"
        users = [rest for kw, rest in chain if kw == "USER"]
        assert users and users[-1].split(":")[0] not in ("0", "root"), f"{where}: USER {users}"


def test_trainer_image_and_compose_command_name_real_config() -> None:
    from arbiter.trainer.config import TrainerConfig

    trainer = dict(stages()["trainer"])
    assert json.loads(trainer["ENTRYPOINT"]) == ["python", "-m", "arbiter.trainer"]
    image_cmd = json.loads(trainer["CMD"])
    assert image_cmd[0] == "--config" and (REPO / image_cmd[1]).is_file(), image_cmd
    assert trainer["HEALTHCHECK"] == "NONE", "a batch job has no health endpoint"
    command = [substitute_default(c) for c in load_compose()["services"]["trainer"]["command"]]
    assert command[0] == "--config" and (REPO / command[1]).is_file(), command
    yaml.safe_load((REPO / command[1]).read_text())
    fields = {f.name for f in dataclasses.fields(TrainerConfig)}
    overrides = dict(c.split("=", 1) for c in command[2:])
    assert set(overrides) <= fields, f"unknown trainer settings {set(overrides) - fields}"
    assert overrides["gateway_url"] == f"http://gateway:{PORTS['gateway']}"


DOCKERFILES = [
    DOCKERFILE,
    REPO / "docker" / "vllm-cpu.Dockerfile",
    *sorted((REPO / "docker" / "bases").glob("*.Dockerfile")),
]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_classic_builder_and_no_registry_beyond_the_base_arguments(path: Path) -> None:
    # BuildKit fetches a `# syntax=` frontend from Docker Hub; `make images` builds with the
    # classic builder (DOCKER_BUILDKIT=0), which knows no --mount, --link or heredocs.
    text = path.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I), f"{path.name}: syntax line"
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        keyword, _, rest = line.strip().partition(" ")
        if keyword in ("RUN", "COPY", "ADD"):
            assert not re.search(r"--mount|--link|<<", rest), f"{path.name}: {line}"
        if keyword == "FROM":
            # every base is a build argument, or an earlier stage
            image = rest.split()[0]
            stages = re.findall(r"^FROM \S+ AS (\S+)", joined, re.M)
            assert image.startswith("${") or image in stages, f"{path.name}: FROM {image}"


@pytest.mark.parametrize("path", DOCKERFILES[:2], ids=lambda p: p.name)
def test_every_pip_install_follows_the_lock(path: Path) -> None:
    joined = re.sub(r"\\\n\s*", " ", path.read_text())
    installs = re.findall(r"pip install([^&;]*)", joined)
    assert installs
    for args in installs:
        assert "-c /constraints.txt" in args, f"{path.name}: pip install{args} (no lock)"
    lock = {"Dockerfile": "constraints.txt", "vllm-cpu.Dockerfile": "vllm-cpu.txt"}[path.name]
    assert f"COPY requirements/{lock} /constraints.txt" in joined
    assert (REPO / "requirements" / lock).is_file()


def test_dockerignore_sends_every_file_the_images_copy() -> None:
    # The classic builder reads only the context root's .dockerignore; every COPY source
    # must survive it (an excluded one fails the build).
    rules = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", "send nothing but what is listed"
    allowed = [r[1:].rstrip("/") for r in rules if r.startswith("!")]
    for path in DOCKERFILES[:2]:
        joined = re.sub(r"\\\n\s*", " ", path.read_text())
        for m in re.finditer(r"^COPY (?!--from)(.+)$", joined, re.M):
            *sources, _ = m.group(1).split()
            for source in sources:
                src = source.rstrip("/")
                assert any(src == a or src.startswith(a + "/") for a in allowed), (
                    f"{path.name}: COPY {source} is excluded by .dockerignore"
                )
                assert (REPO / src).exists(), f"{path.name}: COPY {source}: no such path"
