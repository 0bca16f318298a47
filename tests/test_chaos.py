"""Partial failure without collapse: real processes, a real Redis the test stops, hangs and restarts,
a supervisor killed outright, and a drain shorter than the streams it ends."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.conftest import MESSAGE_HEADERS, Process, free_port
from tests.polling import within
from tests.redis_topologies import redis_server
from tests.test_workers import alive, children

KEY = "chaos-key-00001"
BEARER = {"Authorization": f"Bearer {KEY}"}
MSG = {"x-api-key": KEY, "msgapi-version": "2023-06-01"}


class Redis:
    """A redis-server of the test's own, which it stops, hangs and starts again (no persistence)."""

    def __init__(self, tmp_path) -> None:
        self.port = free_port()
        self.dir = tmp_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            redis_server(self.port, self.dir),
            stdout=subprocess.DEVNULL,
        )
        for _ in range(100):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.05)
        raise RuntimeError("redis did not start")

    def hang(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
async def redis(tmp_path) -> AsyncIterator[Redis]:
    server = Redis(tmp_path)
    await server.start()
    yield server
    server.stop()


def gateway_config(redis_url: str, upstream_url: str) -> str:
    return f"""
server: {{listen: "127.0.0.1:{{PORT}}", workers: 1}}  # an instance, one process: pins are kept per process
state: {{backend: redis, url: '{redis_url}', prefix: 'chaos:'}}
keys: [{{name: chaos, key: {KEY}, limits: {{rpm: 100000}}}}]
channels: [{{name: sim, base_url: '{upstream_url}'}}]
plugins: {{ratelimit: {{fail: open}}}}
observability: {{logging: {{access_log: false}}}}
"""


async def respond(http: aiohttp.ClientSession, url: str, previous: str | None = None) -> tuple[int, dict]:
    body = {"model": "respmodel-4o", "input": "hi", **({"previous_response_id": previous} if previous else {})}
    async with http.post(url + "/v1/responses", json=body, headers=BEARER) as answer:
        return answer.status, {**(await answer.json()), "retry_after": answer.headers.get("Retry-After")}


async def ready(http: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with http.get(url + "/readyz", timeout=aiohttp.ClientTimeout(total=1)) as answer:  # a probe's default
        return answer.status, await answer.json()


async def test_a_state_store_outage_degrades_clearly_and_heals(spawn, redis):
    upstream = spawn("simulator", "--chunk-delay-ms", "0", "--output-tokens", "4")  # one upstream behind both
    config = gateway_config(redis.url, upstream.url)
    a, b = spawn("gateway", config=config), spawn("gateway", config=config)
    async with aiohttp.ClientSession() as http:
        status, made_before = await respond(http, a.url)
        assert status == 200
        load = Load(http, [a.url, b.url])
        for stage in ("hung", "stopped"):
            load.start()
            redis.hang() if stage == "hung" else redis.stop()
            # Every instance stays ready, says why it is degraded, and answers at once.
            for gateway in (a, b):
                await within(10, lambda g=gateway: _store_down(http, g.admin))
                status, body = await ready(http, gateway.admin)
                assert status == 200 and body["state_store"] == "unreachable", (stage, body)
            # Requests keep flowing (limits fail open) ...
            for gateway in (a, b):
                assert (await respond(http, gateway.url))[0] == 200
            # ... a follow-up whose pin cannot be read is a retryable 503, never a "not found" ...
            status, refused = await respond(http, b.url, made_before["id"])
            assert status == 503 and refused["retry_after"] and refused["error"]["code"] == "state_unavailable"
            # ... and an id made now is followed where it was made, its pin kept until the store is back.
            status, made_during = await respond(http, a.url)
            assert status == 200
            followed = await respond(http, a.url, made_during["id"])
            assert followed[0] == 200, (stage, followed)
            _, body = await ready(http, a.admin)
            assert body["pending_pins"] >= 1
            redis.resume() if stage == "hung" else await redis.start()
            statuses = await load.stop()
            assert statuses and set(statuses) == {200}, (stage, statuses)  # nothing the load sent was refused
            for gateway in (a, b):
                await within(10, lambda g=gateway: _store_up(http, g.admin))
            await within(
                10, lambda made=made_during: _followed(http, b.url, made["id"])
            )  # written once the store answered
            if stage == "hung":  # the store kept its data: what was made before is followed again
                assert (await respond(http, b.url, made_before["id"]))[0] == 200


class Load:
    """Requests that follow no id, sent without pause to every instance while the store is away."""

    def __init__(self, http: aiohttp.ClientSession, urls: list[str]) -> None:
        self.http, self.urls = http, urls
        self.statuses: list[int] = []
        self.running = False
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.statuses, self.running = [], True
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while self.running:
            for url in self.urls:
                self.statuses.append((await respond(self.http, url))[0])

    async def stop(self) -> list[int]:
        """The statuses of every request sent, the last ones answered too (none is cut short)."""
        assert self.task is not None
        self.running = False
        await asyncio.wait_for(self.task, 30)
        return self.statuses


async def _store_down(http: aiohttp.ClientSession, url: str) -> bool:
    return (await ready(http, url))[1]["state_store"] == "unreachable"


async def _store_up(http: aiohttp.ClientSession, url: str) -> bool:
    return (await ready(http, url))[1]["state_store"] == "ok"


async def _followed(http: aiohttp.ClientSession, url: str, response_id: str) -> bool:
    return (await respond(http, url, response_id))[0] == 200


@pytest.mark.parametrize("reloaded", [False, True])
async def test_a_drain_ends_within_its_timeout_and_every_cut_stream_says_so(spawn, reloaded):
    gateway: Process = spawn(
        "gateway",
        config="""
server: {listen: "127.0.0.1:{PORT}", drain_timeout_s: 2}
channels: [{name: sim, base_url: simulator, simulator: {chunk_delay_ms: 200, output_tokens: 100}}]
""",
    )
    body = {
        "model": "msgmodel-haiku-4-5",
        "max_tokens": 200,
        "stream": True,
        "messages": [{"role": "user", "content": "a long story"}],
    }
    async with aiohttp.ClientSession() as http:

        async def stream() -> bytes:  # 100 events 200 ms apart: far longer than the drain
            async with http.post(gateway.url + "/v1/messages", json=body, headers=MESSAGE_HEADERS) as answer:
                assert answer.status == 200
                return await answer.read()

        streams = [asyncio.ensure_future(stream()) for _ in range(5)]
        await asyncio.sleep(1.0)  # all of them under way
        if reloaded:  # the streams run on the runtime a reload retired: the drain waits for them all the same
            gateway.proc.send_signal(signal.SIGHUP)
            await asyncio.sleep(0.3)
        started = time.monotonic()
        gateway.proc.send_signal(signal.SIGTERM)
        bodies = await asyncio.gather(*streams)
        code = await asyncio.to_thread(gateway.proc.wait, 10)
        took = time.monotonic() - started
    assert code == 0 and 1.0 < took < 2 + 1, took  # cut near the deadline, not at once; out by it
    for text in bodies:
        events = [e for e in text.decode().split("\n\n") if e.strip()]
        assert events[0].startswith("event: message_start")
        assert events[-1].startswith("event: error") and "server_shutting_down" in events[-1]
    log = gateway.log.read_text()
    assert "cutting open streams" in log


async def test_a_request_whose_body_is_still_arriving_at_sigterm_is_answered(spawn):
    gateway = spawn(
        "gateway",
        config='server: {listen: "127.0.0.1:{PORT}", drain_timeout_s: 5}\n'
        "channels: [{name: sim, base_url: simulator}]\n",
    )
    body = b'{"model":"respmodel-4o","input":"' + b"x" * 1000 + b'"}'
    reader, writer = await asyncio.open_connection("127.0.0.1", int(gateway.url.rsplit(":", 1)[1]))
    writer.write(
        b"POST /v1/responses HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sk-demo-key\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:500]
    )
    await writer.drain()
    await asyncio.sleep(0.3)
    gateway.proc.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.5)
    writer.write(body[500:])  # the rest of the body, after the drain began
    answer = await asyncio.wait_for(reader.read(-1), 10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" in answer.lower()
    assert await asyncio.to_thread(gateway.proc.wait, 10) == 0


async def test_a_long_lived_keep_alive_connection_is_told_to_close(spawn):
    gateway = spawn(
        "gateway",
        config='server: {listen: "127.0.0.1:{PORT}", keepalive_requests: 3}\n'
        "channels: [{name: sim, base_url: simulator}]\n",
    )
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        closes = []
        for _ in range(4):
            async with http.get(gateway.url + "/healthz") as answer:
                closes.append(answer.headers.get("Connection", "").lower())
    assert closes[:2] == ["", ""] and closes[2] == "close"  # the third answer on one connection says so


async def test_with_limits_failing_closed_readiness_follows_the_store_without_traffic(spawn, redis):
    upstream = spawn("simulator")
    gateway = spawn("gateway", config=gateway_config(redis.url, upstream.url).replace("fail: open", "fail: closed"))
    async with aiohttp.ClientSession() as http:
        assert (await ready(http, gateway.admin))[0] == 200
        redis.hang()
        try:
            await within(10, lambda: _status_is(http, gateway.admin, 503))  # no request needed to notice
            assert "fail is closed" in (await ready(http, gateway.admin))[1]["reasons"][0]
        finally:
            redis.resume()
        await within(10, lambda: _status_is(http, gateway.admin, 200))  # and none needed to recover


async def _status_is(http: aiohttp.ClientSession, url: str, status: int) -> bool:
    return (await ready(http, url))[0] == status


async def test_workers_die_within_a_second_of_a_supervisor_killed_by_sigkill(spawn, redis):
    gateway = spawn("gateway", config=gateway_config(redis.url, "simulator").replace("workers: 1", "workers: 2"))
    workers = children(gateway.proc.pid)
    assert len(workers) == 2
    gateway.proc.kill()
    gateway.proc.wait(timeout=5)
    deadline = time.monotonic() + 1.0  # no worker outlives its supervisor by more than a second
    while time.monotonic() < deadline and any(alive(pid) for pid in workers):
        await asyncio.sleep(0.02)
    assert not [pid for pid in workers if alive(pid)]
    async with aiohttp.ClientSession() as http:  # and nothing listens on the port any more
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(gateway.url + "/healthz")


async def test_after_a_cut_stream_a_retry_never_reaches_the_draining_gateway(spawn):
    gateway = spawn(
        "gateway",
        config="""
server: {listen: "127.0.0.1:{PORT}", drain_timeout_s: 2}
channels: [{name: sim, base_url: simulator, simulator: {chunk_delay_ms: 200, output_tokens: 100}}]
""",
    )
    body = {
        "model": "msgmodel-haiku-4-5",
        "max_tokens": 200,
        "stream": True,
        "messages": [{"role": "user", "content": "a long story"}],
    }
    headers = MESSAGE_HEADERS
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:  # one connection, reused
        async with http.post(gateway.url + "/v1/messages", json=body, headers=headers) as answer:
            await asyncio.sleep(0.5)
            gateway.proc.send_signal(signal.SIGTERM)
            text = (await answer.read()).decode()
        assert "server_shutting_down" in text.rsplit("\n\n", 2)[-2]
        # the client retries at once: a new connection is refused, not a stream that dies unannounced
        with pytest.raises(aiohttp.ClientConnectionError):
            async with http.post(gateway.url + "/v1/messages", json=body, headers=headers) as retry:
                await retry.read()
    assert await asyncio.to_thread(gateway.proc.wait, 10) == 0
