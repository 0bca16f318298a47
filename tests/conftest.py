"""Fixtures: gateways and simulators on real loopback sockets, in process or as processes of their own."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.policy.channels import Channel
from proxy.process.admin import AdminListener
from proxy.process.app import APP_KEY, GatewayApp, build_admin_app, build_app
from proxy.process.server import start_runner
from proxy.registry import load_config
from simulator.core import Simulator


def _test_redis_url() -> str:
    """The Redis database this test process empties and uses: MODELGATE_TEST_REDIS (db 15 by
    default), and under parallel workers (pytest -n) one database lower for each worker after
    the first, so workers never flush each other's state."""
    base = os.environ.get("MODELGATE_TEST_REDIS", "redis://127.0.0.1:6379/15")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # xdist names its workers gw0, gw1, ...
    offset = int(worker.removeprefix("gw") or 0)
    if offset == 0:
        return base
    head, _, db = base.rpartition("/")
    number = int(db) - offset
    if number < 0:
        raise RuntimeError(f"{base}: too few Redis databases below it for worker {worker}")
    return f"{head}/{number}"


REDIS_URL = _test_redis_url()
# The embedded config's key, and the places the spec reads it on the response and message formats.
DEMO_KEY = "sk-demo-key"
BEARER = {"Authorization": f"Bearer {DEMO_KEY}"}
MESSAGE_HEADERS = {"x-api-key": DEMO_KEY, "msgapi-version": "2023-06-01"}


