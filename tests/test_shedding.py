"""Refusals on the connection while a worker sheds (proxy/process/shedding.py): the same answer as
aiohttp's way gives, in order, on a connection kept open; every case it does not take is left to
aiohttp's way, which answers it all the same; a request admitted there is decided once."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from prometheus_client import REGISTRY

from proxy.process.shedding import Endpoints
from proxy.wire.routes import ALIASES, ROUTES, ROUTES_BY_NAME
from tests.conftest import DEMO_KEY, RunningGateway

HOLD = {"x-sim-latency-ms": "3000"}
RESPONSE = b'{"model":"respmodel-4o","input":"hi"}'


def shed(route: str) -> float:
    return REGISTRY.get_sample_value("modelgate_requests_shed_total", {"route": route, "reason": "overloaded"}) or 0.0


def post(path: str, body: bytes = RESPONSE, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    return (
        b"POST "
        + path.encode()
        + b" HTTP/"
        + version
        + b"\r\nHost: gw\r\nAuthorization: Bearer sk-demo-key\r\n"
        + extra
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
    )


async def answers(reader: asyncio.StreamReader, count: int) -> list[tuple[bytes, dict[str, str], Any]]:
    """`count` answers read off a connection: status line, headers (names lowered), JSON body."""
    found = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        status, *lines = head.decode().split("\r\n")[:-2]
        headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines)}
        body = await reader.readexactly(int(headers["content-length"]))
        found.append((status.encode(), headers, json.loads(body)))
    return found


async def full(start_gateway) -> tuple[RunningGateway, aiohttp.ClientSession, asyncio.Future[Any]]:
    """A gateway holding the one request it admits: every other one is refused while it is held."""
    gw = await start_gateway("server: {max_in_flight: 1}\nobservability: {logging: {access_log: false}}\n")
    http = aiohttp.ClientSession()
    held = asyncio.ensure_future(
        http.post(
            gw.url + "/v1/responses",
            data=RESPONSE,
            headers={"Authorization": f"Bearer {DEMO_KEY}", "Content-Type": "application/json", **HOLD},
        )
    )
    for _ in range(500):
        if len(gw.sim().requests) == 1:
            return gw, http, held
        await asyncio.sleep(0.01)
    raise AssertionError("the held request never reached the upstream")


async def connect(gw: RunningGateway) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(gw.url)
    return await asyncio.open_connection(parts.hostname, parts.port)


@pytest.fixture
async def held_gateway(start_gateway):
    gw, http, held = await full(start_gateway)
    yield gw
    (await held).close()
    await http.close()


async def test_a_refusal_on_the_connection_is_the_one_aiohttp_s_way_gives(held_gateway: RunningGateway) -> None:
    """In each endpoint's shape, with Retry-After and a request id (the caller's own when safe),
    counted; only `Connection: close`, which aiohttp's way answers, tells them apart."""
    gw = held_gateway
    content = f"/v1beta/models/genmodel-2.0-flash:generateContent?key={DEMO_KEY}"
    before = {name: shed(name) for name in ("responses", "generate_content", "messages")}
    for path in ("/v1/responses", content, "/v1/messages"):
        reader, writer = await connect(gw)
        writer.write(post(path, extra=b"X-Request-Id: mine-1\r\n"))  # on the connection
        writer.write(post(path, extra=b"X-Request-Id: bad id\r\nConnection: close\r\n"))  # aiohttp's way
        (status, plain, body), (status_too, closing, body_too) = await answers(reader, 2)
        writer.close()
        assert status == status_too == b"HTTP/1.1 503 Service Unavailable"
        assert body == body_too and plain["retry-after"] == closing["retry-after"] == "1"
        assert plain["x-request-id"] == "mine-1" and len(closing["x-request-id"]) == 32
        assert set(closing) - set(plain) == {"connection"} and plain["content-type"] == closing["content-type"]
    assert shed("responses") - before["responses"] == 2 and shed("messages") - before["messages"] == 2
    assert shed("generate_content") - before["generate_content"] == 2
    assert len(gw.sim().requests) == 1


async def test_requests_sent_together_are_answered_in_order_on_a_connection_kept_open(start_gateway) -> None:
    gw, http, held = await full(start_gateway)
    reader, writer = await connect(gw)
    try:
        writer.write(b"".join(post("/v1/responses", extra=b"X-Request-Id: r-%d\r\n" % i) for i in range(20)))
        refused = await answers(reader, 20)
        assert [h["x-request-id"] for _, h, _ in refused] == [f"r-{i}" for i in range(20)]
        assert {s for s, _, _ in refused} == {b"HTTP/1.1 503 Service Unavailable"}
        (await held).close()
        while gw.owner.gateway.in_flight:
            await asyncio.sleep(0.01)
        writer.write(post("/v1/responses"))  # the same connection, once the worker has room: served
        [(status, _, body)] = await answers(reader, 1)
        assert status == b"HTTP/1.1 200 OK" and body["object"] == "response"
    finally:
        writer.close()
        await http.close()


@pytest.mark.parametrize("case", ["body still coming", "HTTP/1.0", "escaped path", "not an endpoint", "Expect"])
async def test_what_the_connection_does_not_decide_is_answered_aiohttp_s_way(
    held_gateway: RunningGateway, case: str
) -> None:
    reader, writer = await connect(held_gateway)
    try:
        if case == "body still coming":
            whole = post("/v1/responses")
            writer.write(whole[:-5])
            await asyncio.sleep(0.05)
            writer.write(whole[-5:])
        elif case == "HTTP/1.0":
            writer.write(post("/v1/responses", version=b"1.0"))
        elif case == "escaped path":
            writer.write(post("/v1/%72esponses"))
        elif case == "Expect":  # one aiohttp's way does not do: its 417 (refusals.py), never a 503 here
            writer.write(post("/v1/responses", extra=b"Expect: something-else\r\n"))
        else:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        [(status, headers, body)] = await answers(reader, 1)
        if case == "not an endpoint":
            assert status == b"HTTP/1.1 200 OK"  # never shed
        elif case == "Expect":
            assert status.startswith(b"HTTP/1.1 417") and body["error"]["code"] == "expectation_failed"
        else:  # an escaped path too: the router reads it unescaped, and refuses it the same
            assert status.endswith(b" 503 Service Unavailable") and body["error"]["code"] == "overloaded"
    finally:
        writer.close()


