"""The gateway's upstream client over real sockets: framing, keep-alive, limits, timeouts, bodies.

Each upstream here is a scripted TCP server that answers with exact bytes, so every way an
HTTP/1.1 answer can be framed (or broken) is what the client meets.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.upstream import (
    BadAnswer,
    ConnectFailed,
    ConnectionLost,
    InvalidRequest,
    PoolExhausted,
    RequestBodyFailed,
    UpstreamPool,
    UpstreamTimeout,
    Written,
)
from proxy.upstream.parser import ResponseParser
from tests.scripted_upstream import OK, Scripted, first_then_numbered, read_all, scripted


@pytest.fixture
async def pools() -> AsyncIterator[Callable[..., UpstreamPool]]:
    """Upstream pools made for one test, every one closed at its end, whatever happened in it."""
    made: list[UpstreamPool] = []

    def make(*args: Any, **kwargs: Any) -> UpstreamPool:
        made.append(UpstreamPool(*args, **kwargs))
        return made[-1]

    yield make
    for pool in made:
        await pool.close()


async def test_content_length_answer_is_read_and_its_connection_reused(pools) -> None:
    async with scripted([OK]) as upstream:
        pool = pools(upstream.url)
        for _ in range(3):
            assert await read_all(pool) == (200, b'{"ok":true}')
        assert upstream.connections == 1
        assert pool.connections == 1


async def test_request_carries_host_length_and_only_the_given_headers(pools) -> None:
    async with scripted([OK]) as upstream:
        pool = pools(upstream.url + "/base")
        await read_all(pool, body=b'{"a":1}')
        head = upstream.requests[0].decode()
        port = upstream.url.rsplit(":", 1)[1]
        assert head.startswith("POST /base/v1/messages HTTP/1.1\r\n")
        fields = {line.split(": ", 1)[0] for line in head.split("\r\n\r\n")[0].split("\r\n")[1:]}
        assert fields == {"Host", "Content-Type", "Content-Length"}
        assert f"Host: 127.0.0.1:{port}\r\n" in head
        assert "Content-Length: 7\r\n" in head


async def test_get_without_body_sends_no_length(pools) -> None:
    async with scripted([OK]) as upstream:
        pool = pools(upstream.url)
        await read_all(pool, method="GET", body=b"")
        assert b"content-length" not in upstream.requests[0].lower()


async def test_chunked_answer_with_extensions_and_trailers(pools) -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;name=value\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: yes\r\n\r\n"
    )
    async with scripted([answer]) as upstream:
        pool = pools(upstream.url)
        assert await read_all(pool) == (200, b"hello world")
        assert await read_all(pool) == (200, b"hello world")
        assert upstream.connections == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=8), st.data())
def test_chunked_body_decodes_however_the_bytes_are_split(chunks: list[bytes], data: st.DataObject) -> None:
    wire = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in chunks)
        + b"0\r\n\r\n"
    )
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=10)))
    parser, body, start = ResponseParser("POST"), b"", 0
    for cut in [*cuts, len(wire)]:
        if wire[start:cut]:
            parser.feed(wire[start:cut])
            body += b"".join(parser.take()[0])
        start = cut
    assert body == b"".join(chunks)
    assert parser.done and parser.reusable


def test_a_length_body_ends_at_its_length_and_bytes_past_it_spoil_the_connection() -> None:
    parser = ResponseParser("GET")
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc")
    assert not parser.done
    parser.feed(b"deXYZ")
    assert b"".join(parser.take()[0]) == b"abcde"
    assert parser.done and not parser.reusable


async def test_answer_without_length_runs_until_close_and_is_not_reused(pools) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
        await writer.drain()

    async with Scripted(handler) as upstream:
        pool = pools(upstream.url)
        assert await read_all(pool) == (200, b"all of it")
        assert await read_all(pool) == (200, b"all of it")
        assert upstream.connections == 2


async def test_head_answer_has_no_body_even_with_a_length(pools) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: 1000\r\n\r\n"
    async with first_then_numbered(head) as upstream:
        pool = pools(upstream.url)
        answer = await pool.request("HEAD", "/v1/videos/1/content", {})
        assert answer.content_length == 1000
        assert await answer.read() == b""
        answer.release()
        assert await read_all(pool) == (200, b'{"answer":2}')
        assert upstream.connections == 2  # a length where no body may come: the connection is retired


async def test_no_content_answer_has_no_body(pools) -> None:
    async with scripted([b"HTTP/1.1 204 No Content\r\n\r\n", OK]) as upstream:
        pool = pools(upstream.url)
        assert await read_all(pool) == (204, b"")
        assert await read_all(pool) == (200, b'{"ok":true}')


async def test_interim_answers_are_read_past(pools) -> None:
    answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK
    async with scripted([answer]) as upstream:
        pool = pools(upstream.url)
        assert await read_all(pool) == (200, b'{"ok":true}')


async def test_connection_close_answer_is_not_reused(pools) -> None:
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    async with scripted([answer]) as upstream:
        pool = pools(upstream.url)
        await read_all(pool)
        await read_all(pool)
        assert upstream.connections == 2


async def test_answer_released_unread_closes_its_connection(pools) -> None:
    async with scripted([OK]) as upstream:
        pool = pools(upstream.url)
        answer = await pool.request("GET", "/", {})
        answer.release()
        await read_all(pool)
        assert upstream.connections == 2


async def test_an_idle_connection_the_upstream_closed_is_never_written_to(pools) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        await upstream.read_request(reader)
        writer.write(OK)
        await writer.drain()
        if number == 1:
            return  # closes the connection while the pool holds it idle
        while True:
            await upstream.read_request(reader)
            writer.write(OK)
            await writer.drain()

    async with Scripted(handler) as upstream:
        pool = pools(upstream.url)
        assert await read_all(pool) == (200, b'{"ok":true}')
        await asyncio.sleep(0.05)  # the end of file reaches the socket
        assert await read_all(pool) == (200, b'{"ok":true}')
        assert upstream.connections == 2 and len(upstream.requests) == 2


async def test_a_connection_idle_a_second_is_asked_before_reuse_whether_the_upstream_closed_it(pools) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        while True:
            await upstream.read_request(reader)
            writer.write(OK)
            await writer.drain()
            if number == 1:
                return  # closes the first connection after its answer

    async with Scripted(handler) as upstream:
        pool = pools(upstream.url)
        assert await read_all(pool) == (200, b'{"ok":true}')
        kept = pool._idle[-1]
        assert kept.transport is not None
        kept.transport.pause_reading()  # the loop does not read it, so only the check can see the close
        await asyncio.sleep(0.1)
        assert not kept.closed and kept.readable()
        kept.idle_since -= 2.0  # as if idle two seconds
        assert await read_all(pool) == (200, b'{"ok":true}')
        assert upstream.connections == 2 and len(upstream.requests) == 2 and kept.closed


async def test_a_reused_connection_closed_after_the_request_is_not_resent(pools) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        await upstream.read_request(reader)
        writer.write(OK)
        await writer.drain()
        await upstream.read_request(reader)  # takes the second request, then drops the connection

    async with Scripted(handler) as upstream:
        pool = pools(upstream.url)
        assert await read_all(pool) == (200, b'{"ok":true}')
        with pytest.raises(ConnectionLost) as caught:
            await read_all(pool)
        assert (caught.value.written, caught.value.answered, caught.value.reused) == (Written.ALL, False, True)
        assert len(upstream.requests) == 2  # the pool sent it once; whether it goes again is not its call


async def test_an_upstream_keep_alive_timeout_retires_the_connection_before_it(pools) -> None:
    answer = b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=1\r\nContent-Length: 2\r\n\r\nok"
    async with scripted([answer]) as upstream:
        pool = pools(upstream.url)
        await read_all(pool)
        await read_all(pool)
        assert upstream.connections == 2  # timeout=1 less the second's margin: never kept idle


async def test_fresh_connection_closed_before_answering_is_connection_lost(pools) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)

    async with Scripted(handler) as upstream:
        pool = pools(upstream.url)
        with pytest.raises(ConnectionLost) as caught:
            await read_all(pool)
        assert not caught.value.answered and not caught.value.reused and caught.value.written is Written.ALL
        assert upstream.connections == 1


async def test_answer_cut_short_is_connection_lost(pools) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        await writer.drain()

    async with Scripted(handler) as upstream:
        pool = pools(upstream.url)
        answer = await pool.request("GET", "/", {})
        with pytest.raises(ConnectionLost):
            await answer.read()
        answer.release()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n",
    ],
)
async def test_malformed_answer_is_bad_answer(pools, answer: bytes) -> None:
    async with scripted([answer]) as upstream:
        pool = pools(upstream.url)
        with pytest.raises(BadAnswer):
            await read_all(pool)


async def test_bad_chunk_size_fails_the_body(pools) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # the head arrives alone; the broken chunk after it
        writer.write(b"zz\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with Scripted(handler) as upstream:
        pool = pools(upstream.url)
        answer = await pool.request("GET", "/", {})
        with pytest.raises(BadAnswer):
            await answer.read()
        answer.release()


async def test_a_bad_body_in_the_same_read_as_its_head_fails_the_request(pools) -> None:
    async with scripted([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]) as upstream:
        pool = pools(upstream.url)
        with pytest.raises(BadAnswer):
            await pool.request("GET", "/", {})


async def test_refused_connection_is_connect_failed(pools) -> None:
    async with scripted([OK]) as upstream:
        url = upstream.url
    pool = pools(url)
    with pytest.raises(ConnectFailed) as caught:
        await read_all(pool)
    assert not isinstance(caught.value, TimeoutError) and caught.value.written is Written.NOTHING


async def test_tls_to_a_plain_server_is_connect_failed(pools) -> None:
    async with scripted([OK]) as upstream:
        pool = pools(upstream.url.replace("http://", "https://"), connect_s=2)
        with pytest.raises(ConnectFailed):
            await read_all(pool)


async def test_full_pool_makes_a_request_wait_for_a_released_connection(pools) -> None:
    async with scripted([OK]) as upstream:
        pool = pools(upstream.url, max_connections=1)
        first = await pool.request("GET", "/", {})
        second = asyncio.ensure_future(read_all(pool))
        await asyncio.sleep(0.05)
        assert not second.done()
        await first.read()
        first.release()
        assert await second == (200, b'{"ok":true}')
        assert upstream.connections == 1


async def test_full_pool_past_the_connect_timeout_is_pool_exhausted(pools) -> None:
    async with scripted([OK]) as upstream:
        pool = pools(upstream.url, max_connections=1, connect_s=0.1)
        first = await pool.request("GET", "/", {})
        with pytest.raises(PoolExhausted) as caught:
            await read_all(pool)
        assert caught.value.written is Written.NOTHING
        first.close()
        assert await read_all(pool) == (200, b'{"ok":true}')  # the closed one's slot is free again


async def test_silent_upstream_is_a_first_byte_timeout(pools) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        await asyncio.sleep(5)

    async with Scripted(handler) as upstream:
        pool = pools(upstream.url, first_byte_s=0.1)
        with pytest.raises(UpstreamTimeout):
            await read_all(pool)
        assert pool.connections == 0


async def test_gap_in_the_body_past_idle_is_a_timeout(pools) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    async with Scripted(handler) as upstream:
        pool = pools(upstream.url, idle_s=0.1)
        answer = await pool.request("GET", "/", {})
        assert await answer.readany() == b"abc"
        with pytest.raises(UpstreamTimeout):
            await answer.readany()
        answer.release()


async def test_total_timeout_ends_a_stream_that_keeps_talking(pools) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)

    async with Scripted(handler) as upstream:
        pool = pools(upstream.url, idle_s=1, total_s=0.3)
        answer = await pool.request("GET", "/", {})
        with pytest.raises(UpstreamTimeout):
            while await answer.readany():
                pass
        answer.release()


@pytest.mark.parametrize("headers", [{"X-Evil": "a\r\nX-Injected: 1"}, {"X-Evil": "a\nb"}, {"X-Evil\r\n": "a"}])
async def test_header_holding_a_line_break_is_refused(pools, headers: dict[str, str]) -> None:
    async with scripted([OK]) as upstream:
        pool = pools(upstream.url)
        with pytest.raises(InvalidRequest):
            await pool.request("GET", "/", headers)
        assert upstream.requests == []


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        await asyncio.sleep(0)
        yield part


async def test_streamed_body_is_chunked_without_a_declared_length(pools) -> None:
    async with scripted([OK]) as upstream:
        pool = pools(upstream.url)
        answer = await pool.request("POST", "/v1/images/edits", {}, chunks(b"part one, ", b"part two"))
        await answer.read()
        answer.release()
        request = upstream.requests[0]
        assert b"Transfer-Encoding: chunked\r\n" in request
        assert request.endswith(b"part one, part two")


async def test_streamed_body_with_a_declared_length_goes_as_is(pools) -> None:
    async with scripted([OK]) as upstream:
        pool = pools(upstream.url)
        answer = await pool.request("POST", "/", {"Content-Length": "6"}, chunks(b"abc", b"def"))
        await answer.read()
        answer.release()
        assert b"chunked" not in upstream.requests[0]
        assert upstream.requests[0].endswith(b"\r\n\r\nabcdef")


async def test_body_that_fails_mid_upload_fails_the_request(pools) -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield b"a start"
        raise ValueError("the form broke a rule")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await reader.read(1 << 16)
        await asyncio.sleep(5)

    async with Scripted(handler) as upstream:
        pool = pools(upstream.url)
        with pytest.raises(RequestBodyFailed, match="broke a rule"):
            await pool.request("POST", "/", {}, failing())
        assert pool.connections == 0


async def test_unread_body_pauses_the_socket_instead_of_filling_memory(pools) -> None:
    size = 8 * 1024 * 1024

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()
        sent.set()

    sent = asyncio.Event()
    async with Scripted(handler) as upstream:
        pool = pools(upstream.url)
        answer = await pool.request("GET", "/", {})
        await asyncio.sleep(0.3)
        assert not sent.is_set()  # the upstream is held back by the socket, not read into memory
        total = 0
        while chunk := await answer.readany():
            total += len(chunk)
        assert total == size
        answer.release()


async def test_idle_connections_are_closed_after_keepalive(pools) -> None:
    async with scripted([OK]) as upstream:
        pool = pools(upstream.url, keepalive_s=0.1)
        await read_all(pool)
        assert pool.connections == 1
        await asyncio.sleep(0.3)
        assert pool.connections == 0
        await read_all(pool)
        assert upstream.connections == 2


async def test_each_waiting_request_times_out_at_its_own_deadline(pools) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        await asyncio.sleep(5)

    async with Scripted(handler) as upstream:
        pool = pools(upstream.url, first_byte_s=10)
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def timed(total_s: float) -> float:
            with pytest.raises(UpstreamTimeout):
                await pool.request("GET", "/", {}, total_s=total_s)
            return loop.time() - started

        late, early = await asyncio.gather(timed(0.6), timed(0.2))
        assert 0.2 <= early < late and late >= 0.6


async def test_a_length_beside_chunks_is_refused_and_the_connection_not_reused(pools) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    async with first_then_numbered(answer) as upstream:
        pool = pools(upstream.url)
        with pytest.raises(BadAnswer):
            await pool.request("GET", "/", {})  # how requests get smuggled: neither framing is trusted
        assert await read_all(pool) == (200, b'{"answer":2}')
        assert upstream.connections == 2


async def test_https_upstream_is_verified_and_reached(pools, tmp_path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    upstream = scripted([OK])
    upstream.server = await asyncio.start_server(upstream._serve, "127.0.0.1", 0, ssl=server_tls)
    url = upstream.url.replace("http://", "https://")
    try:
        trusting = ssl.create_default_context(cafile=str(cert))
        pool = pools(url, tls=trusting)
        assert await read_all(pool) == (200, b'{"ok":true}')
        assert await read_all(pool) == (200, b'{"ok":true}')
        assert upstream.connections == 1
        untrusting = pools(url)  # the system's trust store has never heard of this certificate
        with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
            await read_all(untrusting)
    finally:
        await upstream.__aexit__()


async def test_an_unasked_switching_protocols_answer_is_refused_and_its_connection_not_reused(pools) -> None:
    async with first_then_numbered(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n") as upstream:
        pool = pools(upstream.url)
        with pytest.raises(BadAnswer):
            await read_all(pool)
        assert await read_all(pool) == (200, b'{"answer":2}')
        assert upstream.connections == 2


async def test_a_connection_handed_to_a_request_whose_client_just_left_is_not_lost(pools) -> None:
    async with scripted([OK]) as upstream:
        pool = pools(upstream.url, max_connections=1, connect_s=0.5)
        first = await pool.request("GET", "/", {})
        await first.read()
        waiting = asyncio.ensure_future(read_all(pool))
        await asyncio.sleep(0.05)
        first.release()  # hands the connection over ...
        waiting.cancel()  # ... to a request whose client goes away in the same moment
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await asyncio.wait_for(read_all(pool), 1) == (200, b'{"ok":true}')  # it went back to the pool
