"""k8s/: each kustomization rendered by real kustomize (``kubectl kustomize``) and the render
valid (kubernetes-validate --strict); every manifest listed; the rendered resources
consistent (selectors, ports, references, GPUs, autoscaling, security) and their service
settings real: every env name is a setting the service reads, every value one it accepts,
and every port the one its settings give."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from arbiter.serve import SERVICES
from tests.deploy.deployfiles import (
    K8S,
    OVERLAYS,
    PORTS,
    by_kind_name,
    check_settings,
    container_env,
    expand,
    kustomization,
    kustomize,
    pod_containers,
    unknown_names,
)
from tests.deploy.tools import run, tool

KUSTOMIZE_DIRS = sorted(p.parent for p in K8S.rglob("kustomization.yaml"))
TARGETS = ["base", *(f"overlays/{o}" for o in OVERLAYS)]
HPA_FOR = {"gateway", "verify", "embedding", "sandbox"}
# Secrets an overlay expects to exist already (created out of band, never rendered).
EXTERNAL_SECRETS = {"overlays/prod": {"arbiter-api-keys", "arbiter-gateway-keys"}}
GPU = "nvidia.com/gpu"


def rel(path: Path) -> str:
    return str(path.relative_to(K8S.parent))


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    kubectl = tool("kubectl")
    return {t: by_kind_name(kustomize(K8S / t, kubectl)) for t in TARGETS}


def test_the_tree_has_base_and_both_overlays() -> None:
    # k8s/monitoring: the ServiceMonitor (tests/deploy/test_monitoring.py checks it)
    assert [rel(d) for d in KUSTOMIZE_DIRS] == [
        "k8s/base",
        "k8s/monitoring",
        "k8s/overlays/dev",
        "k8s/overlays/prod",
    ]


@pytest.mark.parametrize("target", TARGETS)
def test_kustomize_render_passes_kubernetes_validate_strict(
    target: str, rendered: Any, tmp_path: Path
) -> None:
    out = tmp_path / "rendered.yaml"
    out.write_text(yaml.safe_dump_all(list(rendered[target].values()), sort_keys=False))
    run([tool("kubernetes-validate"), "--strict", "--quiet", str(out)], f"render of {target}")


def test_the_validator_rejects_what_it_should(tmp_path: Path) -> None:
    # A misspelt field in a rendered Deployment: --strict must refuse it, or the check
    # above proves nothing.
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: x}\n"
        "spec: {ports: [{port: 80}], selectr: {a: b}}\n"
    )
    proc = subprocess.run(
        [tool("kubernetes-validate"), "--strict", "--quiet", str(bad)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0, "kubernetes-validate --strict accepted a misspelt field"


@pytest.mark.parametrize("directory", KUSTOMIZE_DIRS, ids=rel)
def test_kustomization_lists_existing_files_and_every_manifest(directory: Path) -> None:
    resources = kustomization(directory).get("resources", [])
    for entry in resources:
        path = (directory / entry).resolve()
        assert path.exists(), f"{rel(directory)}/kustomization.yaml lists missing {entry}"
        if path.is_dir():
            assert (path / "kustomization.yaml").exists(), f"{entry} is not a kustomization"
    listed = {(directory / e).resolve() for e in resources}
    unlisted = [
        p.name
        for p in sorted(directory.glob("*.yaml"))
        if p.name != "kustomization.yaml" and p.resolve() not in listed
    ]
    assert not unlisted, f"{rel(directory)}: manifests not in kustomization.yaml: {unlisted}"


def _workloads(res: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for (kind, _), r in res.items() if kind in ("Deployment", "StatefulSet")]


def _pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("target", TARGETS)
def test_workloads_are_secure_probed_and_bounded(target: str, rendered: Any) -> None:
    for w in _workloads(rendered[target]):
        name = w["metadata"]["name"]
        assert w["spec"]["selector"]["matchLabels"].items() <= _pod_labels(w).items(), name
        pod = w["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, f"{name}: runAsNonRoot"
        assert pod["securityContext"]["runAsUser"] != 0, f"{name}: runAsUser 0"
        assert pod.get("automountServiceAccountToken") is False, f"{name}: token mounted"
        for c in pod_containers(w):
            where = f"{target} {name}/{c['name']}"
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            for probe in ("livenessProbe", "readinessProbe"):
                assert probe in c, f"{where}: no {probe}"
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), f"{where}: {kind}"
            req, lim = c["resources"]["requests"], c["resources"]["limits"]
            assert req.get(GPU) == lim.get(GPU), f"{where}: GPU request != limit"
            image = c["image"]
            assert ":" in image and not image.endswith(":latest"), f"{where}: {image}"


@pytest.mark.parametrize("target", TARGETS)
def test_services_select_pods_and_name_real_ports(target: str, rendered: Any) -> None:
    res = rendered[target]
    workloads = _workloads(res)
    for (kind, name), svc in res.items():
        if kind != "Service":
            continue
        matches = [w for w in workloads if _selects(svc["spec"]["selector"], _pod_labels(w))]
        assert len(matches) == 1, f"Service {name} selects {len(matches)} workloads"
        containers = pod_containers(matches[0])
        ports = {p.get("name"): p["containerPort"] for c in containers for p in c["ports"]}
        for port in svc["spec"]["ports"]:
            target_port = port["targetPort"]
            number = ports.get(target_port) if isinstance(target_port, str) else target_port
            assert number == port["port"], f"Service {name}: {port} vs container ports {ports}"


@pytest.mark.parametrize("target", TARGETS)
def test_references_resolve(target: str, rendered: Any) -> None:
    res = rendered[target]
    for w in _workloads(res):
        pod = w["spec"]["template"]["spec"]
        for vol in pod.get("volumes", []):
            if "configMap" in vol:
                assert ("ConfigMap", vol["configMap"]["name"]) in res, vol
            if "persistentVolumeClaim" in vol:
                assert ("PersistentVolumeClaim", vol["persistentVolumeClaim"]["claimName"]) in res
        for c in pod_containers(w):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["name"] in EXTERNAL_SECRETS.get(target, set()):
                    assert ("Secret", ref["name"]) not in res, f"{target} renders {ref['name']}"
                elif ref:
                    secret = res[("Secret", ref["name"])]
                    assert ref["key"] in secret.get("stringData", secret.get("data", {})), e
            mounts = {m["name"] for m in c.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in pod.get("volumes", [])} | {
                t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])
            }, f"{w['metadata']['name']}: mounts {mounts}"
    urls = {
        (w["metadata"]["name"], k): v
        for w in _workloads(res)
        for c in pod_containers(w)
        for k, v in container_env(c).items()
        if re.match(r"(https?|redis)://", v)
    }
    services = {
        (name, p["port"]) for (kind, name), s in res.items() if kind == "Service"
        for p in s["spec"]["ports"]
    }  # fmt: skip
    for (owner, key), url in urls.items():
        if url.startswith("http://$(POD_IP):"):  # a pod's own address (SANDBOX_SESSION_URL)
            continue
        m = re.match(r"\w+://([\w.-]+):(\d+)", url)
        assert m and (m.group(1), int(m.group(2))) in services, (
            f"{target}: {owner} {key}={url} names no Service:port in {sorted(services)}"
        )


@pytest.mark.parametrize("target", TARGETS)
def test_autoscaling_and_disruption_budgets(target: str, rendered: Any) -> None:
    res = rendered[target]
    hpas = {name: r for (kind, name), r in res.items() if kind == "HorizontalPodAutoscaler"}
    assert set(hpas) == HPA_FOR, f"HPAs: {sorted(hpas)}"
    for name, hpa in hpas.items():
        assert hpa["apiVersion"] == "autoscaling/v2"
        ref = hpa["spec"]["scaleTargetRef"]
        deployment = res[(ref["kind"], ref["name"])]
        lo, hi = hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]
        assert 1 <= lo <= hi, f"HPA {name}: {lo}..{hi}"
        assert deployment["spec"]["replicas"] == lo, f"{name}: replicas != HPA minReplicas"
    pdbs = [r for (kind, _), r in res.items() if kind == "PodDisruptionBudget"]
    for w in _workloads(res):
        if w["kind"] != "Deployment":
            continue
        labels = _pod_labels(w)
        covering = [p for p in pdbs if _selects(p["spec"]["selector"]["matchLabels"], labels)]
        assert len(covering) == 1, f"{w['metadata']['name']}: {len(covering)} PDBs"


def _container(res: dict[tuple[str, str], Any], name: str) -> dict[str, Any]:
    return pod_containers(res[("Deployment", name)])[0]


@pytest.mark.parametrize("target", TARGETS)
def test_gpus_parallelism_and_judge_model_agree(target: str, rendered: Any) -> None:
    res = rendered[target]
    vllm = _container(res, "vllm")
    env = container_env(vllm)
    args = dict(expand(a, env).split("=", 1) for a in vllm["args"] if "=" in a)
    assert "$(" not in " ".join(args.values()), f"unexpanded variable in vllm args: {args}"
    gpus = vllm["resources"]["limits"][GPU]
    assert int(args["--tensor-parallel-size"]) == gpus, "tensor parallel size != GPUs"
    judge = container_env(_container(res, "judge"))
    assert judge["JUDGE_MODEL"] == args["--model"], "judge asks for a model vLLM does not serve"
    assert judge["JUDGE_BASE_URL"] == f"http://vllm:{args['--port']}/v1"
    for flag in ("--enable-prefix-caching", "--max-logprobs", "--structured-outputs-config"):
        assert any(a.split("=")[0] == flag for a in vllm["args"]), f"vllm lacks {flag}"
    embedding = _container(res, "embedding")
    on_gpu = GPU in embedding["resources"]["limits"]
    device = container_env(embedding)["EMBEDDING_DEVICE"]
    assert (device == "cuda") == on_gpu, f"EMBEDDING_DEVICE={device} with GPU={on_gpu}"
    cpu_image = embedding["image"].rpartition(":")[0].endswith("embedding-cpu")
    assert cpu_image != on_gpu, f"{embedding['image']} (the CPU build?) with GPU={on_gpu}"
    verify = _container(res, "verify")
    workers = int(container_env(verify)["VERIFY_WORKERS"])
    assert workers == int(verify["resources"]["limits"]["cpu"]), "VERIFY_WORKERS != CPU limit"


def test_dev_runs_one_replica_of_small_models(rendered: Any) -> None:
    res = rendered["overlays/dev"]
    assert all(w["spec"]["replicas"] == 1 for w in _workloads(res))
    assert container_env(_container(res, "judge"))["JUDGE_MODEL"] == "Qwen/Qwen3-0.6B"
    assert "EMBEDDING_MODEL" not in container_env(_container(res, "embedding"))  # MiniLM
    assert {r["metadata"].get("namespace") for (k, _), r in res.items() if k != "Namespace"} == {
        "arbiter-dev"
    }


def test_prod_runs_the_large_models_with_more_replicas(rendered: Any) -> None:
    res, base = rendered["overlays/prod"], rendered["base"]
    judge = container_env(_container(res, "judge"))
    assert judge["JUDGE_MODEL"] == "Qwen/Qwen3-32B"
    assert _container(res, "vllm")["resources"]["limits"][GPU] >= 2, "32B judge: TP >= 2"
    emb = container_env(_container(res, "embedding"))
    assert emb["EMBEDDING_MODEL"] == "Alibaba-NLP/gte-Qwen2-1.5B-instruct"
    assert emb["EMBEDDING_TRUST_REMOTE_CODE"] == "true", "GTE-Qwen2 needs trust_remote_code"
    for w in _workloads(res):
        key = (w["kind"], w["metadata"]["name"])
        if key not in {("StatefulSet", "redis"), ("StatefulSet", "state-redis")}:
            assert w["spec"]["replicas"] > base[key]["spec"]["replicas"] or key[1] == "vllm"
    for w in _workloads(res):
        for c in pod_containers(w):
            if c["image"].startswith("arbiter/"):
                pytest.fail(f"prod pulls {c['image']} from no registry")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("service", SERVICES)
def test_deployment_serves_on_its_settings_port_with_real_settings(
    service: str, target: str, rendered: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = rendered[target]
    where = f"k8s/{target} Deployment {service}"
    deployment = res[("Deployment", service)]
    (container,) = pod_containers(deployment)
    port = PORTS[service]  # the image runs `arbiter serve NAME`: the settings' port
    assert [p["containerPort"] for p in container["ports"]] == [port], where
    assert [p["port"] for p in res[("Service", service)]["spec"]["ports"]] == [port], where
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port), f"{where}: scrape port"
    probes = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe, path in probes.items():
        assert container[probe]["httpGet"]["path"] == path, f"{where}: {probe}"
    names = {e["name"] for e in container.get("env", [])}
    assert not unknown_names(service, names), f"{where}: env {unknown_names(service, names)}"
    env = container_env(container)
    for e in container.get("env", []):  # a Secret's value: any string will do (a long one:
        if "secretKeyRef" in e.get("valueFrom", {}):  # a production secret has 32 or more)
            env[e["name"]] = "from-a-secret-created-out-of-band-" + "x" * 32
    # ConfigMap and Secret volumes written out, so a path in the env points at a real file
    # (a Secret created out of band, as prod's: an empty keys file stands in)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"].get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            files = res[("ConfigMap", volume["configMap"]["name"])]["data"]
        elif "secret" in volume:
            secret = res.get(("Secret", volume["secret"]["secretName"]))
            files = secret["stringData"] if secret else {"keys.yaml": "keys: []\n"}
        else:
            continue
        local = tmp_path / mount["name"]
        local.mkdir()
        for key, text in files.items():
            (local / key).write_text(text)
        for k, v in env.items():
            if v.startswith(mount["mountPath"] + "/"):
                env[k] = str(local / v[len(mount["mountPath"]) + 1 :])
    check_settings(service, env, monkeypatch, where)


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not _selects(selector.get("matchLabels", {}), labels):
        return False
    return all(
        e["operator"] == "In" and labels.get(e["key"]) in e["values"]
        for e in selector.get("matchExpressions", [])
    )


@pytest.mark.parametrize("target", TARGETS)
def test_only_the_gateway_reaches_the_components(target: str, rendered: Any) -> None:
    res = rendered[target]
    policies = [r for (kind, _), r in res.items() if kind == "NetworkPolicy"]

    def callers(name: str) -> set[str] | None:
        """The pods allowed in (None: no policy selects it, anyone may connect)."""
        labels = {"app.kubernetes.io/name": name}
        selecting = [p for p in policies if _matches(p["spec"]["podSelector"], labels)]
        if not selecting:
            return None
        out: set[str] = set()
        for policy in selecting:
            assert "Ingress" in policy["spec"]["policyTypes"], policy["metadata"]["name"]
            for rule in policy["spec"].get("ingress", []):
                for peer in rule["from"]:  # a rule without `from` would let everyone in
                    if "podSelector" in peer:
                        out.add(peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"])
                    else:  # Prometheus, scraping /metrics
                        ns = peer["namespaceSelector"]["matchLabels"]
                        assert ns == {"kubernetes.io/metadata.name": "monitoring"}, peer
        return out

    for name in ("embedding", "judge", "redis", "envs"):
        assert callers(name) == {"gateway"}, name
    # the envs service's rewards, code runs and episodes
    for name in ("verify", "state-redis", "sandbox"):
        assert callers(name) == {"gateway", "envs"}, name
    assert callers("vllm") == {"judge"}
    assert callers("gateway") is None  # the public API


@pytest.mark.parametrize("target", TARGETS)
def test_the_sandbox_has_no_egress_and_only_the_privileges_bwrap_needs(
    target: str, rendered: Any
) -> None:
    res = rendered[target]
    labels = {"app.kubernetes.io/name": "sandbox"}
    policies = [
        r for (kind, _), r in res.items()
        if kind == "NetworkPolicy" and _matches(r["spec"]["podSelector"], labels)
    ]  # fmt: skip
    # an Egress policy with no rule denies every connection out (DNS included)
    assert any(
        "Egress" in p["spec"]["policyTypes"] and not p["spec"].get("egress") for p in policies
    ), f"{target}: the sandbox may connect out: {[p['metadata']['name'] for p in policies]}"
    for policy in policies:  # no other policy selecting it opens an egress
        assert not policy["spec"].get("egress"), policy["metadata"]["name"]
    # every other pod keeps the default profiles: only the sandbox's are lifted
    for w in _workloads(res):
        pod = w["spec"]["template"]["spec"]
        profile = pod["securityContext"]["seccompProfile"]["type"]
        if w["metadata"]["name"] != "sandbox":
            assert profile == "RuntimeDefault", w["metadata"]["name"]
    deployment = res[("Deployment", "sandbox")]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # bwrap: user namespaces and mount() in them (refused by the default seccomp and
    # AppArmor profiles), a fresh /proc per sandbox (refused under masked /proc paths)
    assert pod["securityContext"]["seccompProfile"] == {"type": "Unconfined"}
    assert pod["securityContext"]["appArmorProfile"] == {"type": "Unconfined"}
    assert container["securityContext"]["procMount"] == "Unmasked"
    assert pod["hostUsers"] is False, "Unmasked /proc only in a pod user namespace"
    # and nothing more: no capability, no privilege, no escalation, a read-only root
    sc = container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and not sc.get("privileged")
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    gateway = container_env(_container(res, "gateway"))
    assert gateway["GATEWAY_SANDBOX_URL"] == f"http://sandbox:{PORTS['sandbox']}"
