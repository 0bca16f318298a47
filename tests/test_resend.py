"""A request that may have reached an upstream is never sent twice on the transport's own initiative.

Two channels: the first a raw-socket upstream that commits one transport fault after it has
read the request, the second the simulator. Video submissions, the 2FA login and webhooks
reach an upstream at most once under every fault; chat fails over only where the table in
docs/resilience.md says it is safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from tests.conftest import BEARER
from tests.scripted_upstream import OK, Scripted

MSG = {"x-api-key": "sk-demo-key", "msgapi-version": "2023-06-01"}
ONCE_ONLY = {
    "video submission": ("/v1/video/generations", {"model": "videogen-3.0-generate-001", "prompt": "x"}, BEARER),
    "2FA login": ("/api/user/login/2fa", {"code": "123456"}, {}),
    "webhook": ("/api/stripe/webhook", {"id": "evt_1"}, {"Stripe-Signature": "t=1,v1=x"}),
}
Fault = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def close_without_answering(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    return None


async def close_mid_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"par')
    await writer.drain()


async def send_a_bad_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(5)


async def stay_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(5)


FAULTS: dict[str, Fault] = {
    "closed without answering": close_without_answering,
    "closed mid-answer": close_mid_answer,
    "a malformed answer": send_a_bad_answer,
    "no first byte": stay_silent,
}


def faulty(fault: Fault, *, warm_up: bool = False) -> Scripted:
    """Each request is read whole, then met with `fault`. With `warm_up`, the first request on
    each connection is answered and the second meets the fault (a reused connection)."""
    upstream: Scripted

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        if warm_up:
            await upstream.read_request(reader)
            writer.write(OK)
            await writer.drain()
        await upstream.read_request(reader)
        await fault(reader, writer)

    upstream = Scripted(handler)
    return upstream


def two_channels(url: str, extra: str = "") -> str:
    return (
        f"channels: [{{name: first, base_url: '{url}', priority: 0, timeouts: {{first_byte_s: 0.5}}}},\n"
        "           {name: second, base_url: simulator, priority: 1}]\n"
        "observability: {logging: {access_log: false}}\n" + extra
    )


@pytest.mark.parametrize("fault", FAULTS, ids=list(FAULTS))
@pytest.mark.parametrize("route", ONCE_ONLY, ids=list(ONCE_ONLY))
async def test_what_must_not_run_twice_reaches_an_upstream_at_most_once(start_gateway, http, route, fault):
    path, body, headers = ONCE_ONLY[route]
    async with faulty(FAULTS[fault]) as upstream:
        gw = await start_gateway(two_channels(upstream.url))
        async with http.post(gw.url + path, json=body, headers=headers) as answer:
            if fault == "closed mid-answer" and route != "video submission":
                # account answers are relayed as bytes: the head went out, the cut body ends the connection
                with pytest.raises(aiohttp.ClientPayloadError):
                    await answer.read()
            else:
                assert answer.status in (502, 503, 504)
                assert answer.headers["x-should-retry"] == "false"  # the official SDKs would send it again
        received = len(upstream.requests) + len(gw.sim("second").requests)
        assert received == 1


@pytest.mark.parametrize("route", ONCE_ONLY, ids=list(ONCE_ONLY))
async def test_a_reused_connection_closed_as_the_request_arrives_does_not_send_it_again(start_gateway, http, route):
    path, body, headers = ONCE_ONLY[route]
    async with faulty(close_without_answering, warm_up=True) as upstream:
        gw = await start_gateway(two_channels(upstream.url))
        async with http.post(gw.url + path, json=body, headers=headers) as answer:
            assert answer.status == 200  # the warm-up: the connection is now kept for reuse
        async with http.post(gw.url + path, json=body, headers=headers) as answer:
            assert answer.status in (502, 503)
        assert len(upstream.requests) == 2 and len(gw.sim("second").requests) == 0


async def test_a_refused_connection_fails_over_for_everything(start_gateway, http):
    gw = await start_gateway(two_channels("http://127.0.0.1:1"))
    for path, body, headers in ONCE_ONLY.values():
        async with http.post(gw.url + path, json=body, headers=headers) as answer:
            assert answer.status == 200, path  # nothing was written to the first channel
    assert len(gw.sim("second").requests) == 3


MESSAGE = {"model": "msgmodel-haiku-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}


async def test_chat_dropped_before_an_answer_is_not_sent_again_by_default(start_gateway, http):
    async with faulty(close_without_answering) as upstream:
        gw = await start_gateway(two_channels(upstream.url))
        async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
            assert answer.status == 502 and answer.headers["x-should-retry"] == "false"
            assert (await answer.json())["error"]["code"] == "upstream_unanswered"
        assert len(upstream.requests) == 1 and len(gw.sim("second").requests) == 0


async def test_a_request_that_never_reached_an_upstream_may_be_retried_by_the_client(start_gateway, http):
    gw = await start_gateway(
        "channels: [{name: gone, base_url: 'http://127.0.0.1:1'}]\nobservability: {logging: {access_log: false}}\n"
    )
    async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
        assert answer.status == 502 and answer.headers["x-should-retry"] == "true"
        error = (await answer.json())["error"]
    assert error["code"] == "upstream_unreachable" and "Error" not in error["message"]


@pytest.mark.parametrize("fault", ["closed without answering", "no first byte"])
async def test_chat_that_opts_in_fails_over_when_the_upstream_took_it_without_answering(
    start_gateway,
    http,
    fault,
):
    async with faulty(FAULTS[fault]) as upstream:
        gw = await start_gateway(two_channels(upstream.url, "routes: {messages: {failover_unanswered: true}}\n"))
        async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
            assert answer.status == 200
        assert len(upstream.requests) == 1 and len(gw.sim("second").requests) == 1


async def test_chat_with_a_broken_answer_is_not_sent_again_even_when_opted_in(start_gateway, http):
    async with faulty(close_mid_answer) as upstream:
        gw = await start_gateway(two_channels(upstream.url, "routes: {messages: {failover_unanswered: true}}\n"))
        async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
            assert answer.status == 502
        assert len(gw.sim("second").requests) == 0


async def test_only_chat_routes_may_opt_in(start_gateway):
    with pytest.raises(Exception, match="only chat routes"):
        await start_gateway(two_channels("http://127.0.0.1:1", "routes: {videos: {failover_unanswered: true}}\n"))


async def test_a_full_pool_is_a_503_of_its_own_and_never_opens_the_breaker(start_gateway, http):
    gw = await start_gateway(
        "channels: [{name: only, base_url: simulator, timeouts: {connect_s: 0.2},\n"
        "            pool: {max_connections: 1}, simulator: {chunk_delay_ms: 100}}]\n"
        "resilience: {breaker_failures: 2}\n"
        "observability: {logging: {access_log: false}}\n"
    )
    stream = await http.post(gw.url + "/v1/messages", json={**MESSAGE, "stream": True, "max_tokens": 30}, headers=MSG)
    assert stream.status == 200  # holds the channel's one connection
    for _ in range(4):
        async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
            assert answer.status == 503 and answer.headers["Retry-After"] == "1"
            assert answer.headers["x-should-retry"] == "true"
            error = (await answer.json())["error"]
            assert error["code"] == "upstream_pool_exhausted" and "connections" in error["message"]
    async with http.get(gw.admin + "/readyz") as ready:
        channel = (await ready.json())["channels"][0]
    assert channel["breaker"] == "closed" and channel["failures_in_a_row"] == 0
    async with http.get(gw.admin + "/metrics") as metrics:
        text = await metrics.text()
    assert 'modelgate_upstream_pool_exhausted_total{channel="only"} 4.0' in text
    stream.close()
