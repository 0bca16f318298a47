"""The admin surface: /metrics and /readyz in detail on a listener of their own, never on the
clients' one unless the admin token opens them there; a bare readiness verdict for everyone else."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable
from pathlib import Path

import aiohttp
import pytest

from proxy.config import ConfigError
from proxy.registry import parse_config
from tests.conftest import REDIS_URL, free_port
from tests.polling import within
from tests.raw_http import send_raw

ROOT = Path(__file__).parent.parent
TOKEN = "adm-0123456789abcdef-token"
# Names that only an operator may learn: a key, its tenant and a channel.
NAMED = """
keys: [{name: acme-team-key, key: sk-acme-0123456789, labels: {tenant: tenant-zeta}}]
channels: [{name: chan-omega, base_url: simulator}]
"""
BEARER = {"Authorization": "Bearer sk-acme-0123456789"}
RESPONSE = {"model": "respmodel-4o", "input": "hi"}
SECRET_WORDS = ("acme-team-key", "tenant-zeta", "chan-omega", "modelgate_")


async def answer_of(http: aiohttp.ClientSession, url: str, **kwargs: object) -> tuple[int, str, dict[str, str]]:
    async with http.get(url, **kwargs) as answer:  # type: ignore[arg-type]
        return answer.status, await answer.text(), dict(answer.headers)


async def test_metrics_and_readiness_details_are_on_the_admin_listener_not_the_public_one(start_gateway, http):
    gw = await start_gateway(NAMED)
    async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
        assert answer.status == 200  # so the metrics hold the key's and the channel's names

    status, body, _ = await answer_of(http, gw.url + "/metrics")
    assert status == 404 and '"code":"not_found"' in body  # as any path the gateway does not serve
    _, unserved, _ = await answer_of(http, gw.url + "/no-such-path")
    assert body == unserved.replace("/no-such-path", "/metrics")  # nothing tells the two apart
    status, body, _ = await answer_of(http, gw.url + "/readyz")
    assert status == 200 and body == '{"status":"ready"}'
    for path in ("/metrics", "/readyz", "/healthz"):
        _, body, _ = await answer_of(http, gw.url + path)
        assert not any(word in body for word in SECRET_WORDS), (path, body)

    status, metrics, _ = await answer_of(http, gw.admin + "/metrics")
    assert status == 200 and 'channel="chan-omega"' in metrics and "modelgate_requests_total" in metrics
    status, body, _ = await answer_of(http, gw.admin + "/readyz")
    assert status == 200 and '"name":"chan-omega"' in body and '"state_store":"ok"' in body
    status, body, _ = await answer_of(http, gw.admin + "/v1/responses%0d%0aX-Echo")
    assert status == 404 and "X-Echo" not in body and "GET /metrics" in body  # the path is not echoed


async def test_the_bare_readyz_says_not_ready_without_saying_why(start_gateway, http):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    gw = await start_gateway(
        NAMED + f"state: {{backend: redis, url: '{dead}'}}\nplugins: {{ratelimit: {{fail: closed}}}}\n"
    )
    status, body, _ = await answer_of(http, gw.url + "/readyz")
    assert status == 503 and body == '{"status":"not ready"}'
    status, body, _ = await answer_of(http, gw.admin + "/readyz")
    assert status == 503 and '"state_store":"unreachable"' in body and '"reasons"' in body


async def test_with_an_admin_token_the_public_listener_serves_them_to_its_bearer_only(start_gateway, http):
    gw = await start_gateway(
        NAMED + f'server: {{admin_token: "{TOKEN}"}}\n'
        "routes: {models: {plugins: [auth, tests.recording_plugin:AdminNote]}}\n"
    )
    for headers in (
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": TOKEN},
    ):
        for path in ("/metrics", "/admin/note"):
            status, body, answer_headers = await answer_of(http, gw.url + path, headers=headers)
            assert status == 401 and '"code":"admin_token_required"' in body, (headers, path, body)
            assert answer_headers["WWW-Authenticate"] == "Bearer"
            assert TOKEN not in body and not any(word in body for word in SECRET_WORDS)
    # A header that is not text is a 401 like any other wrong one, never a 500.
    raw = await send_raw(gw.url, b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer \xff\xfe" + TOKEN.encode())
    assert raw.status == 401

    admin = {"Authorization": f"Bearer {TOKEN}"}
    status, metrics, _ = await answer_of(http, gw.url + "/metrics", headers=admin)
    assert status == 200 and "modelgate_requests_total" in metrics
    status, body, _ = await answer_of(http, gw.url + "/admin/note", headers=admin)
    assert status == 200 and '"for operators"' in body
    # /readyz: the bare verdict without Authorization (load balancers send none), the details with
    # the token, and a 401 for a wrong one.
    status, body, _ = await answer_of(http, gw.url + "/readyz")
    assert status == 200 and body == '{"status":"ready"}'
    status, body, _ = await answer_of(http, gw.url + "/readyz", headers=admin)
    assert status == 200 and '"name":"chan-omega"' in body
    status, _, _ = await answer_of(http, gw.url + "/readyz", headers={"Authorization": "Bearer not-it-0123456789"})
    assert status == 401
    # The admin listener asks no token: where it listens is what keeps it private.
    assert (await answer_of(http, gw.admin + "/metrics"))[0] == 200


async def test_a_plugins_admin_route_is_on_the_admin_listener_only(start_gateway, http):
    gw = await start_gateway("routes: {models: {plugins: [auth, tests.recording_plugin:AdminNote]}}\n")
    status, body, _ = await answer_of(http, gw.admin + "/admin/note")
    assert status == 200 and '"for operators"' in body
    status, body, _ = await answer_of(http, gw.url + "/admin/note", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 404 and '"code":"not_found"' in body  # no token configured: nothing opens it


def test_admin_routes_are_added_before_the_application_is_built() -> None:
    from proxy.process.app import APP_KEY, build_admin_app, build_app
    from proxy.registry import load_config

    app = build_app(load_config(None))
    surface = app[APP_KEY].admin
    assert [(r.method, r.path) for r in surface.routes] == [("GET", "/metrics"), ("GET", "/readyz")]
    with pytest.raises(RuntimeError, match="after the application was built"):
        surface.add("GET", "/late", lambda request: None)  # type: ignore[arg-type, return-value]
    assert APP_KEY in build_admin_app(app)  # its handlers read the same gateway


async def test_the_admin_listener_can_be_turned_off(start_gateway, http):
    gw = await start_gateway("server: {admin_listen: null}\n")
    assert gw.admin_url is None
    assert (await answer_of(http, gw.url + "/metrics"))[0] == 404
    assert parse_config("server: {admin_listen: ''}\n", {}).server.admin_address is None


@pytest.mark.parametrize(
    "listen, admin_listen",
    [
        ("127.0.0.1:8080", "127.0.0.1:8080"),
        ("0.0.0.0:8080", "127.0.0.1:8080"),
        ("127.0.0.1:8080", "0.0.0.0:8080"),
        ("[::]:8080", "127.0.0.1:8080"),
        ("localhost:8080", "LOCALHOST:8080"),
    ],
)
def test_an_admin_listen_on_the_main_listeners_address_is_a_config_problem(listen: str, admin_listen: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(f'server: {{listen: "{listen}", admin_listen: "{admin_listen}"}}\n', {})
    assert any(p.startswith("server.admin_listen: ") and "an address of its own" in p for p in refused.value.problems)


# Two spellings of one address: workers bind both listeners with SO_REUSEPORT, so neither bind
# fails and the kernel spreads each port's connections over both listeners.
@pytest.mark.parametrize(
    "listen, admin_listen",
    [
        ("127.0.0.1:8080", "localhost:8080"),
        ("127.1:8080", "127.0.0.1:8080"),
        ("localhost:8080", "2130706433:8080"),
        ("[::1]:8080", "[0:0:0:0:0:0:0:1]:8080"),
        ("[::ffff:127.0.0.1]:8080", "127.0.0.1:8080"),
        ("[0:0:0:0:0:0:0:0]:8080", "127.0.0.1:8080"),
        ("127.0.0.1:8080", "0:8080"),
    ],
)
def test_an_admin_listen_naming_the_main_listeners_address_another_way_is_a_config_problem(
    listen: str, admin_listen: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(f'server: {{listen: "{listen}", admin_listen: "{admin_listen}"}}\n', {})
    assert any(p.startswith("server.admin_listen: ") and "an address of its own" in p for p in refused.value.problems)


def test_an_admin_listen_on_the_hostname_of_the_main_listeners_address_is_a_config_problem() -> None:
    hostname = socket.gethostname()
    try:
        address = socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError:
        pytest.skip("this machine's name does not resolve")
    shown = f"[{address}]" if ":" in address else address
    with pytest.raises(ConfigError) as refused:
        parse_config(f'server: {{listen: "{shown}:8080", admin_listen: "{hostname}:8080"}}\n', {})
    assert any(p.startswith("server.admin_listen: ") for p in refused.value.problems)


def test_an_admin_listen_apart_from_the_main_one_is_fine() -> None:
    config = parse_config('server: {listen: "0.0.0.0:8080", admin_listen: "127.0.0.1:8081"}\n', {})
    assert config.server.admin_address == ("127.0.0.1", 8081)
    assert parse_config("", {}).server.admin_listen == "127.0.0.1:8081"  # the default: loopback
    assert parse_config('server: {listen: "127.0.0.1:8081", admin_listen: "127.0.0.1:8082"}\n', {})
    assert parse_config('server: {listen: "127.0.0.2:8081", admin_listen: "localhost:8081"}\n', {})  # 127.0.0.1
    assert parse_config('server: {listen: "127.0.0.1:8081", admin_listen: "no-such-host.invalid:8081"}\n', {})


def check_config(path: Path, text: str) -> subprocess.CompletedProcess[str]:
    path.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def test_check_config_reports_the_admin_listen_and_a_weak_token_without_quoting_it(tmp_path: Path) -> None:
    checked = check_config(tmp_path / "same.yaml", 'server: {listen: "0.0.0.0:9000", admin_listen: "127.0.0.1:9000"}\n')
    assert checked.returncode == 1
    assert "server.admin_listen: 127.0.0.1:9000 is where server.listen (0.0.0.0:9000) serves clients" in checked.stderr
    checked = check_config(tmp_path / "weak.yaml", 'server: {admin_token: "short tok 123456789"}\n')
    assert checked.returncode == 1
    assert "server.admin_token: must be at least 16 printable ASCII characters" in checked.stderr
    assert "short tok" not in checked.stdout + checked.stderr
    assert check_config(tmp_path / "fine.yaml", f'server: {{admin_token: "{TOKEN}"}}\n').returncode == 0


def test_serve_refuses_an_admin_listen_that_is_no_address() -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--admin-listen", "nowhere"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert refused.returncode == 1 and refused.stderr.startswith("--admin-listen: not a HOST:PORT address")


def listening_ports(pid: int) -> set[int]:
    """The TCP ports a process listens on: its sockets' inodes, found among the kernel's listeners."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def test_every_worker_serves_the_admin_port_and_a_reload_changes_the_token_not_the_port(
    spawn, redis_url, tmp_path
):
    gateway = spawn(
        "gateway",
        config=f"""
server: {{listen: "127.0.0.1:{{PORT}}", admin_listen: "127.0.0.1:{{ADMIN_PORT}}", admin_token: "{TOKEN}", workers: 2}}
state: {{backend: redis, url: '{REDIS_URL}', prefix: 'admin-{os.getpid()}-{time.monotonic_ns()}:'}}
{NAMED}
""",
    )
    from tests.test_workers import children

    admin_port = int(gateway.admin.rsplit(":", 1)[1])
    workers = children(gateway.proc.pid)
    assert len(workers) == 2 and all(admin_port in listening_ports(pid) for pid in workers)
    for _ in range(6):  # fresh connections, spread over both workers
        async with aiohttp.ClientSession() as http:
            async with http.post(gateway.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
                assert answer.status == 200

    async def served() -> float:
        async with aiohttp.ClientSession() as http:
            _, metrics, _ = await answer_of(http, gateway.admin + "/metrics")
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("modelgate_requests_total{") and 'route="responses"' in line
        )

    # Both workers' counts, whichever answered the scrape (each folds its own in within a second).
    await within(3, lambda: _equals(served(), 6), "both workers' requests in the scrape")

    config = next(tmp_path.glob("gateway-*.yaml"))
    new_token, new_port = "adm-rotated-0123456789abcdef", free_port()
    config.write_text(config.read_text().replace(TOKEN, new_token).replace(f":{admin_port}", f":{new_port}"))
    gateway.proc.send_signal(signal.SIGHUP)

    async def every_worker_takes_the_new_token() -> bool:
        if gateway.log.read_text().count('"config reloaded"') < 2:
            return False  # (fresh connections need not reach both workers: each says when it has reloaded)
        for _ in range(6):
            async with aiohttp.ClientSession() as http:
                if (await answer_of(http, gateway.url + "/metrics", headers={"Authorization": f"Bearer {new_token}"}))[
                    0
                ] != 200:
                    return False
                if (await answer_of(http, gateway.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}))[
                    0
                ] != 401:
                    return False
        return True

    await within(15, every_worker_takes_the_new_token, "every worker takes the new token", every=0.2)
    async with aiohttp.ClientSession() as http:  # the admin port is bound at start: still the old one
        assert (await answer_of(http, gateway.admin + "/metrics"))[0] == 200
    log = gateway.log.read_text()
    assert log.count("server.admin_listen changes take effect at the next restart") == 2  # each worker says so
    gateway.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(gateway.proc.wait, 30) == 0
    log = gateway.log.read_text()
    assert TOKEN not in log and new_token not in log


