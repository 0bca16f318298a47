"""Resilience: failover before the first byte, circuit breakers, graceful drain."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest
from aiohttp import web

from proxy.config.model import SimulatorSettings
from proxy.policy.resilience import PROBE_LAPSE_S, ChannelHealth
from simulator import build_simulator_app
from simulator.core import Simulator
from tests.conftest import BEARER, DEMO_KEY, free_port

RESPONSE = {"model": "respmodel-4o", "input": "hi"}


def two_channels(first: str, extra: str = "") -> str:
    return f"""
channels:
  - {{name: first, {first}, priority: 0}}
  - {{name: second, base_url: simulator, priority: 1}}
{extra}
"""


async def test_an_upstream_500_on_one_channel_succeeds_on_the_other(start_gateway, http):
    gw = await start_gateway(two_channels("base_url: simulator, simulator: {fail_status: 500}"))
    async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
        assert answer.status == 200
    assert len(gw.sim("first").requests) == 1 and len(gw.sim("second").requests) == 1


async def test_a_refused_connection_fails_over_even_for_a_video_submission(start_gateway, http):
    gw = await start_gateway(two_channels("base_url: 'http://127.0.0.1:1'"))
    async with http.post(
        gw.url + "/v1/video/generations", headers=BEARER, json={"model": "videogen-3.0-generate-001", "prompt": "x"}
    ) as answer:
        assert answer.status == 200  # it provably never reached the first channel


async def test_a_video_submission_is_not_sent_twice_after_an_upstream_answered(start_gateway, http):
    gw = await start_gateway(two_channels("base_url: simulator, simulator: {fail_status: 500}"))
    async with http.post(
        gw.url + "/v1/video/generations", headers=BEARER, json={"model": "videogen-3.0-generate-001", "prompt": "x"}
    ) as answer:
        assert answer.status == 500  # the first channel may have started the task: no second one
    assert len(gw.sim("second").requests) == 0


async def test_429_fails_over_only_when_asked(start_gateway, http):
    for failover, expected in ((False, 429), (True, 200)):
        gw = await start_gateway(
            two_channels(
                "base_url: simulator, simulator: {fail_status: 429}",
                f"resilience: {{failover_on_429: {str(failover).lower()}}}",
            )
        )
        async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
            assert answer.status == expected


async def test_the_breaker_opens_after_failures_and_closes_after_recovery(start_gateway, http, clock):
    gw = await start_gateway(
        two_channels(
            "base_url: simulator, simulator: {fail_status: 503}",
            "resilience: {breaker_failures: 2, breaker_open_s: 30}",
        )
    )
    gw.channel("first").health.clock = clock
    for _ in range(5):
        async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
            assert answer.status == 200  # served by the second channel throughout
    assert len(gw.sim("first").requests) == 2  # open after two failures: not asked again
    assert await breakers(http, gw.admin) == {"first": "open", "second": "closed"}
    gw.sim("first").settings = SimulatorSettings()  # the first channel recovers
    clock.advance(29.9)
    assert await breakers(http, gw.admin) == {"first": "open", "second": "closed"}
    clock.advance(0.1)
    assert await breakers(http, gw.admin) == {"first": "half_open", "second": "closed"}
    async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
        assert answer.status == 200
    assert len(gw.sim("first").requests) == 3  # the half-open probe went there, and succeeded
    for _ in range(3):
        async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
            assert answer.status == 200
    assert len(gw.sim("first").requests) == 6  # closed again: priority 0 serves
    assert await breakers(http, gw.admin) == {"first": "closed", "second": "closed"}


async def breakers(http: aiohttp.ClientSession, url: str) -> dict[str, str]:
    async with http.get(url + "/readyz") as answer:
        assert answer.status == 200  # open breakers are reported, never a reason to leave the load balancer
        return {c["name"]: c["breaker"] for c in (await answer.json())["channels"]}


async def test_every_channel_open_is_a_fast_503(start_gateway, http):
    gw = await start_gateway(
        "channels: [{name: only, base_url: simulator, simulator: {fail_status: 500}}]\n"
        "resilience: {breaker_failures: 1, breaker_open_s: 30}"
    )
    async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
        assert answer.status == 500
    async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
        assert answer.status == 503 and answer.headers["Retry-After"] == "5"
        assert (await answer.json())["error"]["code"] == "no_healthy_channel"
    assert len(gw.sim("only").requests) == 1


async def test_sigterm_lets_fifty_open_streams_finish(spawn):
    sim = spawn("simulator", "--chunk-delay-ms", "100")
    gw = spawn(
        "gateway",
        config=f"""
        server: {{listen: "127.0.0.1:{{PORT}}"}}
        observability: {{logging: {{access_log: false}}}}
        channels: [{{name: up, base_url: "{sim.url}"}}]
    """,
    )
    body = {
        "model": "msgmodel-haiku-4-5",
        "max_tokens": 8,
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    headers = {"x-api-key": DEMO_KEY, "msgapi-version": "2023-06-01", "x-sim-output-tokens": "15"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as http:
        streams = await asyncio.gather(
            *(http.post(gw.url + "/v1/messages", json=body, headers=headers) for _ in range(50))
        )
        for answer in streams:
            await answer.content.readuntil(b"\n\n")
        gw.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        with pytest.raises(aiohttp.ClientConnectionError):  # no new connections while draining
            async with aiohttp.ClientSession() as fresh:
                await fresh.get(gw.url + "/healthz")
        endings = await asyncio.gather(*(answer.read() for answer in streams))
    assert all(ending.rstrip().endswith(b'data: {"type":"message_stop"}') for ending in endings)
    assert gw.proc.wait(timeout=20) == 0


async def test_a_1_gb_upload_is_refused_with_413_before_it_is_read(gateway):
    import time

    async def gigabyte():
        yield b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nimagegen-2\r\n'
        for _ in range(1024):
            yield b"\x00" * (1024 * 1024)

    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        try:
            async with http.post(
                gateway.url + "/v1/images/edits",
                data=gigabyte(),
                headers={**BEARER, "Content-Type": "multipart/form-data; boundary=b", "Content-Length": str(1024**3)},
            ) as answer:
                assert answer.status == 413
                assert "limit" in (await answer.json())["error"]["message"]
        except aiohttp.ClientOSError:
            pass  # the gateway answered and closed while the client was still sending: also refused
    assert time.monotonic() - started < 5  # far less than reading a gigabyte
    assert len(gateway.sim().requests) == 0


async def test_a_route_may_have_its_own_body_limit(start_gateway, http):
    gw = await start_gateway("routes: {payment_webhook: {max_body_mb: 0.001}}")  # about 1 KB
    big = b'{"event":"' + b"x" * 2000 + b'"}'
    async with http.post(gw.url + "/api/stripe/webhook", data=big) as answer:
        assert answer.status == 413
        assert "1048-byte limit" in (await answer.json())["error"]["message"]
    async with http.post(gw.url + "/v1/responses", headers=BEARER, json={**RESPONSE, "input": "x" * 2000}) as answer:
        assert answer.status == 200  # other routes keep the server's limit


async def test_an_undeclared_upload_over_the_limit_is_cut_off_with_413(start_gateway, http):
    gw = await start_gateway("server: {max_upload_mb: 1}")

    async def chunks():
        yield b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nimagegen-2\r\n'
        yield b'--b\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n\x89PNG\r\n\x1a\n'
        for _ in range(4):
            yield b"\x00" * (512 * 1024)
        yield b"\r\n--b--\r\n"

    async with http.post(
        gw.url + "/v1/images/edits",
        data=chunks(),
        headers={**BEARER, "Content-Type": "multipart/form-data; boundary=b"},
    ) as answer:
        assert answer.status == 413
    assert all(not r.body_sha256 for r in gw.sim().requests)  # the upstream never got a whole body


async def test_a_webhook_with_its_backend_down_is_a_503_so_the_provider_retries(start_gateway, http):
    gw = await start_gateway("channels: [{name: accounts, base_url: 'http://127.0.0.1:1', formats: [account]}]")
    async with http.post(
        gw.url + "/api/stripe/webhook", data=b'{"event":"paid"}', headers={"Stripe-Signature": "t=1,v1=abc"}
    ) as answer:
        assert answer.status == 503


async def test_an_active_health_check_takes_a_channel_out_before_any_request_fails(start_gateway, http):
    health = {"status": 503}
    sim = Simulator("first", SimulatorSettings())
    app = build_simulator_app(sim)
    app.router.add_get("/health", lambda _: web.Response(status=health["status"]))
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        gw = await start_gateway(
            two_channels(f"base_url: 'http://127.0.0.1:{port}', health_check: {{path: /health, interval_s: 0.05}}")
        )
        await until_health(http, gw.admin, "down")
        async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
            assert answer.status == 200
        assert len(sim.requests) == 0 and len(gw.sim("second").requests) == 1  # never tried, never failed
        health["status"] = 200
        await until_health(http, gw.admin, "up")
        async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
            assert answer.status == 200
        assert len(sim.requests) == 1  # back in rotation, and first by priority
    finally:
        await runner.cleanup()


async def until_health(http: aiohttp.ClientSession, url: str, state: str) -> None:
    async with asyncio.timeout(5):
        while True:
            async with http.get(url + "/readyz") as answer:
                if (await answer.json())["channels"][0].get("health_check") == state:
                    return
            await asyncio.sleep(0.02)


def test_one_probe_at_a_time_and_a_probe_that_never_reports_back_lapses(clock) -> None:
    health = ChannelHealth(failures_to_open=2, open_s=5, clock=clock)
    health.record(True)
    assert health.available()  # one failure in a row: still closed
    health.record(True)
    assert not health.available() and health.state() == ("open", 5.0)
    clock.advance(5)
    assert health.available() and health.state() == ("half_open", 0.0)
    health.chosen()
    assert not health.available()  # the probe is out: nobody else goes
    clock.advance(PROBE_LAPSE_S + 0.1)
    assert health.available()  # its client left without a word: another may probe
    health.chosen()
    health.record(True)
    assert health.state() == ("open", 5.0)  # a failed probe opens it again, for the whole pause
    clock.advance(5)
    health.record(False)
    assert health.up and health.state() == ("closed", 0.0)
