"""Upstream answers framed strictly: each malformed or ambiguous answer, as a raw-socket upstream
sends it, gets the client a clear status in its endpoint's shape, the connection it came on is
never reused, and the next request gets exactly its own answer.

Every case is also put to h11, the reference: where h11 refuses an answer, so does the gateway
(docs/architecture.md lists both verdicts).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import h11
import pytest

from proxy.upstream import BadAnswer, UpstreamPool
from proxy.upstream.parser import ResponseParser
from tests.conftest import MESSAGE_HEADERS
from tests.scripted_upstream import Scripted, first_then_numbered, numbered, read_all

MSG_HEADERS = {**MESSAGE_HEADERS, "Content-Type": "application/json"}
MESSAGE = {"model": "msgmodel-haiku-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
BIG = b"x" * 70_000


@dataclass(frozen=True)
class Case:
    name: str
    wire: bytes
    status: int  # what the client gets
    h11_refuses: bool  # h11's verdict on the same bytes
    close: bool = False  # the upstream closes the connection after sending `wire`


CASES = [
    Case(
        "two Transfer-Encoding lines",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
        b'Transfer-Encoding: identity\r\n\r\nb\r\n{"ok":true}\r\n0\r\n\r\n',
        502,
        True,
    ),
    Case("NUL in a header value", b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\nok", 502, True),
    Case("bare CR in a header value", b"HTTP/1.1 200 OK\r\nX-A: a\rb\r\nContent-Length: 2\r\n\r\nok", 502, True),
    Case("DEL in a header value", b"HTTP/1.1 200 OK\r\nX-A: a\x7fb\r\nContent-Length: 2\r\n\r\nok", 502, False),
    Case(
        "a Content-Length of 5,000 digits",
        b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\nok",
        502,
        True,
    ),
    Case("a 26-digit Content-Length", b"HTTP/1.1 200 OK\r\nContent-Length: " + b"1" * 26 + b"\r\n\r\nok", 502, True),
    Case(
        "a head over 64 KB in one read",
        b"HTTP/1.1 200 OK\r\nX-Big: " + BIG + b"\r\nContent-Length: 2\r\n\r\nok",
        502,
        False,
    ),
    Case(
        "an unsolicited 101",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        502,
        True,
    ),
    Case("a bare-LF head", b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", 502, False),
    Case(
        "whitespace in a chunk size",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2 \r\nok\r\n0\r\n\r\n",
        502,
        False,
    ),
    Case("LF-only chunk lines", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nok\n0\n\n", 502, False),
    Case(
        "1.2 MB of trailers",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n"
        + b"".join(b"X-T%d: %b\r\n" % (i, b"t" * 1000) for i in range(1200))
        + b"\r\n",
        502,
        False,
    ),
    Case(
        "Content-Length twice, the same",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
        502,
        False,
    ),
    Case(
        "Content-Length twice, conflicting",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
        502,
        True,
    ),
    Case(
        "Transfer-Encoding and Content-Length",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        502,
        False,
    ),
    Case(
        "Transfer-Encoding: gzip, chunked",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        502,
        True,
    ),
    Case("obs-fold", b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 2\r\n\r\nok", 502, False),
    Case("a space before a colon", b"HTTP/1.1 200 OK\r\nX-A : a\r\nContent-Length: 2\r\n\r\nok", 502, True),
    Case(
        "a chunk size that is not hex",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n",
        502,
        True,
    ),
    Case(
        "a huge chunk size",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nok\r\n",
        502,
        False,
    ),
    Case(
        "a negative chunk size",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\nok\r\n0\r\n\r\n",
        502,
        True,
    ),
    Case(
        "a chunk-size line of 70 KB",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;e=" + BIG + b"\r\nok\r\n0\r\n\r\n",
        502,
        False,
    ),
    Case("a truncated chunk", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nok", 502, True, close=True),
    Case("a close mid-head", b"HTTP/1.1 200 OK\r\nContent-Le", 502, True, close=True),
    Case("a close mid-body", b'HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n{"ok"', 502, True, close=True),
    Case(
        "100 and 103 before the answer",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n" + numbered(0),
        200,
        False,
    ),
    Case("a 204 with a body", b"HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\nok", 204, False),
    Case("a 304 with a body", b"HTTP/1.1 304 Not Modified\r\nContent-Length: 2\r\n\r\nok", 304, False),
    Case(
        "an answer longer than its Content-Length",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}EXTRA BYTES",
        200,
        False,
    ),
]


def h11_refuses(wire: bytes, method: bytes = b"POST", closes: bool = False) -> bool:
    """Whether h11, as a client that sent `method`, refuses these bytes as an answer."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method=method, target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
    client.send(h11.EndOfMessage())
    client.receive_data(wire)
    if closes:
        client.receive_data(b"")
    try:
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                return closes  # an answer cut short is refused once the connection closes
            if isinstance(event, h11.EndOfMessage):
                return False
    except h11.RemoteProtocolError:
        return True


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_h11_gives_the_verdict_the_table_records_and_the_gateway_refuses_what_it_refuses(case: Case) -> None:
    assert h11_refuses(case.wire, closes=case.close) is case.h11_refuses
    parser = ResponseParser("POST")
    try:
        parser.feed(case.wire)
        refused = not parser.done  # cut short: refused once the connection closes
    except BadAnswer:
        refused = True
    assert refused is (case.status >= 500)
    if case.h11_refuses:
        assert refused  # where the reference refuses, the gateway refuses too


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_each_answer_gets_its_status_and_the_next_request_its_numbered(start_gateway, http, case):
    async with first_then_numbered(case.wire, case.close) as upstream:
        gw = await start_gateway(
            f"channels: [{{name: odd, base_url: '{upstream.url}'}}]\n"
            "resilience: {max_attempts: 1}\n"
            "observability: {logging: {access_log: false}}\n"
        )
        async with http.post(gw.url + "/v1/messages", headers=MSG_HEADERS, json=MESSAGE) as answer:
            assert answer.status == case.status
            if case.status == 502:
                assert (await answer.json())["error"]["type"] == "server_error"
            else:
                await answer.read()
        for number in (2, 3):
            async with http.post(gw.url + "/v1/messages", headers=MSG_HEADERS, json=MESSAGE) as answer:
                assert answer.status == 200
                assert await answer.json() == {"answer": number}
        assert len(upstream.requests) == 3  # nothing was sent twice
        if case.status != 200 or b"EXTRA" in case.wire:
            assert upstream.connections >= 2  # the connection of a refused or overlong answer was not reused