class SteppedClock:
    """A monotonic clock the test moves: `clock.advance(30)` instead of sleeping 30 s."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nothing listens on, and one this process has not handed out before: the kernel
    may give a just-closed port again at once, and a gateway's listen and admin ports asked
    for one after the other then came back equal."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


@dataclass
class RunningGateway:
    url: str
    owner: GatewayApp
    runner: web.AppRunner
    admin_url: str | None = None  # the admin listener (/metrics, /readyz in detail), on a port of its own

    @property
    def admin(self) -> str:
        assert self.admin_url is not None, "this gateway's admin listener is off"
        return self.admin_url

    def sim(self, name: str = "simulator") -> Simulator:
        return self.owner.simulators.simulators[name]

    def channel(self, name: str) -> Channel:
        found = self.owner.runtime.channels.get(name)
        assert found is not None, name
        return found

    def last_upstream_request(self, name: str = "simulator"):
        return self.sim(name).requests[-1]


STOP_WITHIN_S = 90


def waiting_tasks() -> str:
    """Every task of the running loop, with the chain of awaits it is stopped at."""
    lines = []
    for task in asyncio.all_tasks():
        lines.append(repr(task))
        step: Any = task.get_coro()
        for _ in range(50):
            frame = (
                getattr(step, "cr_frame", None) or getattr(step, "ag_frame", None) or getattr(step, "gi_frame", None)
            )
            if frame is None:
                lines.append(f"    on {step!r}")
                break
            lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
            step = (
                getattr(step, "cr_await", None)
                or getattr(step, "ag_await", None)
                or getattr(step, "gi_yieldfrom", None)
            )
            if step is None:
                break
    return "\n".join(lines)


ADMISSION_SETTINGS = ("max_in_flight", "max_loop_delay_ms", "max_cpu_busy")


@asynccontextmanager
async def gateway_starter(config_dir: Path) -> AsyncIterator[Callable[..., Awaitable[RunningGateway]]]:
    """Start gateways in this process from YAML text (or the embedded defaults), each config
    file written to `config_dir`; its admin listener, unless the config turns it off, goes on a
    free port on the configured host. All are stopped on leaving.

    A gateway in the test's own process shares its thread with the test's clients, so the CPU
    that thread keeps busy and the delays its loop runs late are theirs as much as the gateway's:
    unless the YAML names one of admission's settings, `server.max_in_flight` is a fixed bound far
    past any test's crowd (100 pollers of one in-process gateway were refused on a CI host whose
    three test processes shared two cores) and `server.max_cpu_busy` is 1 (until a reload reads
    the file again). Gateways spawned as processes keep `auto`."""
    runners: list[web.AppRunner] = []
    admins: list[AdminListener] = []

    async def start(yaml_text: str | None = None, env: dict[str, str] | None = None) -> RunningGateway:
        if yaml_text is None:
            loaded = load_config(None)
            path = None
        else:
            path = config_dir / f"config-{len(runners)}.yaml"
            path.write_text(textwrap.dedent(yaml_text))
            loaded = load_config(path, env if env is not None else os.environ)
        if not any(name in (yaml_text or "") for name in ADMISSION_SETTINGS):
            server = loaded.config.server.model_copy(update={"max_in_flight": 100_000, "max_cpu_busy": 1.0})
            loaded.config = loaded.config.model_copy(update={"server": server})
        app = build_app(loaded, path)
        runner = await start_runner(app, loaded.config.server)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        admin = None
        if loaded.config.server.admin_listen:
            admin = await AdminListener.start(build_admin_app(app), loaded.config.server, reuse_port=False, port=0)
            admins.append(admin)
        return RunningGateway(f"http://127.0.0.1:{port}", app[APP_KEY], runner, admin.url if admin else None)

    try:
        yield start
    finally:
        for admin in admins:
            await admin.close()
        for runner in reversed(runners):
            try:
                # A stop that never ends fails its test with what every task waits on (it has hung
                # a run's teardown twice, untraced): the gateway's own grace periods are shorter.
                await asyncio.wait_for(runner.cleanup(), STOP_WITHIN_S)
            except TimeoutError:
                raise AssertionError(
                    f"the gateway did not stop within {STOP_WITHIN_S} s; its tasks:\n" + waiting_tasks()
                ) from None


@pytest.fixture
async def start_gateway(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[RunningGateway]]]:
    """Start a gateway in this process for the test (gateway_starter); all stop after it."""
    async with gateway_starter(tmp_path) as start:
        yield start


@pytest.fixture
async def gateway(start_gateway) -> RunningGateway:
    """The gateway on its embedded defaults: one simulator channel serving everything."""
    return await start_gateway()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=True) as session:
        yield session


@dataclass
class Process:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    admin_url: str | None = None  # a gateway's admin listener (/metrics, /readyz in detail)

    @property
    def admin(self) -> str:
        assert self.admin_url is not None, "no admin listener known for this process"
        return self.admin_url

    def rss_peak_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise RuntimeError("no VmHWM")


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 20.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited early:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status < 500:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"not ready in time:\n{log.read_text()[-3000:]}")


def _json_line(line: str) -> dict[str, Any]:
    try:
        parsed = json.loads(line)
    except ValueError:  # not a log record, or one still being written
        return {}
    return parsed if isinstance(parsed, dict) else {}


def wait_every_worker(log: Path, timeout: float = 20.0) -> None:
    """A supervisor is ready when each of its workers listens, not when the first answers: a
    worker still starting misses a SIGHUP sent then (it starts from the newer config instead)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [_json_line(line) for line in log.read_text().splitlines()]
        counts = [line["workers"] for line in lines if line.get("event") == "modelgate supervising workers"]
        if not counts:
            return  # one process, already answering
        listening = {line["pid"] for line in lines if str(line.get("event")).startswith("modelgate listening on")}
        if len(listening) >= counts[0]:
            return
        time.sleep(0.1)
    raise RuntimeError(f"not every worker listens in time:\n{log.read_text()[-3000:]}")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Process]]:
    """Start `modelgate` processes (gateways or simulators); all are stopped at the end.

    A gateway's admin listener goes on a free port of its own (`serve --admin-listen`), so
    gateways started side by side do not meet on the default 127.0.0.1:8081; a config that sets
    `admin_listen` itself keeps it, with `{ADMIN_PORT}` standing for that free port. A gateway is
    one process (`serve --workers 1`) unless its config names `workers`: three instances are three
    processes, not nine, each of which would pay the gateway's start."""
    started: list[Process] = []

    def run(kind: str, *args: str, config: str | None = None, ready_path: str = "/healthz") -> Process:
        port, admin_port = free_port(), free_port()
        log = tmp_path / f"{kind}-{port}.log"
        cmd = [sys.executable, "-m", "proxy"]
        admin_url: str | None = f"http://127.0.0.1:{admin_port}"
        if kind == "gateway":
            text = textwrap.dedent(config or "")
            cfg = tmp_path / f"gateway-{port}.yaml"
            cfg.write_text(text.replace("{PORT}", str(port)).replace("{ADMIN_PORT}", str(admin_port)))
            cmd += ["serve"]
            if "workers" not in text:  # one process: a test about workers names how many it wants
                cmd += ["--workers", "1"]
            if "admin_listen" not in text:
                cmd += ["--admin-listen", f"127.0.0.1:{admin_port}"]
            elif "{ADMIN_PORT}" not in text:
                admin_url = None  # off, or where the test put it
            cmd += ["-c", str(cfg)]  # last: tests find the config file there
        elif kind == "defaults":  # the gateway on its embedded defaults, as README's first command runs it
            cmd += ["serve", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}"]
        else:
            cmd += ["simulate", "--port", str(port), *args]
            ready_path = "/_sim/stats"
            admin_url = None
        proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent)
        url = f"http://127.0.0.1:{port}"
        process = Process(url, proc, log, admin_url)
        started.append(process)
        wait_ready(url + ready_path, proc, log)
        if kind == "gateway":
            wait_every_worker(log)
        return process

    yield run
    for process in started:
        if process.proc.poll() is None:
            process.proc.terminate()
    for process in started:
        try:
            process.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.proc.kill()


