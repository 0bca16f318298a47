"""Rate limits: exact across instances, per key / model / route / IP, tokens from real usage, a clear 429."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import aiohttp
import pytest

from tests.conftest import free_port
from tests.redis_topologies import redis_server

KEY = "limited-key-01"
MSG = {"x-api-key": KEY, "msgapi-version": "2023-06-01"}
BEARER = {"Authorization": f"Bearer {KEY}"}
MESSAGE = {"model": "msgmodel-haiku-4-5", "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]}


def config(limits: str, extra: str = "", state: str = "") -> str:
    return f"""
keys: [{{name: limited, key: {KEY}, limits: {limits}}}, {{name: demo, key: sk-demo-key}}]
channels: [{{name: simulator, base_url: simulator, simulator: {{chunk_delay_ms: 0, output_tokens: 30}}}}]
{state}
{extra}
"""


REQUESTS = {
    "messages": ("/v1/messages", MSG, MESSAGE),
    "content": (
        f"/v1beta/models/genmodel-2.0-flash:generateContent?key={KEY}",
        {},
        {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 40}},
    ),
    "responses": ("/v1/responses", BEARER, {"model": "respmodel-4o", "input": "hi", "max_output_tokens": 40}),
}


async def post(http: aiohttp.ClientSession, url: str, fmt: str, stream: bool = False, headers: dict | None = None):
    path, base_headers, body = REQUESTS[fmt]
    if stream and fmt == "content":
        path = path.replace(":generateContent?", ":streamGenerateContent?alt=sse&")
    elif stream:
        body = {**body, "stream": True}
    async with http.post(url + path, json=body, headers={**base_headers, **(headers or {})}) as answer:
        return answer.status, dict(answer.headers), await answer.read()


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("messages", {"type": "rate_limit_error", "code": "rate_limited"}),
        ("content", {"code": 429, "status": "RESOURCE_EXHAUSTED"}),
        ("responses", {"type": "rate_limit_exceeded", "code": "rate_limited"}),
    ],
)
async def test_the_limit_answers_429_in_the_endpoint_shape_with_retry_after(start_gateway, http, fmt, expected):
    gw = await start_gateway(config("{rpm: 2}"))
    first = await post(http, gw.url, fmt)
    assert first[0] == 200
    assert first[1]["RateLimit-Policy"] == '"key-rpm";q=2;w=60'
    assert first[1]["RateLimit"].startswith('"key-rpm";r=1;t=')
    assert (await post(http, gw.url, fmt))[0] == 200
    status, headers, body = await post(http, gw.url, fmt)
    assert status == 429
    assert 1 <= int(headers["Retry-After"]) <= 60
    assert headers["RateLimit"].startswith('"key-rpm";r=0;')
    import json

    assert expected.items() <= json.loads(body)["error"].items()
    assert len(gw.sim().requests) == 2


@pytest.mark.parametrize("state", ["memory", "redis"])
async def test_the_headers_tell_the_tightest_window_even_when_the_lease_is_tighter(start_gateway, http, state):
    """A lease has no window to report: the headers tell the tightest quota there is (rpm here)."""
    if state == "redis":
        from tests.conftest import _emptied_test_database

        state = f'state: {{backend: redis, url: "{await _emptied_test_database()}"}}'
    else:
        state = ""
    gw = await start_gateway(config("{rpm: 1000, concurrent: 5}", state=state))
    status, headers, _ = await post(http, gw.url, "messages")
    assert status == 200
    assert headers["RateLimit-Policy"] == '"key-rpm";q=1000;w=60'
    assert headers["RateLimit"].startswith('"key-rpm";r=999;t=')


async def test_an_upstream_429_passes_through_with_its_retry_after(start_gateway, http):
    gw = await start_gateway(config("{rpm: 100}"))
    status, headers, body = await post(http, gw.url, "messages", headers={"x-sim-fault": "status=429"})
    assert status == 429 and headers["Retry-After"] == "7"
    assert b"simulated upstream fault 429" in body


@pytest.mark.parametrize("fmt", list(REQUESTS))
@pytest.mark.parametrize("stream", [False, True])
async def test_tokens_are_reserved_then_charged_from_reported_usage(start_gateway, http, fmt, stream):
    # Each request reserves its own maximum (40) plus its input estimate; usage then settles it
    # to about 30 + a few. Two fit in 100 only because the first was settled; the third does not.
    gw = await start_gateway(config("{tpm: 100}"))
    assert (await post(http, gw.url, fmt, stream))[0] == 200
    assert (await post(http, gw.url, fmt, stream))[0] == 200
    status, headers, body = await post(http, gw.url, fmt, stream)
    assert status == 429 and headers["RateLimit"].startswith('"key-tpm";r=0;')
    assert b"100 tokens per 60s; this request reserves" in body, "the refusal says a reservation is what did not fit"


async def test_calls_that_spend_no_tokens_reserve_none(start_gateway, http):
    gw = await start_gateway(config("{tpm: 100}"))
    count = {"model": "msgmodel-haiku-4-5", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(5):  # each would reserve the default 4096 were it a generation
        async with http.post(gw.url + "/v1/messages/count_tokens", json=count, headers=MSG) as answer:
            assert answer.status == 200 and "key-tpm" not in answer.headers.get("RateLimit", "")
        async with http.get(gw.url + "/v1/models", headers=BEARER) as answer:
            assert answer.status == 200
    assert (await post(http, gw.url, "messages"))[0] == 200  # the budget is whole


async def test_per_model_route_and_ip_limits(start_gateway, http):
    gw = await start_gateway(
        config(
            "{models: {'msgmodel-opus-*': {rpm: 1}}}",
            extra="plugins: {ratelimit: {routes: {responses: {rpm: 1}}, per_ip: {login_2fa: {rpm: 2}},"
            " trusted_proxies: ['127.0.0.1/32']}}",
        )
    )
    opus = {**MESSAGE, "model": "msgmodel-opus-4-5"}
    for expected in (200, 429):
        async with http.post(gw.url + "/v1/messages", json=opus, headers=MSG) as answer:
            assert answer.status == expected
    async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
        assert answer.status == 200  # another model is not limited
    statuses = []
    for key in (KEY, "sk-demo-key"):  # the route's limit counts every client together
        async with http.post(
            gw.url + "/v1/responses",
            json={"model": "respmodel-4o", "input": "x"},
            headers={"Authorization": f"Bearer {key}"},
        ) as answer:
            statuses.append(answer.status)
    assert statuses == [200, 429]
    for client, expected in (("198.51.100.7", [200, 200, 429]), ("198.51.100.8", [200])):
        got = []
        for _ in expected:
            async with http.post(
                gw.url + "/api/user/login/2fa", json={}, headers={"X-Forwarded-For": client}
            ) as answer:
                got.append(answer.status)
        assert got == expected


async def test_a_forwarded_hop_that_is_no_address_counts_as_its_proxy_and_fails_no_one_else(start_gateway, http):
    """Behind a trusted proxy that passes X-Forwarded-For on as sent, a hop of junk bytes (one
    UTF-8 cannot even hold, as aiohttp hands it over) is no client to count: the request counts
    as its proxy's. Made while other keys' checks share its round trip to Redis, it fails none."""
    from tests.conftest import _emptied_test_database
    from tests.raw_http import send_raw

    gw = await start_gateway(
        config(
            "{concurrent: 3}",
            # A check's own bound well above a loaded test machine's pauses: failing closed on a slow
            # Redis is not what this is about.
            state=f'state: {{backend: redis, url: "{await _emptied_test_database()}", check_timeout_s: 5}}',
            extra="plugins: {ratelimit: {per_ip: {login_2fa: {rpm: 1000}}, fail: closed,"
            " trusted_proxies: ['127.0.0.1/32']}}",
        )
    )
    junk = (
        b"POST /api/user/login/2fa HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
        b"X-Forwarded-For: \xff\xfe, 1.2.3.4x"
    )

    async def keyed() -> int:
        async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
            await answer.read()
            return answer.status

    found = await asyncio.gather(*(send_raw(gw.url, junk, b"{}") for _ in range(20)), *(keyed() for _ in range(3)))
    assert {a.status for a in found[:20]} <= {200, 502} and found[20:] == [200, 200, 200]
    assert [await keyed() for _ in range(4)] == [200] * 4  # and no lease was left behind
    client = redis_client()
    try:
        assert await client.zcard("modelgate:rl:ip:login_2fa:127.0.0.1:rpm") == 20
    finally:
        await client.aclose()


def redis_client():
    import redis.asyncio as aioredis

    from tests.conftest import REDIS_URL

    return aioredis.Redis.from_url(REDIS_URL)


async def test_the_sixth_concurrent_stream_is_refused_and_slots_free_again(start_gateway):
    gw = await start_gateway(config("{concurrent: 5}"))
    slow = {**MSG, "x-sim-chunk-delay-ms": "100", "x-sim-output-tokens": "30"}
    async with aiohttp.ClientSession() as http:
        streams = [
            await http.post(gw.url + "/v1/messages", json={**MESSAGE, "stream": True}, headers=slow) for _ in range(5)
        ]
        assert [s.status for s in streams] == [200] * 5
        async with http.post(gw.url + "/v1/messages", json={**MESSAGE, "stream": True}, headers=slow) as sixth:
            assert sixth.status == 429
            assert sixth.headers["RateLimit"] == '"key-concurrent";r=0;t=1'  # named, so listed among the policies
            assert sixth.headers["RateLimit-Policy"] == '"key-concurrent";q=5;qu="concurrent-requests"'
            assert "(5 requests at once)" in (await sixth.json())["error"]["message"]
        streams[0].close()  # a client that leaves frees its slot
        await streams[1].read()  # and so does a stream that ends
        await asyncio.sleep(0.3)
        again = [await http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MSG) for _ in range(2)]
        assert [a.status for a in again] == [200, 200]
        for answer in [*streams[2:], *again]:
            answer.close()


async def test_three_instances_sharing_redis_let_exactly_the_limit_through(spawn, shared_redis):
    sim = spawn("simulator", "--chunk-delay-ms", "0", "--output-tokens", "2")
    text = f"""
