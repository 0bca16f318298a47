"""Worker processes: N gateways sharing one port, one metrics view, limits that stay exact."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from proxy.config import ConfigError
from proxy.registry import parse_config
from tests.conftest import REDIS_URL
from tests.polling import within

KEY = "workers-key-0001"


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()]


def kill_one_worker(supervisor: int) -> tuple[int, int]:
    """SIGKILL the first worker and wait (10 s at most) for the supervisor to replace it; the pids
    of the killed one and the one left."""
    first, second = children(supervisor)
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = children(supervisor)
        if len(now) == 2 and first not in now:
            break
        time.sleep(0.1)
    return first, second


def worker_config(extra: str = "") -> str:
    return f"""
server: {{listen: "127.0.0.1:{{PORT}}", workers: 2}}
state: {{backend: redis, url: '{REDIS_URL}', prefix: 'workers-{os.getpid()}-{time.monotonic_ns()}:'}}
keys: [{{name: w, key: {KEY}, limits: {{rpm: 30}}}}]
channels: [{{name: sim, base_url: simulator}}]
observability: {{logging: {{access_log: false}}}}
{extra}
"""


def test_memory_state_with_two_workers_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config("server: {workers: 2}\n", {})
    assert any(
        p.startswith("server.workers: 2 workers cannot share the memory state backend") for p in refused.value.problems
    )


def test_url_delivery_with_several_workers_needs_shared_signing_keys() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config("state: {backend: redis}\nserver: {workers: 2}\nplugins: {url_delivery: {enabled: true}}\n", {})
    assert any(
        p.startswith("plugins.url_delivery.signing_keys: required with 2 workers") for p in refused.value.problems
    )


def test_unset_workers_with_memory_state_is_one_process() -> None:
    from proxy.config.model import worker_count

    assert worker_count(parse_config("", {})) == 1
    assert worker_count(parse_config("state: {backend: redis}\nserver: {workers: 3}", {})) == 3


async def test_two_workers_share_the_port_one_metrics_view_and_exact_limits(spawn, redis_url) -> None:
    gateway = spawn("gateway", config=worker_config())
    workers = children(gateway.proc.pid)
    assert len(workers) == 2
    statuses = []
    for _ in range(32):  # a fresh connection each time, so the kernel spreads them over both workers
        async with aiohttp.ClientSession() as http:
            async with http.post(
                gateway.url + "/v1/responses",
                headers={"Authorization": f"Bearer {KEY}"},
                json={"model": "respmodel-4o", "input": "hi"},
            ) as answer:
                statuses.append(answer.status)
    assert statuses.count(200) == 30 and statuses.count(429) == 2  # one limit, whichever worker answered

    async def all_counted() -> bool:
        async with aiohttp.ClientSession() as http:
            async with http.get(gateway.admin + "/metrics") as answer:
                text = await answer.text()
        found = re.findall(r'modelgate_requests_total\{[^}]*route="responses"[^}]*\} (\S+)', text)
        return sum(float(v) for v in found) == 32

    # Every worker's count, from whichever worker answered /metrics: each folds its own in within a second.
    await within(3, all_counted, "every worker's requests in one scrape")


async def test_a_worker_that_dies_is_replaced_and_sigterm_stops_them_all(spawn, redis_url) -> None:
    gateway = spawn("gateway", config=worker_config())
    first, second = kill_one_worker(gateway.proc.pid)
    assert len(children(gateway.proc.pid)) == 2 and second in children(gateway.proc.pid)
    gateway.proc.send_signal(signal.SIGTERM)
    assert gateway.proc.wait(timeout=30) == 0


def test_a_sigterm_handled_while_a_worker_starts_reaches_that_worker_too(monkeypatch, tmp_path) -> None:
    """The supervisor's handler can run inside Popen, before the new worker is listed (CI saw it
    wait out the whole drain timeout for a worker that never heard of the stop)."""
    import subprocess
    import sys

    from proxy.process import workers

    supervisor = workers.Supervisor(1, None, drain_timeout_s=30)
    real_popen = subprocess.Popen

    def popen_interrupted_by_sigterm(*_: object, **__: object) -> subprocess.Popen[bytes]:
        process = real_popen([sys.executable, "-c", "import time; time.sleep(60)"])
        supervisor._stop()  # the signal handler, run between Popen's bytecodes
        return process

    monkeypatch.setattr(workers.subprocess, "Popen", popen_interrupted_by_sigterm)
    supervisor._start(0)
    assert supervisor.workers[0].wait(timeout=10) == -signal.SIGTERM


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


async def test_a_second_gateway_on_a_served_port_refuses_to_start(spawn, redis_url) -> None:
    import subprocess
    import sys

    first = spawn("gateway", config=worker_config())
    port = first.url.rsplit(":", 1)[1]
    second = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).parent.parent,
    )
    assert second.returncode == 1 and "already served" in second.stdout + second.stderr
    async with aiohttp.ClientSession() as http:  # the first still serves every connection
        for _ in range(20):
            async with http.get(first.url + "/healthz") as answer:
                assert answer.status == 200


async def test_a_reload_is_counted_once_and_the_config_info_names_the_digest_in_use(spawn, redis_url, tmp_path) -> None:
    gateway = spawn("gateway", config=worker_config())
    config = next(tmp_path.glob("gateway-*.yaml"))
    config.write_text(config.read_text() + "\n# changed\n")
    gateway.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 15
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(gateway.admin + "/metrics") as answer:
                text = await answer.text()
            reloads = sum(float(v) for v in re.findall(r'modelgate_config_reloads_total\{outcome="ok"\} (\S+)', text))
            info = {d: float(v) for d, v in re.findall(r'modelgate_config_info\{digest="(\w+)"\} (\S+)', text)}
            if (reloads == 1 and sorted(info.values()) == [0.0, 1.0]) or time.monotonic() > deadline:
                break  # (each worker writes its own figures: both are read once every worker has reloaded)
            await asyncio.sleep(0.2)
    assert reloads == 1  # one SIGHUP to a gateway of two workers: one reload
    assert sorted(info.values()) == [0.0, 1.0], info  # the old digest 0, the new 1


async def test_a_worker_started_again_starts_from_the_last_good_config(spawn, redis_url, tmp_path) -> None:
    gateway = spawn("gateway", config=worker_config())
    config = next(tmp_path.glob("gateway-*.yaml"))
    config.write_text("server: oops\n")  # broken on disk; a reload is refused, the workers run on
    gateway.proc.send_signal(signal.SIGHUP)
    first, second = kill_one_worker(gateway.proc.pid)
    time.sleep(3)  # long enough for a replacement that could not start to have died, more than once
    assert gateway.proc.poll() is None and len(children(gateway.proc.pid)) == 2
    for _ in range(10):  # fresh connections reach both workers
        async with aiohttp.ClientSession() as fresh, fresh.get(gateway.url + "/healthz") as answer:
            assert answer.status == 200
