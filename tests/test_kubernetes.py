"""deploy/kubernetes/, checked as it would be applied: each overlay rendered by kustomize (through
`kubectl kustomize`), every object against the Kubernetes API's schemas in strict mode, the
objects against each other and the image, and the config the pods would run checked by the
gateway itself with the files the pods would mount, laid out as the kubelet lays them out.

No cluster is at hand; what is checked is what `kubectl apply -k` would send and what the
gateway would find in its pod."""

from __future__ import annotations

import base64
import copy
import functools
import os
import posixpath
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from tests.conftest import free_port
from tests.dockerfile import image, image_port, image_uid

ROOT = Path(__file__).resolve().parent.parent
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(path.name for path in (KUSTOMIZE / "overlays").iterdir() if (path / "kustomization.yaml").exists())

# The Kubernetes release the manifests are checked against: the oldest one whose schemas every
# kubernetes-validate the test extras allow (>=1.30) ships, and still one that has every API
# used here (autoscaling/v2 and policy/v1 are GA since 1.23 and 1.21).
KUBERNETES_VERSION = "1.30.0"

# Kinds whose schema is not the Kubernetes API's but a custom resource's: kubernetes-validate
# knows only the built-in API, and the ServiceMonitor's schema comes with the Prometheus operator,
# which is not vendored here. They are left out of the schema check, and only they:
# test_the_admin_port_is_scraped_and_never_public checks what the ServiceMonitor says instead.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


