"""The deployable artefacts are checked, not just written.

No Docker engine or cluster is at hand, so each file is checked against what would read it:
the Dockerfile statically (its base, user, install step, entrypoint and health check, and that
what it copies exists and is in the build context) and by running its default command and its
health check as the image would; docker-compose.yaml against the Compose Specification's JSON
schema, with the files it mounts checked by their own readers (the gateway's config check,
promtool, Grafana's provisioning layout). The Kubernetes manifests, rendered from
deploy/kubernetes/, are checked in tests/test_kubernetes.py."""

from __future__ import annotations

import copy
import json
import os
import posixpath
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from proxy.registry import load_config
from tests.conftest import free_port
from tests.dockerfile import (
    copied,
    dockerfile_stages,
    healthcheck_command,
    ignore_patterns,
    ignored,
    image,
    image_port,
    install_target,
    readme_run_it,
    venv_and_pip,
)

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yaml"

# --- the Dockerfile -------------------------------------------------------------------------


def test_the_image_is_slim_python_run_by_a_user_that_is_not_root() -> None:
    stages = dockerfile_stages()
    for stage in stages:
        assert re.fullmatch(r"python:3\.11-slim(-\w+)?", stage.base), stage.base
    final = stages[-1]
    assert final.user is not None, "no USER: the image would run as root"
    user, _, group = final.user.partition(":")
    assert user.isdigit(), "a numeric uid, so runAsNonRoot can be verified without /etc/passwd"
    assert int(user) != 0 and group != "0"
    assert any(f"--uid {user}" in run for run in final.runs), "the uid is created in the image"
    assert final.entrypoint == ["modelgate", "serve"]
    assert final.cmd and final.cmd[:2] == ["-c", "/etc/modelgate/config.yaml"]


def test_the_image_installs_the_package_as_the_readme_does() -> None:
    commands = readme_run_it()
    _, readme_args = venv_and_pip(commands)
    # The README installs editable for development; the image installs the same target for good,
    # with the s3 extra, so every store of docs/url-delivery.md works in it.
    expected = [arg for arg in readme_args if arg not in ("-e", "--editable")]
    (build,) = [stage for stage in dockerfile_stages() if any("pip install" in run for run in stage.runs)]
    (run,) = [run for run in build.runs if "pip install" in run]
    venv, args = venv_and_pip([shlex.split(part) for part in run.split("&&")])
    path, extras = install_target(args[-1])
    assert [*args[:-1], path] == expected, f"the image runs pip install {args}, the README {readme_args}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert extras == ["s3"] and "s3" in project["project"]["optional-dependencies"]
    target = posixpath.normpath(posixpath.join(build.workdir, path))
    assert posixpath.join(target, "pyproject.toml") in copied(build), "pip installs the copied project"
    final = image()
    assert venv in copied(final, from_stage=build.name).values(), "the runtime stage takes the build's venv"
    serve = commands[-1]
    assert [Path(serve[0]).name, *serve[1:]] == final.entrypoint, "README's last command is the entrypoint"