server: {{listen: "127.0.0.1:{{PORT}}"}}
state: {{backend: redis, url: "{shared_redis}"}}
observability: {{logging: {{access_log: false}}}}
keys: [{{name: limited, key: {KEY}, limits: {{rpm: 60}}}}]
channels: [{{name: up, base_url: "{sim.url}"}}]
"""
    gateways = [spawn("gateway", config=text) for _ in range(3)]
    limit = asyncio.Semaphore(48)

    async def one(http: aiohttp.ClientSession, index: int) -> int:
        async with limit:
            async with http.post(gateways[index % 3].url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
                await answer.read()
                return answer.status

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
        statuses = await asyncio.gather(*(one(http, i) for i in range(600)))
    assert statuses.count(200) == 60, statuses.count(200)  # 61 at most, by the issue; exactly 60 here
    assert statuses.count(429) == 540


@pytest.fixture
def own_redis(tmp_path):
    """A Redis this test may stop and start again."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    port = free_port()

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            redis_server(port, tmp_path),
            stdout=subprocess.DEVNULL,
        )
        import socket
        import time

        for _ in range(100):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return proc
            time.sleep(0.05)
        raise RuntimeError("redis did not start")

    state = {"proc": start()}

    def stop() -> None:
        state["proc"].terminate()
        state["proc"].wait(timeout=10)

    def restart() -> None:
        state["proc"] = start()

    yield f"redis://127.0.0.1:{port}/0", stop, restart
    if state["proc"].poll() is None:
        stop()


@pytest.mark.parametrize(("mode", "while_down"), [("open", 200), ("closed", 503)])
async def test_redis_stopped_mid_test_holds_the_mode_and_limits_resume(
    start_gateway, http, own_redis, mode, while_down
):
    url, stop, restart = own_redis
    gw = await start_gateway(
        config(
            "{rpm: 2}",
            extra=f"plugins: {{ratelimit: {{fail: {mode}}}}}",
            state=f"state: {{backend: redis, url: '{url}'}}",
        )
    )
    assert [(await post(http, gw.url, "responses"))[0] for _ in range(3)] == [200, 200, 429]
    stop()
    down = [(await post(http, gw.url, "responses"))[0] for _ in range(3)]
    assert down == [while_down] * 3
    restart()
    for _ in range(50):  # the client reconnects on its own
        status = (await post(http, gw.url, "responses"))[0]
        if status in (200, 429):
            break
        await asyncio.sleep(0.1)
    assert [status] + [(await post(http, gw.url, "responses"))[0] for _ in range(2)] == [200, 200, 429]