async def test_a_second_gateway_on_a_served_admin_port_refuses_to_start(spawn):
    first = spawn("defaults")
    admin = first.admin.removeprefix("http://")
    second = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{free_port()}", "--admin-listen", admin],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert second.returncode == 1
    assert (
        f"{admin} is already served" in second.stdout + second.stderr
        and "(server.admin_listen)" in second.stdout + second.stderr
    )
    async with aiohttp.ClientSession() as http:
        assert (await answer_of(http, first.admin + "/metrics"))[0] == 200


ALIASED = """
server: {{listen: "127.0.0.1:{port}", admin_listen: "localhost:{port}", workers: 2}}
state: {{backend: redis, url: '{redis}', prefix: 'admin-alias-{unique}:'}}
"""


async def test_a_gateway_whose_admin_listen_names_its_listen_another_way_refuses_to_start(tmp_path, redis_url):
    """Started, its workers would share the port between both listeners: anonymous scrapes on the
    clients' port, clients' requests answered 404 by the admin listener."""
    port = free_port()
    config = tmp_path / "aliased.yaml"
    config.write_text(ALIASED.format(port=port, redis=REDIS_URL, unique=f"{os.getpid()}-{time.monotonic_ns()}"))
    checked = check_config(config, config.read_text())
    assert checked.returncode == 1
    assert (
        f"server.admin_listen: localhost:{port} is where server.listen (127.0.0.1:{port}) serves clients"
        in checked.stderr
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "-c", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        output, _ = await asyncio.to_thread(process.communicate, timeout=60)
    finally:
        if process.poll() is None:  # started: serving clients and scrapes on one port
            process.kill()
            process.wait()
    assert process.returncode == 1
    assert f"server.admin_listen: localhost:{port} is where server.listen" in output


async def test_a_worker_whose_listeners_were_bound_to_one_address_refuses_to_start(monkeypatch, caplog):
    """What the config check cannot see (a name that resolved otherwise when it was checked) is seen
    in the sockets: a worker binds both listeners, compares them, and stops before it serves."""
    from proxy.config import LoadedConfig
    from proxy.config.model import GatewayConfig
    from proxy.process.server import ListenersOverlap, _serve
    from proxy.process.workers import WORKER_ENV

    port = free_port()
    monkeypatch.setenv(WORKER_ENV, "0")  # SO_REUSEPORT on both listeners, as every worker binds them
    config = GatewayConfig.model_validate(  # the schema alone: as if the check had resolved `localhost` elsewhere
        {"server": {"listen": f"127.0.0.1:{port}", "admin_listen": f"localhost:{port}"}}
    )
    with pytest.raises(ListenersOverlap):
        await asyncio.wait_for(_serve(LoadedConfig(config, "<test>", "0" * 16), None, uvloop=False), 60)
    assert f"are bound to the same socket address (127.0.0.1:{port})" in caplog.text
    with socket.socket() as probe:  # both listeners closed again
        probe.bind(("127.0.0.1", port))


def test_a_supervisor_stops_when_a_worker_finds_its_listeners_overlap(tmp_path: Path, monkeypatch) -> None:
    """The worker's exit status says a restart would bind the same sockets: no restart loop, exit 1."""
    from proxy.process.workers import LISTENERS_OVERLAP, Supervisor

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")  # the supervisor sets it: restored after the test
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    worker = tmp_path / "worker.py"
    worker.write_text(f"raise SystemExit({LISTENERS_OVERLAP})\n")
    supervisor = Supervisor(2, None, 5.0)
    started: list[int] = []

    def start(slot: int) -> None:
        started.append(slot)
        supervisor.workers[slot] = subprocess.Popen([sys.executable, str(worker)])

    supervisor._start = start  # type: ignore[method-assign]
    try:
        assert supervisor.run() == 1
    finally:
        for signum, handler in handlers.items():  # and so are the handlers it installs
            signal.signal(signum, handler)
    assert sorted(started) == [0, 1]  # none started again: each would bind the same way


async def _equals(value: Awaitable[float], wanted: float) -> bool:
    return await value == wanted