async def test_a_client_that_reads_no_answer_gets_every_one_once_it_does(held_gateway: RunningGateway) -> None:
    """Hundreds of requests sent without reading (below `keepalive_requests`, 1000, past which the
    connection closes): answers wait in a bounded buffer (past it, aiohttp's way waits for the
    client), and none is lost or out of order."""
    reader, writer = await connect(held_gateway)
    try:
        count = 900  # answers of 300 KB and more: several times SEND_BOUND
        writer.write(b"".join(post("/v1/responses", extra=b"X-Request-Id: q-%d\r\n" % i) for i in range(count)))
        await asyncio.sleep(0.5)  # the gateway answers into the socket meanwhile, unread
        got = await answers(reader, count)
        assert [h["x-request-id"] for _, h, _ in got] == [f"q-{i}" for i in range(count)]
    finally:
        writer.close()


async def test_a_request_admitted_on_its_connection_is_decided_once(start_gateway) -> None:
    """Half admitted: every other request on a connection is served, none refused twice."""
    gw = await start_gateway("observability: {logging: {access_log: false}}\n")
    gate = gw.owner.gateway.admission
    gate.stop()  # no probe: the share stays as set
    gate.share = 0.5
    reader, writer = await connect(gw)
    try:
        statuses = []
        for _ in range(8):
            writer.write(post("/v1/responses"))
            [(status, _, _)] = await answers(reader, 1)
            statuses.append(status.split(b" ")[1])
        assert statuses.count(b"200") == 4 and statuses.count(b"503") == 4
        assert gw.owner.gateway.admission.waiting == 0  # each admitted one was counted until its handler ran
    finally:
        writer.close()


def test_the_connection_finds_the_route_the_router_finds() -> None:
    endpoints = Endpoints((*ROUTES, *ALIASES))
    expected = {
        ("POST", "/v1/messages"): "messages",
        ("POST", "/v1beta/models/genmodel-2.0-flash:generateContent"): "generate_content",
        ("POST", "/v1/models/genmodel-2.0-flash:streamGenerateContent"): "stream_generate_content",
        ("GET", "/v1/videos/task_1/content"): "video_content",
        ("GET", "/v1beta/models/genmodel-2.0-flash"): "content_model",
        ("POST", "/api/stripe/webhook"): "payment_webhook",
        ("GET", "/v1/messages"): None,
        ("POST", "/v1/messages/"): None,
        ("POST", "/api/a/b/webhook"): None,
        ("HEAD", "/v1/videos/task_1/content"): None,  # aiohttp's way answers HEAD
    }
    found = {(method, path): endpoints.find(method, path) for method, path in expected}
    assert {key: route.name if route else None for key, route in found.items()} == expected
    assert found["POST", "/v1/messages"] is ROUTES_BY_NAME["messages"]


async def test_while_draining_a_refusal_closes_its_connection(held_gateway: RunningGateway) -> None:
    """Answers started during a drain say `Connection: close` (proxy/core/drain.py): the
    connection leaves refusals to aiohttp's way then."""
    drain = held_gateway.owner.drain
    drain.draining = True  # as SIGTERM sets it
    try:
        reader, writer = await connect(held_gateway)
        writer.write(post("/v1/responses"))
        [(status, headers, _)] = await answers(reader, 1)
        writer.close()
        assert status.endswith(b"503 Service Unavailable") and headers["connection"] == "close"
    finally:
        drain.draining = False


async def test_requests_read_in_one_turn_are_not_admitted_past_the_bound(start_gateway) -> None:
    """Admitted on their connections in the same turn of the loop, before any of their handlers
    runs: each counts against the bound from then, so the bound holds."""
    gw = await start_gateway("server: {max_in_flight: 4}\nobservability: {logging: {access_log: false}}\n")
    gate = gw.owner.gateway.admission
    gate.stop()
    async with aiohttp.ClientSession() as http:
        held = [
            asyncio.ensure_future(
                http.post(
                    gw.url + "/v1/responses",
                    data=RESPONSE,
                    headers={"Authorization": f"Bearer {DEMO_KEY}", "Content-Type": "application/json", **HOLD},
                )
            )
            for _ in range(3)
        ]
        for _ in range(500):
            if len(gw.sim().requests) == 3:
                break
            await asyncio.sleep(0.01)
        assert gw.owner.gateway.in_flight == 3
        gate.share = 0.999  # shedding, admitting nearly everything below the bound
        connections = [await connect(gw) for _ in range(10)]
        for _, writer in connections:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")  # each connection idle after one answer
        for reader, _ in connections:
            await answers_of_health(reader)
        for _, writer in connections:  # one write each, read by the gateway in the same turn
            writer.write(post("/v1/responses", extra=HOLD_HEADER))
        found = [(await answers(reader, 1))[0][0] for reader, _ in connections]
        assert found.count(b"HTTP/1.1 503 Service Unavailable") == 9, found  # room for one: the fourth
        for _, writer in connections:
            writer.close()
        for answer in held:
            (await answer).close()


HOLD_HEADER = b"x-sim-latency-ms: 1500\r\n"


async def answers_of_health(reader: asyncio.StreamReader) -> None:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