async def test_a_slow_head_is_a_504_after_the_first_byte_timeout(start_gateway, http):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)

    async with Scripted(handler) as upstream:
        gw = await start_gateway(
            f"channels: [{{name: slow, base_url: '{upstream.url}', "
            "timeouts: {first_byte_s: 0.3}}]\n"
            "observability: {logging: {access_log: false}}\n"
        )
        async with http.post(gw.url + "/v1/messages", headers=MSG_HEADERS, json=MESSAGE) as answer:
            assert answer.status == 504
        assert len(upstream.requests) == 1


async def test_a_head_answer_with_a_body_is_read_as_no_body_and_its_connection_not_reused() -> None:
    async with first_then_numbered(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nbody", close=False) as upstream:
        pool = UpstreamPool(upstream.url)
        answer = await pool.request("HEAD", "/x", {})
        assert answer.status == 200 and answer.content_length == 4
        assert await answer.read() == b""
        answer.release()
        assert await read_all(pool, "GET", b"") == (200, b'{"answer":2}')
        assert upstream.connections == 2
        await pool.close()


async def test_a_head_answer_announcing_no_body_leaves_its_connection_fit_for_the_next_request() -> None:
    async with first_then_numbered(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", close=False) as upstream:
        pool = UpstreamPool(upstream.url)
        answer = await pool.request("HEAD", "/x", {})
        assert await answer.read() == b""
        answer.release()
        assert await read_all(pool, "GET", b"") == (200, b'{"answer":2}')
        assert upstream.connections == 1
        await pool.close()


async def test_a_bare_lf_head_fails_at_once_not_at_the_first_byte_timeout() -> None:
    async with first_then_numbered(b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", close=False) as upstream:
        pool = UpstreamPool(upstream.url, first_byte_s=30)
        with pytest.raises(BadAnswer):
            await asyncio.wait_for(pool.request("POST", "/x", {}, b"{}"), 2)
        await pool.close()


async def test_an_answer_that_cannot_be_written_is_a_logged_502_never_a_200(start_gateway, http, caplog):
    """... and the 502 is stamped like any answer the gateway makes: the request id the client
    sent, its size in the outcome."""
    async with first_then_numbered(numbered(1), close=False) as upstream:
        gw = await start_gateway(
            f"channels: [{{name: one, base_url: '{upstream.url}'}}]\n"
            "routes: {messages: {plugins: [auth, tests.recording_plugin:Recorder]}}\n"
            "observability: {logging: {access_log: false}}\n"
        )
        async with http.post(
            gw.url + "/v1/messages",
            headers={**MSG_HEADERS, "x-test-unwritable-header": "1", "X-Request-Id": "unwritable-1"},
            json=MESSAGE,
        ) as answer:
            assert answer.status == 502
            body = await answer.read()
            assert "cannot be written" in json.loads(body)["error"]["message"]
            assert "Injected" not in answer.headers
            assert answer.headers["X-Request-Id"] == "unwritable-1"
        from tests.recording_plugin import Recorder

        outcome = Recorder.finished[-1].outcome
        assert outcome.status == 502 and outcome.bytes_out == len(body)
        assert any("could not be written to the client" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "method, first",
    [
        ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"),
        ("GET", b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"),
        ("GET", b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n"),
    ],
)
async def test_a_body_announced_where_none_may_come_retires_the_connection(method: str, first: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        while True:
            await upstream.read_request(reader)
            if len(upstream.requests) == 1:
                writer.write(first)
                await writer.drain()
                await asyncio.sleep(0.02)
                writer.write(b"EVIL!")  # the announced body, late: it must not answer the next request
            else:
                writer.write(numbered(len(upstream.requests)))
            await writer.drain()

    async with Scripted(handler) as upstream:
        pool = UpstreamPool(upstream.url)
        answer = await pool.request(method, "/x", {})
        assert await answer.read() == b""
        answer.release()
        assert await read_all(pool, "GET", b"") == (200, b'{"answer":2}')
        assert upstream.connections == 2
        await pool.close()


@pytest.mark.parametrize(
    "wire",
    [
        numbered(0) + b"HTTP/1.1 404 NF\r\nSet-Cookie: session=victim\r\nContent-Length: 3\r\n\r\nbad",
        numbered(0) + b"HTTP/1.1 404 NF\r\nSet-Cookie: session=victim\r\n",
    ],
)
async def test_a_second_answer_in_the_same_read_never_replaces_the_first(wire: bytes) -> None:
    async with first_then_numbered(wire) as upstream:
        pool = UpstreamPool(upstream.url)
        answer = await pool.request("GET", "/x", {})
        assert answer.status == 200 and "set-cookie" not in answer.headers
        assert await answer.read() == b'{"answer":0}'
        answer.release()
        assert await read_all(pool, "GET", b"") == (200, b'{"answer":2}')
        assert upstream.connections == 2
        await pool.close()


@pytest.mark.parametrize(
    "interim",
    [
        b"HTTP/1.1 199 X\r\nContent-Length: 5\r\n\r\nEVIL!",
        b"HTTP/1.1 150 X\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nEVIL!\r\n0\r\n\r\n",
        b"HTTP/1.1 000 X\r\nContent-Length: 5\r\n\r\nEVIL!",
        b"HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ],
)
async def test_an_interim_answer_with_a_body_or_a_status_out_of_range_is_refused(interim: bytes) -> None:
    async with first_then_numbered(interim + numbered(0)) as upstream:
        pool = UpstreamPool(upstream.url)
        with pytest.raises(BadAnswer):
            answer = await pool.request("GET", "/x", {})
            await answer.read()
        if interim.startswith(b"HTTP/1.1"):
            assert h11_refuses(interim + numbered(0), method=b"GET")
        await pool.close()
