"""Accounting goes by the gateway's id, and a trickled body cannot hold a request open.
(docs/security.md; each numbered case is an attack that once worked, replayed through real sockets
against an upstream that records the exact request line it was sent.)"""

from __future__ import annotations

import asyncio

import pytest

from tests.raw_http import send_raw
from tests.security_cases import (  # noqa: F401 (fixtures, taken by name)
    ALICE,
    bearer,
    config,
    gw,
    post,
    upstream,
)


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_10_a_repeated_request_id_does_not_escape_the_rate_limit(start_gateway, upstream, redis_url, backend):
    gw = await start_gateway(
        config(
            upstream[0].url,
            f'state: {{backend: {backend}, url: "{redis_url}"}}',
            keys=f"[{{name: limited, key: {ALICE}, limits: {{rpm: 20}}}}]",
        )
    )
    statuses = []
    for _ in range(30):
        answer = await send_raw(
            gw.url,
            *post(
                "/v1/responses",
                bearer(ALICE) + "X-Request-Id: same-id-every-time\r\n",
                b'{"model":"respmodel-4o","input":"x"}',
            ),
        )
        statuses.append(answer.status)
        assert answer.headers["x-request-id"] == "same-id-every-time"  # still echoed, for correlation
    assert statuses.count(200) == 20 and statuses.count(429) == 10


async def test_11_a_trickled_body_meets_the_routes_body_deadline(start_gateway, upstream):
    gw = await start_gateway(
        config(upstream[0].url, "routes: {messages: {body_timeout_s: 1.0}}\nserver: {client_idle_s: 5}")
    )
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {ALICE}\r\nmsgapi-version: 2023-06-01\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n".encode()
    )
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def trickle() -> None:
        for _ in range(40):  # a byte every 0.25 s: never idle for client_idle_s, never done
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.25)

    trickling = asyncio.ensure_future(trickle())
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 8)
    finally:
        trickling.cancel()
        writer.close()
    assert head.startswith(b"HTTP/1.1 408")
    assert loop.time() - started < 4
    assert upstream[1] == []