def test_no_document_installs_this_project_from_a_package_index_by_name() -> None:
    """The name `modelgate` on the public package index is another project's: `pip install
    modelgate[s3]` installed it. The gateway is installed from this repository, extras and all."""
    by_name = re.compile(
        r"\b(?:pip3?|pipx|uv\s+pip|python3?\s+-m\s+pip)\s+install\s+(?:-{1,2}[\w-]+\s+)*"
        r"['\"]?modelgate\b",
        re.I,
    )
    documents = [
        ROOT / "README.md",
        ROOT / "Dockerfile",
        *ROOT.glob("docs/**/*.md"),
        *ROOT.glob("deploy/**/*.md"),
        *ROOT.glob("examples/**/*"),
        *ROOT.glob("dashboards/**/*.md"),
        *ROOT.glob("bench/**/*.md"),
    ]
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in documents
        if path.is_file()
        for match in by_name.finditer(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert found == []
    assert by_name.search("pip install 'modelgate[s3]'") and not by_name.search("pip install -e '.[s3]'")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert (
        "pip install -e '.[s3]'" in readme and "pip install -e '.[s3]'" in (ROOT / "docs/url-delivery.md").read_text()
    )


def test_everything_the_dockerfile_copies_exists_and_is_in_the_build_context() -> None:
    patterns = ignore_patterns()
    for excluded in (".git", ".venv", ".venv-litellm", "modelgate.egg-info", "proxy/__pycache__/x.pyc"):
        assert ignored(excluded, patterns), f"{excluded} would be sent with the build context"
    stages = dockerfile_stages()
    stage_names = {stage.name for stage in stages}
    for stage in stages:
        for source_stage, sources, _ in stage.copies:
            assert source_stage is None or source_stage in stage_names, f"COPY --from={source_stage}: no such stage"
            for source in sources if source_stage is None else ():
                assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
                assert not ignored(source, patterns), f"COPY {source}: left out by .dockerignore"
    (build,) = [stage for stage in stages if any("pip install" in run for run in stage.runs)]
    _, args = venv_and_pip([shlex.split(part) for run in build.runs for part in run.split("&&")])
    target = posixpath.normpath(posixpath.join(build.workdir, install_target(args[-1])[0]))
    in_install_dir = {posixpath.relpath(path, target) for path in copied(build) if path.startswith(target + "/")}
    # What `pip install .` reads: pyproject.toml, the readme it names, and every package it finds.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    needed = {"pyproject.toml", project["project"]["readme"]}
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    needed |= {
        child.name
        for child in ROOT.iterdir()
        if (child / "__init__.py").exists()
        and any(re.fullmatch(pattern.replace("*", ".*"), child.name) for pattern in include)
    }
    assert needed <= in_install_dir, f"not copied for the install: {needed - in_install_dir}"


def test_the_image_default_command_serves_and_its_healthcheck_passes() -> None:
    """Run the image's ENTRYPOINT and CMD here, with the copied files at their repository paths
    and the port moved to a free one, then the HEALTHCHECK command against it."""
    final = image()
    command = healthcheck_command()
    assert command[0] == "python", "the slim image has no curl or wget"
    assert f"http://127.0.0.1:{image_port()}/readyz" in command[-1]
    in_image = copied(final)
    assert final.entrypoint and final.cmd
    port = free_port()
    args = [str(ROOT / in_image[arg]) if arg in in_image else arg for arg in final.entrypoint[1:] + final.cmd]
    listen = args.index("--listen")
    assert args[listen + 1] == f"0.0.0.0:{image_port()}", "reachable from outside the container"
    args[listen + 1] = f"127.0.0.1:{port}"
    args += ["--admin-listen", f"127.0.0.1:{free_port()}"]  # moved too, off the default 8081
    binary = Path(sys.executable).with_name(final.entrypoint[0])
    assert binary.exists(), "the entrypoint is the package's console script"
    check = [sys.executable, *command[1:-1], command[-1].replace(f":{image_port()}/", f":{port}/")]
    gateway = subprocess.Popen(
        [str(binary), *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "MODELGATE_DEMO_KEY": "sk-artifacts-test"},
    )
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(check, capture_output=True, timeout=10).returncode != 0:
            assert gateway.poll() is None, gateway.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "the health check never passed"
            time.sleep(0.2)
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(timeout=30)
    assert subprocess.run(check, capture_output=True, timeout=10).returncode != 0, (
        "the health check must fail with no gateway"
    )


# --- docker-compose.yaml ------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def compose_schema_validator() -> jsonschema.protocols.Validator:
    # check-jsonschema vendors the Compose Specification's schema (compose-spec/compose-spec,
    # Apache-2.0), so the check runs offline.
    text = (files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text(encoding="utf-8")
    schema = json.loads(text)
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    return validator(schema, format_checker=validator.FORMAT_CHECKER)


def interpolate(value: str, environ: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}` and `${VAR-default}`, in a shell with none of them set."""

    def replace(match: re.Match[str]) -> str:
        name, colon, default = match.group(1), match.group(2), match.group(3)
        if name in environ and (environ[name] or not colon):
            return environ[name]
        return default or ""

    return re.sub(r"\$\{(\w+)(?:(:?)-([^}]*))?\}", replace, value)


def service_environment(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment", {})
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {name: interpolate(str(value), {}) for name, value in environment.items()}


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> repository path, for each bind mount of a service."""
    mounts: dict[str, Path] = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                mounts[volume["target"]] = (ROOT / volume["source"]).resolve()
            continue
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (ROOT / source).resolve()
    return mounts


def host_path(service: dict[str, Any], container_path: str) -> Path:
    """The repository file a path inside a service's container comes from."""
    for target, source in sorted(bind_mounts(service).items(), key=lambda item: -len(item[0])):
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            return source / posixpath.relpath(container_path, target)
    raise AssertionError(f"{container_path} is not mounted from the repository")


def has_healthcheck(service: dict[str, Any]) -> bool:
    if "healthcheck" in service:
        return not service["healthcheck"].get("disable", False)
    return "build" in service and image().healthcheck is not None


def gateway_config_path() -> Path:
    gateway = compose()["services"]["gateway"]
    args = gateway["command"]
    assert image().entrypoint == ["modelgate", "serve"] and args[0] == "-c", "the command is serve's arguments"
    return host_path(gateway, args[1])


def test_compose_file_matches_the_compose_specification() -> None:
    validator = compose_schema_validator()
    document = compose()
    problems = [
        f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(document)
    ]
    assert not problems, "\n".join(problems)
    broken = copy.deepcopy(document)
    broken["services"]["gateway"]["helthcheck"] = {}
    assert not validator.is_valid(broken), "the schema must refuse a misspelt key"


def test_compose_services_start_in_order_and_mount_files_that_exist() -> None:
    document = compose()
    services = document["services"]
    assert {"gateway", "redis", "prometheus", "grafana"} <= set(services)
    assert services["gateway"]["build"] in (".", {"context": "."}) and (ROOT / "Dockerfile").exists()
    for name, service in services.items():
        assert has_healthcheck(service), f"{name} has no health check"
        for needed, condition in service.get("depends_on", {}).items():
            assert needed in services, f"{name} depends on {needed}, which is not a service"
            assert condition["condition"] == "service_healthy" and has_healthcheck(services[needed])
        for target, source in bind_mounts(service).items():
            assert source.exists(), f"{name} mounts {source} at {target}: no such file"
            assert source.is_relative_to(ROOT)
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source", "")
            if source and not source.startswith((".", "/")):
                assert source in (document.get("volumes") or {}), f"{name}: volume {source} is not declared"
    assert [dependency for dependency in services["gateway"]["depends_on"]] == ["redis"]


def test_compose_gateway_config_passes_the_gateways_check_and_uses_the_stacks_redis() -> None:
    gateway = compose()["services"]["gateway"]
    path = gateway_config_path()
    assert path.is_relative_to(DEPLOY), "the stack's gateway config lives in deploy/"
    environment = service_environment(gateway)
    checked = subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(path)],
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", ""), **environment},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    config = load_config(path, environment).config
    assert config.state.backend == "redis"
    redis = urlsplit(config.state.url)
    assert redis.hostname in compose()["services"] and redis.hostname == "redis" and redis.port == 6379
    assert config.server.host == "0.0.0.0"
    listen_port = int(config.server.listen.rsplit(":", 1)[1])
    assert listen_port == image_port(), "the image's health check asks this port"
    published = {str(port).rsplit(":", 1)[-1] for port in gateway["ports"]}
    assert str(listen_port) in published
    # The admin listener is reachable by the stack's Prometheus (any address in the container), published nowhere.
    assert config.server.admin_address is not None and config.server.admin_address[0] == "0.0.0.0"
    assert str(config.server.admin_address[1]) not in published
    stop_grace = int(gateway["stop_grace_period"].removesuffix("s"))
    assert stop_grace > config.server.drain_timeout_s, "docker would kill the gateway mid-drain"


def prometheus_config() -> tuple[dict[str, Any], dict[str, Any]]:
    service = compose()["services"]["prometheus"]
    config_path = host_path(service, "/etc/prometheus/prometheus.yml")  # the image's default --config.file
    return service, yaml.safe_load(config_path.read_text(encoding="utf-8"))


def test_prometheus_scrapes_the_gateways_admin_port_and_loads_the_alert_rules() -> None:
    service, config = prometheus_config()
    (job,) = config["scrape_configs"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    (target,) = [target for group in job["static_configs"] for target in group["targets"]]
    host, port = target.split(":")
    gateway = load_config(gateway_config_path(), service_environment(compose()["services"]["gateway"])).config
    assert host == "gateway" and (int(port),) == gateway.server.admin_address[1:]  # type: ignore[index]
    assert int(port) != image_port(), "the clients' port serves no /metrics"
    rules = [host_path(service, posixpath.join("/etc/prometheus", rule)) for rule in config["rule_files"]]
    assert rules == [ROOT / "dashboards" / "alerts.yaml"]


def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (.ci/run installs it)")
    # The container's /etc/prometheus, laid out from the service's mounts, so relative rule
    # files resolve as they do in the container and promtool checks them too.
    service, _ = prometheus_config()
    for target, source in bind_mounts(service).items():
        if target.startswith("/etc/prometheus/"):
            place = tmp_path / posixpath.relpath(target, "/etc/prometheus")
            place.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, place)
    checked = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "rules found" in checked.stdout + checked.stderr and " 0 rules found" not in checked.stdout


def test_grafana_provisions_the_prometheus_datasource_and_the_dashboard() -> None:
    services = compose()["services"]
    grafana = services["grafana"]
    provisioning = "/etc/grafana/provisioning"  # the image's GF_PATHS_PROVISIONING
    sources = [
        yaml.safe_load(path.read_text(encoding="utf-8"))
        for path in sorted(host_path(grafana, f"{provisioning}/datasources").glob("*.yaml"))
    ]
    (datasource,) = [source for file in sources for source in file["datasources"] if source["type"] == "prometheus"]
    url = urlsplit(datasource["url"])
    assert datasource["type"] == "prometheus" and datasource["isDefault"] is True
    assert url.hostname == "prometheus" and url.port == 9090 and "prometheus" in services
    providers = [
        yaml.safe_load(path.read_text(encoding="utf-8"))
        for path in sorted(host_path(grafana, f"{provisioning}/dashboards").glob("*.yaml"))
    ]
    (provider,) = [provider for file in providers for provider in file["providers"]]
    assert provider["type"] == "file"
    folder = provider["options"]["path"]
    dashboards = [target for target in bind_mounts(grafana) if posixpath.dirname(target) == folder]
    assert [host_path(grafana, target) for target in dashboards] == [ROOT / "dashboards" / "modelgate.json"]
    dashboard = json.loads((ROOT / "dashboards" / "modelgate.json").read_text(encoding="utf-8"))
    variable = next(item for item in dashboard["templating"]["list"] if item["type"] == "datasource")
    assert variable["query"] == datasource["type"], "the dashboard's datasource variable finds it"


def test_the_stack_s_trace_viewer_receives_the_gateway_s_spans_and_the_dashboard_links_to_it() -> None:
    services = compose()["services"]
    viewer = services["jaeger"]
    assert has_healthcheck(viewer) and "jaeger" in services["grafana"]["depends_on"]
    gateway = services["gateway"]
    tracing = load_config(gateway_config_path(), service_environment(gateway)).config.observability.tracing
    endpoint = urlsplit(tracing.endpoint)
    assert tracing.exporter == "otlp" and tracing.sample_ratio == 1.0
    assert (endpoint.hostname, endpoint.port, endpoint.path) == ("jaeger", 4318, "/v1/traces")  # OTLP/HTTP
    # The access line's link opens the viewer's UI where compose publishes it.
    assert tracing.viewer_url is not None
    link = urlsplit(tracing.viewer_url.replace("{trace_id}", "0" * 32))
    assert f"127.0.0.1:{link.port}:16686" in viewer["ports"] and link.path == "/trace/" + "0" * 32
    # Prometheus keeps exemplars (the latency buckets' trace ids), and Grafana follows them to the viewer.
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    grafana = services["grafana"]
    sources = [
        source
        for path in sorted(host_path(grafana, "/etc/grafana/provisioning/datasources").glob("*.yaml"))
        for source in yaml.safe_load(path.read_text(encoding="utf-8"))["datasources"]
    ]
    jaeger = next(source for source in sources if source["type"] == "jaeger")
    assert urlsplit(jaeger["url"]).hostname == "jaeger" and urlsplit(jaeger["url"]).port == 16686
    prometheus = next(source for source in sources if source["type"] == "prometheus")
    (destination,) = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert destination == {"name": "trace_id", "datasourceUid": jaeger["uid"]}  # the exemplar label the gateway writes
    dashboard = json.loads((ROOT / "dashboards" / "modelgate.json").read_text(encoding="utf-8"))
    variables = {item["name"] for item in dashboard["templating"]["list"]}
    assert {"job", "instance", "environment"} <= variables
    assert any(target.get("exemplar") for panel in dashboard["panels"] for target in panel.get("targets", []))


# --- load balancers -------------------------------------------------------------------------


def test_the_load_balancers_never_pass_the_admin_port_or_metrics_on() -> None:
    """nginx and HAProxy forward the clients' port only, and refuse /metrics themselves: with
    server.admin_token set the gateway would otherwise answer it there (to its token)."""
    server = yaml.safe_load((DEPLOY / "gateway.yaml").read_text(encoding="utf-8"))["server"]
    port, admin_port = (int(server[name].rsplit(":", 1)[1]) for name in ("listen", "admin_listen"))
    nginx = (DEPLOY / "nginx.conf").read_text(encoding="utf-8")
    servers = re.findall(r"^\s*server\s+[\d.]+:(\d+)", nginx, re.MULTILINE)
    assert servers and set(servers) == {str(port)}
    assert re.search(r"location\s*=\s*/metrics\s*\{\s*return\s+404;\s*\}", nginx)
    haproxy = (DEPLOY / "haproxy.cfg").read_text(encoding="utf-8")
    servers = re.findall(r"^\s*server\s+\S+\s+[\d.]+:(\d+)", haproxy, re.MULTILINE)
    assert servers and set(servers) == {str(port)}
    assert "http-request deny deny_status 404 if { path,url_dec -i /metrics }" in haproxy  # %6detrics too
    assert "option httpchk GET /readyz" in haproxy  # the bare verdict: all a load balancer reads
    assert admin_port != port