@functools.cache
def _rendered(where: str) -> tuple[dict[str, Any], ...]:
    kubectl, kustomize = shutil.which("kubectl"), shutil.which("kustomize")
    if kubectl is None and kustomize is None:
        pytest.skip("neither kubectl nor kustomize is installed")
    command = [kubectl, "kustomize"] if kubectl else [kustomize, "build"]
    built = subprocess.run([*command, str(KUSTOMIZE / where)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return tuple(document for document in yaml.safe_load_all(built.stdout) if document)


def render(where: str) -> list[dict[str, Any]]:
    """What `kubectl apply -k deploy/kubernetes/<where>` sends (a copy the test may change)."""
    return copy.deepcopy(list(_rendered(where)))


def the(documents: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found


def gateway_pod(documents: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gateway's pod spec and its container."""
    pod = the(documents, "Deployment", "modelgate")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def gateway_config_text(documents: list[dict[str, Any]]) -> str:
    _, container = gateway_pod(documents)
    assert image().entrypoint == ["modelgate", "serve"] and container["args"][0] == "-c"
    folder, key = posixpath.split(container["args"][1])
    return mounted(documents, folder)[key].decode()


def mounted(documents: list[dict[str, Any]], mount_path: str) -> dict[str, bytes]:
    """The files the gateway's container finds at `mount_path`: the keys of the ConfigMap or
    Secret its volume names (an object the overlay does not make fails here)."""
    pod, container = gateway_pod(documents)
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == mount_path]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    if "configMap" in volume:
        config_map = the(documents, "ConfigMap", volume["configMap"]["name"])
        return {key: value.encode() for key, value in config_map.get("data", {}).items()}
    secret = the(documents, "Secret", volume["secret"]["secretName"])
    files = {key: base64.b64decode(value) for key, value in secret.get("data", {}).items()}
    return files | {key: value.encode() for key, value in secret.get("stringData", {}).items()}


def lay_out_pod_files(documents: list[dict[str, Any]], root: Path) -> Path:
    """Every ConfigMap and Secret the gateway's container mounts, written under `root` at its
    mount path, and the config with its `${file:/...}` paths moved under `root` likewise; the
    config file's path."""
    pod, container = gateway_pod(documents)
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        if "configMap" in volumes[mount["name"]] or "secret" in volumes[mount["name"]]:
            folder = root / mount["mountPath"].lstrip("/")
            folder.mkdir(parents=True, exist_ok=True)
            for key, value in mounted(documents, mount["mountPath"]).items():
                (folder / key).write_bytes(value)
    config = root / container["args"][1].lstrip("/")
    config.write_text(config.read_text().replace("${file:/", f"${{file:{root}/"))
    return config


def check_config(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", "")},
    )


def file_references(config_text: str) -> list[str]:
    return re.findall(r"\$\{file:(/[^}]*)\}", config_text)


# --- rendering and the API schemas -------------------------------------------------------------


@pytest.mark.parametrize("where", ["base", *(f"overlays/{name}" for name in OVERLAYS)])
def test_each_kustomization_renders_and_every_object_matches_the_api_schema(where: str) -> None:
    documents = render(where)
    assert documents
    problems = []
    for document in documents:
        if (document["apiVersion"], document["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            problems.append(
                f"{document['kind']}/{document['metadata']['name']}: {'.'.join(map(str, error.path))}: {error.message}"
            )
        except kubernetes_validate.utils.SchemaNotFoundError as error:
            problems.append(f"{document['kind']}: {error.message}")  # an unknown kind is an error, not a pass
    assert not problems, "\n".join(problems)


def test_there_is_a_self_contained_overlay_and_a_managed_one() -> None:
    assert OVERLAYS == ["managed", "try-it"]
    kinds = {name: sorted(d["kind"] for d in render(f"overlays/{name}")) for name in OVERLAYS}
    assert kinds["try-it"].count("StatefulSet") == 2  # Redis and PostgreSQL, in the cluster
    assert "StatefulSet" not in kinds["managed"] and "HorizontalPodAutoscaler" in kinds["managed"]
    for name, found in kinds.items():
        for needed in ("Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget", "NetworkPolicy"):
            assert needed in found, f"{name} has no {needed}"
    assert "ServiceMonitor" in kinds["managed"]


def test_the_strict_schemas_refuse_unknown_and_mistyped_fields() -> None:
    deployment = the(render("overlays/managed"), "Deployment")
    for path, value in (
        (("spec", "template", "spec", "containers", 0, "readinessprobe"), {}),
        (("spec", "template", "spec", "terminationGracePeriodSeconds"), "75"),
    ):
        broken = copy.deepcopy(deployment)
        node = broken
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


# --- the objects against each other and the image ------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_file_the_config_reads_is_a_key_of_what_the_pod_mounts_whole(overlay: str) -> None:
    documents = render(f"overlays/{overlay}")
    text = gateway_config_text(documents)
    references = file_references(text)
    assert len(references) >= 6  # the credentials, the key digest, the signing secret, Redis, PostgreSQL
    _, container = gateway_pod(documents)
    for reference in references:
        folder, key = posixpath.split(reference)
        assert key in mounted(documents, folder), f"{reference}: no such key where the pod mounts {folder}"
    # The kubelet updates a ConfigMap or Secret only where its whole volume is mounted: a subPath
    # mount would never see a rotation, and the gateway would never reload it.
    assert not [m for m in container["volumeMounts"] if "subPath" in m or "subPathExpr" in m]
    secret_mount = posixpath.dirname(next(r for r in references if "credential" in r))
    assert mounted(documents, secret_mount) is not None
    pod, _ = gateway_pod(documents)
    (secrets,) = [v for v in pod["volumes"] if "secret" in v]
    assert secrets["secret"]["defaultMode"] & 0o007 == 0, "secret files readable by any user of the node's pods"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_admin_port_is_scraped_and_never_public(overlay: str) -> None:
    documents = render(f"overlays/{overlay}")
    config = yaml.safe_load(gateway_config_text(documents))
    admin_host, admin_port = config["server"]["admin_listen"].rsplit(":", 1)
    assert admin_host == "0.0.0.0", "Prometheus reaches the pod's address, not its loopback"
    pod, container = gateway_pod(documents)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["admin"] == int(admin_port) and ports["http"] == image_port()
    labels = the(documents, "Deployment", "modelgate")["spec"]["template"]["metadata"]["labels"]
    gateway_services = [
        s for s in documents if s["kind"] == "Service" and s["spec"]["selector"].items() <= labels.items()
    ]
    public = the(documents, "Service", "modelgate")
    assert [port["targetPort"] for port in public["spec"]["ports"]] == ["http"]
    for service in gateway_services:
        targets = {port["targetPort"] for port in service["spec"]["ports"]}
        if "admin" in targets:
            assert targets == {"admin"} and service["spec"].get("clusterIP") == "None", (
                f"{service['metadata']['name']}: the admin port goes only in a headless Service of its own"
            )
            assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    policy = the(documents, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    admin_rules = [rule for rule in policy["spec"]["ingress"] if {"port": "admin"} in rule.get("ports", [])]
    assert admin_rules and all(rule.get("from") for rule in admin_rules), "the admin port is open to anyone"
    monitors = [d for d in documents if d["kind"] == "ServiceMonitor"]
    for monitor in monitors:  # what its schema would check, and what it means
        assert set(monitor["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
        scraped = [
            s
            for s in documents
            if s["kind"] == "Service"
            and monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"].get("labels", {}).items()
        ]
        assert [s["metadata"]["name"] for s in scraped] == ["modelgate-admin"]
        (endpoint,) = monitor["spec"]["endpoints"]
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
        assert endpoint["path"] == "/metrics"
        assert endpoint["port"] in {port["name"] for port in scraped[0]["spec"]["ports"]}
        assert next(p["targetPort"] for p in scraped[0]["spec"]["ports"] if p["name"] == endpoint["port"]) == "admin"
    assert bool(monitors) == (overlay == "managed")  # try-it clusters seldom run the operator


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_deployment_runs_the_image_as_built(overlay: str) -> None:
    documents = render(f"overlays/{overlay}")
    pod, container = gateway_pod(documents)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == image_uid()
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    config = yaml.safe_load(gateway_config_text(documents))
    assert config["server"]["listen"] == f"0.0.0.0:{image_port()}"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert pod["terminationGracePeriodSeconds"] > config["server"]["drain_timeout_s"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert set(mounts.values()) <= set(volumes), "a mount names no volume"
    if container["securityContext"].get("readOnlyRootFilesystem"):
        assert "/tmp" in mounts, "the workers' metrics files and spooled bodies need a writable /tmp"
    spool = config["plugins"]["ledger"]["spool_dir"]
    assert spool in mounts, "the ledger's spool is on a volume of its own, not the read-only root"
    size = volumes[mounts[spool]]["emptyDir"]["sizeLimit"]
    assert size.endswith("Gi") and config["plugins"]["ledger"]["spool_max_mb"] < int(size[:-2]) * 1024


def test_the_autoscaler_and_the_disruption_budget_fit_the_deployment() -> None:
    documents = render("overlays/managed")
    deployment, hpa, pdb = (
        the(documents, "Deployment"),
        the(documents, "HorizontalPodAutoscaler"),
        the(documents, "PodDisruptionBudget"),
    )
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": deployment["apiVersion"],
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert "replicas" not in deployment["spec"], "the autoscaler owns the count; apply would reset it"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        assert "cpu" in container["resources"]["requests"], "CPU utilization is measured against the request"
    assert pdb["spec"]["selector"] == {"matchLabels": selector}
    assert hpa["spec"]["minReplicas"] - pdb["spec"]["maxUnavailable"] >= 2, "a drain leaves two pods serving"
    try_it = the(render("overlays/try-it"), "Deployment")
    assert try_it["spec"]["replicas"] >= 2 and not [
        d for d in render("overlays/try-it") if d["kind"] == "HorizontalPodAutoscaler"
    ]


# --- the config the pods would run, checked by the gateway -----------------------------------------


def test_the_try_it_overlay_runs_as_it_is_against_its_own_redis_and_postgresql(tmp_path: Path) -> None:
    documents = render("overlays/try-it")
    config = lay_out_pod_files(documents, tmp_path)
    checked = check_config(config)
    assert checked.returncode == 0, checked.stderr
    secrets = mounted(documents, "/etc/modelgate/secrets")
    services = {s["metadata"]["name"]: s for s in documents if s["kind"] == "Service"}
    for key, scheme in (("redis-url", "redis"), ("database-url", "postgresql")):
        url = urlsplit(secrets[key].decode())
        assert url.scheme == scheme and url.hostname in services, f"{key} names no Service of the overlay"
        assert url.port in {port["port"] for port in services[url.hostname]["spec"]["ports"]}
    database = urlsplit(secrets["database-url"].decode())
    (postgres,) = the(documents, "StatefulSet", "modelgate-postgres")["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item for item in postgres["env"]}
    assert env["POSTGRES_USER"]["value"] == database.username
    assert env["POSTGRES_DB"]["value"] == database.path.lstrip("/")
    reference = env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]
    password = base64.b64decode(the(documents, "Secret", reference["name"])["data"][reference["key"]]).decode()
    assert password == database.password, "the database URL's password is the one PostgreSQL is started with"
    assert "CHANGE-ME" not in yaml.safe_dump_all(documents)


def test_the_managed_overlay_refuses_to_start_until_each_placeholder_is_edited(tmp_path: Path) -> None:
    """Applied as shipped, every pod would exit at start naming each file still to edit (its
    log is what `kubectl logs` shows): nothing half-configured serves."""
    documents = render("overlays/managed")
    config = lay_out_pod_files(documents, tmp_path)
    placeholders = sorted(
        str(path)
        for path in tmp_path.rglob("*")
        if path.is_file() and path != config and b"CHANGE-ME" in path.read_bytes()
    )
    shipped = sorted(
        str(path.relative_to(KUSTOMIZE / "overlays" / "managed"))
        for path in (KUSTOMIZE / "overlays" / "managed").rglob("*")
        if path.is_file() and path.name != "kustomization.yaml" and b"CHANGE-ME" in path.read_bytes()
    )
    assert len(placeholders) == len(shipped) == 7
    started = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "-c", str(config), "--listen", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert started.returncode == 1
    named = sorted(set(re.findall(r"the placeholder CHANGE-ME is still in the file (\S+): ", started.stderr)))
    assert named == placeholders, started.stderr
    assert f"{len(placeholders)} problem(s)" in started.stderr  # said once each, not buried under "not a URL"
    edited = {
        "public-base-url": "https://models.example.com",
        "upstream-url": "https://api.example.com",
        "upstream-credential": "upstream-key",
        "team-a-key-sha256": "a" * 64,
        "url-signing-secret": "s" * 64,
        "redis-url": "rediss://default:password@redis.example.com:6380/0",
        "database-url": "postgresql://modelgate:password@db.example.com:5432/modelgate?sslmode=require",
    }
    for path in placeholders:
        Path(path).write_text(edited[Path(path).name] + "\n")
    checked = check_config(config)
    assert checked.returncode == 0, checked.stderr  # the placeholders were all there was to edit
