"""Hard limits on clients: header budget, connection count, and clients too slow to send,
answered in the endpoint's own error shape wherever the endpoint is known."""

from __future__ import annotations

import asyncio
import json
import socket

import yarl

from tests.conftest import DEMO_KEY, MESSAGE_HEADERS

MSG = MESSAGE_HEADERS
MESSAGE = {"model": "msgmodel-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
LIMITS = "server: {max_header_kb: 4, max_headers: 20, max_connections: 3, client_idle_s: 0.3, keepalive_timeout_s: 0.5}"


async def raw_request(url: str, head: bytes, body_parts: list[bytes] = (), pause_s: float = 0.0) -> tuple[int, bytes]:
    """Send bytes as given on a socket of its own; the status and body of what comes back."""
    address = yarl.URL(url)
    reader, writer = await asyncio.open_connection(address.host, address.port)
    try:
        writer.write(head)
        for part in body_parts:
            await asyncio.sleep(pause_s)
            writer.write(part)
        await writer.drain()
        head_bytes = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = next(
            (
                int(line.split(b":")[1])
                for line in head_bytes.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        body = await asyncio.wait_for(reader.readexactly(length), 10)
    finally:
        writer.close()
    return int(head_bytes.split(b" ", 2)[1]), body


async def test_headers_over_the_budget_are_a_431_in_the_message_format(start_gateway, http):
    gw = await start_gateway(LIMITS)
    padding = {f"x-pad-{n}": "v" * 400 for n in range(12)}  # each line fine, 5 KB together
    async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers={**MSG, **padding}) as answer:
        assert answer.status == 431
        error = await answer.json()
        assert error["error"]["code"] == "request_header_fields_too_large"
        assert "limit is 4 KB" in error["error"]["message"]
    assert len(gw.sim().requests) == 0


async def test_too_many_headers_are_a_431_in_the_content_format(start_gateway, http):
    gw = await start_gateway(LIMITS)
    many = {f"x-extra-{n}": "1" for n in range(25)}
    url = f"{gw.url}/v1beta/models/genmodel-2.0-flash:generateContent?key={DEMO_KEY}"
    async with http.post(url, json={"contents": [{"parts": [{"text": "hi"}]}]}, headers=many) as answer:
        assert answer.status == 431
        assert (await answer.json())["error"]["code"] == 431


async def test_a_header_line_past_the_parser_fence_is_a_431_in_json_without_a_500(start_gateway):
    gw = await start_gateway(LIMITS)
    status, body = await raw_request(
        gw.url, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-huge: " + b"a" * 8000 + b"\r\nContent-Length: 0\r\n\r\n"
    )
    assert status == 431  # refused by the parser, before the endpoint is known: the generic shape
    assert json.loads(body)["error"]["code"] == "request_header_fields_too_large" and b"aaaa" not in body


async def test_past_max_connections_a_request_gets_a_503_and_its_connection_closes(start_gateway, http):
    gw = await start_gateway(LIMITS.replace("keepalive_timeout_s: 0.5", "keepalive_timeout_s: 30"))
    address = yarl.URL(gw.url)
    idle = [await asyncio.open_connection(address.host, address.port) for _ in range(3)]
    await asyncio.sleep(0.05)
    async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
        assert answer.status == 503 and answer.headers["Retry-After"] == "1"
        assert (await answer.json())["error"]["code"] == "too_many_connections"
    for _, writer in idle:
        writer.close()
    await asyncio.sleep(0.05)
    async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MSG) as answer:
        assert answer.status == 200


async def test_idle_connections_past_the_limit_and_its_headroom_are_closed_as_accepted(start_gateway):
    gw = await start_gateway(LIMITS.replace("keepalive_timeout_s: 0.5", "keepalive_timeout_s: 30"))
    address = yarl.URL(gw.url)
    held = [await asyncio.open_connection(address.host, address.port) for _ in range(3 + 16)]  # limit + headroom
    reader, writer = await asyncio.open_connection(address.host, address.port)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # one more is closed, request or not
    assert gw.owner.connections.refused == 1
    for _, idle in [*held, (reader, writer)]:
        idle.close()


async def test_a_body_that_stops_arriving_is_a_408_in_the_message_format(start_gateway):
    gw = await start_gateway(LIMITS)
    body = json.dumps(MESSAGE).encode()
    head = (
        f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {DEMO_KEY}\r\nmsgapi-version: 2023-06-01\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    status, answer = await raw_request(gw.url, head + body[:10])  # and then nothing
    assert status == 408
    assert "stopped arriving" in json.loads(answer)["error"]["message"]
    assert len(gw.sim().requests) == 0


async def test_an_upload_that_stalls_midway_is_a_408_and_never_reaches_the_upstream_whole(start_gateway):
    gw = await start_gateway(LIMITS)
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 4096
    start = (
        b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nimagegen-2\r\n'
        b'--b\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nx\r\n'
        b'--b\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n'
        b"Content-Type: image/png\r\n\r\n" + png
    )
    end = b"\r\n--b--\r\n"
    head = (
        f"POST /v1/images/edits HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {DEMO_KEY}\r\n"
        f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {len(start) + len(end)}\r\n\r\n"
    ).encode()
    status, answer = await raw_request(gw.url, head + start)  # and then the client goes quiet
    assert status == 408
    assert "stopped arriving" in json.loads(answer)["error"]["message"]
    assert all(not r.body_sha256 for r in gw.sim().requests)  # the upstream never had it whole


async def test_a_connection_that_never_finishes_its_headers_is_closed(start_gateway):
    gw = await start_gateway(LIMITS)
    address = yarl.URL(gw.url)
    reader, writer = await asyncio.open_connection(address.host, address.port)
    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-")  # slowloris: never ends
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the gateway
    writer.close()


async def test_a_client_that_stops_reading_a_stream_is_cut_off(start_gateway):
    gw = await start_gateway(LIMITS)
    address = yarl.URL(gw.url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, soon full
    sock.connect((address.host, address.port))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)
    body = json.dumps({**MESSAGE, "stream": True}).encode()
    writer.write(
        (
            f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {DEMO_KEY}\r\nmsgapi-version: 2023-06-01\r\n"
            "x-sim-output-tokens: 100000\r\nx-sim-chunk-delay-ms: 0\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body
    )
    await writer.drain()
    await asyncio.sleep(3)  # reading nothing, while the gateway has megabytes to send
    tail = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 10):
            tail = (tail + chunk)[-4096:]
    except ConnectionResetError:
        pass
    writer.close()
    assert b"message_stop" not in tail  # cut off, not finished: the gateway stopped waiting on this client