@pytest.fixture
async def redis_url() -> str:
    """A Redis database for the test, emptied first; skipped nowhere: .ci/run starts Redis."""
    return await _emptied_test_database()


async def _emptied_test_database() -> str:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    await client.flushdb()
    await client.aclose()
    return REDIS_URL


@pytest.fixture(scope="session")
def lone_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis server of this test process's own, for the tests that hold a server busy (a script
    running for seconds) or flush its scripts: on the shared server that would stall, or unload
    scripts under, the tests the other processes run meanwhile."""
    from tests.redis_topologies import RedisProcesses

    processes = RedisProcesses(tmp_path_factory.mktemp("lone-redis"))
    port = free_port()
    processes.start(port)
    yield f"redis://127.0.0.1:{port}/0"
    processes.stop()


@pytest.fixture
async def lone_redis(lone_redis_server: str) -> str:
    """`lone_redis_server`, emptied first."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(lone_redis_server)
    await client.flushall()
    await client.aclose()
    return lone_redis_server


POSTGRES = os.environ.get("MODELGATE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
async def ledger_db() -> AsyncIterator[str]:
    """A PostgreSQL database of the test's own (.ci/run starts a server when none answers), dropped after it."""
    import uuid

    import asyncpg

    name = f"mg_ledger_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(POSTGRES)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    yield POSTGRES.rsplit("/", 1)[0] + "/" + name
    admin = await asyncpg.connect(POSTGRES)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Redis Cluster of three primaries on loopback ports, for the session (tests/redis_topologies.py)."""
    from tests.redis_topologies import Cluster

    cluster = Cluster.start(tmp_path_factory.mktemp("redis-cluster"))
    yield cluster
    cluster.processes.stop()


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A primary, a replica and three sentinels, for the session; a test that fails it over makes its own."""
    from tests.redis_topologies import SentinelSetup

    setup = SentinelSetup.start(tmp_path_factory.mktemp("redis-sentinel"))
    yield setup
    setup.processes.stop()


@pytest.fixture(params=["single", "cluster", "sentinel"])
async def shared_redis(request: pytest.FixtureRequest) -> str:
    """state.url for each Redis topology in turn (one server, a Cluster, a Sentinel-named primary), emptied first."""
    if request.param == "single":
        return await _emptied_test_database()
    topology = request.getfixturevalue(f"redis_{request.param}")
    topology.flush()
    return topology.url
