"""The gateway's upstream client over real sockets: framing, keep-alive, limits, timeouts, bodies.

Each upstream here is a scripted TCP server that answers with exact bytes, so every way an
HTTP/1.1 answer can be framed (or broken) is what the client meets.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.upstream import (BadAnswer, ConnectFailed, ConnectionLost, ConnectTimeout, InvalidRequest,
                            RequestBodyFailed, UpstreamPool, UpstreamTimeout)
from proxy.upstream.framing import Chunked, Fixed
from tests.scripted_upstream import OK, Scripted, scripted

async def read_all(pool: UpstreamPool, method: str = "POST", body: bytes = b"{}") -> tuple[int, bytes]:
    answer = await pool.request(method, "/v1/messages", {"Content-Type": "application/json"}, body)
    try:
        return answer.status, await answer.read()
    finally:
        answer.release()


async def test_content_length_answer_is_read_and_its_connection_reused() -> None:
    async with scripted([OK]) as upstream:
        pool = UpstreamPool(upstream.url)
        for _ in range(3):
            assert await read_all(pool) == (200, b'{"ok":true}')
        assert upstream.connections == 1
        assert pool.connections == 1
        await pool.close()


async def test_request_carries_host_length_and_only_the_given_headers() -> None:
    async with scripted([OK]) as upstream:
        pool = UpstreamPool(upstream.url + "/base")
        await read_all(pool, body=b'{"a":1}')
        head = upstream.requests[0].decode()
        port = upstream.url.rsplit(":", 1)[1]
        assert head.startswith("POST /base/v1/messages HTTP/1.1\r\n")
        fields = {line.split(": ", 1)[0] for line in head.split("\r\n\r\n")[0].split("\r\n")[1:]}
        assert fields == {"Host", "Content-Type", "Content-Length"}
        assert f"Host: 127.0.0.1:{port}\r\n" in head
        assert "Content-Length: 7\r\n" in head
        await pool.close()


async def test_get_without_body_sends_no_length() -> None:
    async with scripted([OK]) as upstream:
        pool = UpstreamPool(upstream.url)
        await read_all(pool, method="GET", body=b"")
        assert b"content-length" not in upstream.requests[0].lower()
        await pool.close()


async def test_chunked_answer_with_extensions_and_trailers() -> None:
    answer = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5;name=value\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: yes\r\n\r\n")
    async with scripted([answer]) as upstream:
        pool = UpstreamPool(upstream.url)
        assert await read_all(pool) == (200, b"hello world")
        assert await read_all(pool) == (200, b"hello world")
        assert upstream.connections == 1
        await pool.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=8), st.data())
def test_chunked_body_decodes_however_the_bytes_are_split(chunks: list[bytes], data: st.DataObject) -> None:
    wire = b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\nNEXT"
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=10)))
    framing, out, ended = Chunked(), [], -1
    start = 0
    for cut in [*cuts, len(wire)]:
        piece = wire[start:cut]
        if piece and ended < 0:
            end = framing.feed(piece, out)
            if end >= 0:
                ended = start + end
        start = cut
    assert b"".join(out) == b"".join(chunks)
    assert wire[ended:] == b"NEXT"


def test_fixed_length_body_stops_at_its_length() -> None:
    framing, out = Fixed(5), []
    assert framing.feed(b"abc", out) == -1
    assert framing.feed(b"deXYZ", out) == 2
    assert b"".join(out) == b"abcde"


async def test_answer_without_length_runs_until_close_and_is_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
        await writer.drain()
    async with Scripted(handler) as upstream:
        pool = UpstreamPool(upstream.url)
        assert await read_all(pool) == (200, b"all of it")
        assert await read_all(pool) == (200, b"all of it")
        assert upstream.connections == 2
        await pool.close()


async def test_head_answer_has_no_body_even_with_a_length() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: 1000\r\n\r\n"
    async with scripted([head, OK]) as upstream:
        pool = UpstreamPool(upstream.url)
        answer = await pool.request("HEAD", "/v1/videos/1/content", {})
        assert answer.content_length == 1000
        assert await answer.read() == b""
        answer.release()
        assert await read_all(pool) == (200, b'{"ok":true}')  # the same connection, framed right
        assert upstream.connections == 1
        await pool.close()


async def test_no_content_answer_has_no_body() -> None:
    async with scripted([b"HTTP/1.1 204 No Content\r\n\r\n", OK]) as upstream:
        pool = UpstreamPool(upstream.url)
        assert await read_all(pool) == (204, b"")
        assert await read_all(pool) == (200, b'{"ok":true}')
        await pool.close()


async def test_interim_answers_are_read_past() -> None:
    answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK
    async with scripted([answer]) as upstream:
        pool = UpstreamPool(upstream.url)
        assert await read_all(pool) == (200, b'{"ok":true}')
        await pool.close()


async def test_connection_close_answer_is_not_reused() -> None:
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    async with scripted([answer]) as upstream:
        pool = UpstreamPool(upstream.url)
        await read_all(pool)
        await read_all(pool)
        assert upstream.connections == 2
        await pool.close()


async def test_answer_released_unread_closes_its_connection() -> None:
    async with scripted([OK]) as upstream:
        pool = UpstreamPool(upstream.url)
        answer = await pool.request("GET", "/", {})
        answer.release()
        await read_all(pool)
        assert upstream.connections == 2
        await pool.close()


async def test_idle_connection_the_upstream_closed_is_replaced() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        await upstream.read_request(reader)
        writer.write(OK)
        await writer.drain()
        if number == 1:
            await upstream.read_request(reader)  # takes the second request, then drops the connection
            return
        while True:
            await upstream.read_request(reader)
            writer.write(OK)
            await writer.drain()
    async with Scripted(handler) as upstream:
        pool = UpstreamPool(upstream.url)
        assert await read_all(pool) == (200, b'{"ok":true}')
        assert await read_all(pool) == (200, b'{"ok":true}')
        assert upstream.connections == 2
        await pool.close()


async def test_fresh_connection_closed_before_answering_is_connection_lost() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
    async with Scripted(handler) as upstream:
        pool = UpstreamPool(upstream.url)
        with pytest.raises(ConnectionLost) as caught:
            await read_all(pool)
        assert not caught.value.answered
        assert upstream.connections == 1  # a new connection's failure is not retried
        await pool.close()


async def test_answer_cut_short_is_connection_lost() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        await writer.drain()
    async with Scripted(handler) as upstream:
        pool = UpstreamPool(upstream.url)
        answer = await pool.request("GET", "/", {})
        with pytest.raises(ConnectionLost):
            await answer.read()
        answer.release()
        await pool.close()


@pytest.mark.parametrize("answer", [
    b"HTTP/2 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n",
])
async def test_malformed_answer_is_bad_answer(answer: bytes) -> None:
    async with scripted([answer]) as upstream:
        pool = UpstreamPool(upstream.url)
        with pytest.raises(BadAnswer):
            await read_all(pool)
        await pool.close()


async def test_bad_chunk_size_fails_the_body() -> None:
    async with scripted([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]) as upstream:
        pool = UpstreamPool(upstream.url)
        answer = await pool.request("GET", "/", {})
        with pytest.raises(BadAnswer):
            await answer.read()
        answer.release()
        await pool.close()


async def test_refused_connection_is_connect_failed() -> None:
    async with scripted([OK]) as upstream:
        url = upstream.url
    pool = UpstreamPool(url)
    with pytest.raises(ConnectFailed) as caught:
        await read_all(pool)
    assert not isinstance(caught.value, TimeoutError)
    await pool.close()


async def test_tls_to_a_plain_server_is_connect_failed() -> None:
    async with scripted([OK]) as upstream:
        pool = UpstreamPool(upstream.url.replace("http://", "https://"), connect_s=2)
        with pytest.raises(ConnectFailed):
            await read_all(pool)
        await pool.close()


async def test_full_pool_makes_a_request_wait_for_a_released_connection() -> None:
    async with scripted([OK]) as upstream:
        pool = UpstreamPool(upstream.url, limit=1)
        first = await pool.request("GET", "/", {})
        second = asyncio.ensure_future(read_all(pool))
        await asyncio.sleep(0.05)
        assert not second.done()
        await first.read()
        first.release()
        assert await second == (200, b'{"ok":true}')
        assert upstream.connections == 1
        await pool.close()


async def test_full_pool_past_the_connect_timeout_is_connect_timeout() -> None:
    async with scripted([OK]) as upstream:
        pool = UpstreamPool(upstream.url, limit=1, connect_s=0.1)
        first = await pool.request("GET", "/", {})
        with pytest.raises(ConnectTimeout):
            await read_all(pool)
        first.close()
        assert await read_all(pool) == (200, b'{"ok":true}')  # the closed one's slot is free again
        await pool.close()


async def test_silent_upstream_is_a_first_byte_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        await asyncio.sleep(5)
    async with Scripted(handler) as upstream:
        pool = UpstreamPool(upstream.url, first_byte_s=0.1)
        with pytest.raises(UpstreamTimeout):
            await read_all(pool)
        assert pool.connections == 0
        await pool.close()


async def test_gap_in_the_body_past_idle_is_a_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await asyncio.sleep(5)
    async with Scripted(handler) as upstream:
        pool = UpstreamPool(upstream.url, idle_s=0.1)
        answer = await pool.request("GET", "/", {})
        assert await answer.readany() == b"abc"
        with pytest.raises(UpstreamTimeout):
            await answer.readany()
        answer.release()
        await pool.close()


async def test_total_timeout_ends_a_stream_that_keeps_talking() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)
    async with Scripted(handler) as upstream:
        pool = UpstreamPool(upstream.url, idle_s=1, total_s=0.3)
        answer = await pool.request("GET", "/", {})
        with pytest.raises(UpstreamTimeout):
            while await answer.readany():
                pass
        answer.release()
        await pool.close()


@pytest.mark.parametrize("headers", [{"X-Evil": "a\r\nX-Injected: 1"}, {"X-Evil": "a\nb"}, {"X-Evil\r\n": "a"}])
async def test_header_holding_a_line_break_is_refused(headers: dict[str, str]) -> None:
    async with scripted([OK]) as upstream:
        pool = UpstreamPool(upstream.url)
        with pytest.raises(InvalidRequest):
            await pool.request("GET", "/", headers)
        assert upstream.requests == []
        await pool.close()


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        await asyncio.sleep(0)
        yield part


async def test_streamed_body_is_chunked_without_a_declared_length() -> None:
    async with scripted([OK]) as upstream:
        pool = UpstreamPool(upstream.url)
        answer = await pool.request("POST", "/v1/images/edits", {}, chunks(b"part one, ", b"part two"))
        await answer.read()
        answer.release()
        request = upstream.requests[0]
        assert b"Transfer-Encoding: chunked\r\n" in request
        assert request.endswith(b"part one, part two")
        await pool.close()


async def test_streamed_body_with_a_declared_length_goes_as_is() -> None:
    async with scripted([OK]) as upstream:
        pool = UpstreamPool(upstream.url)
        answer = await pool.request("POST", "/", {"Content-Length": "6"}, chunks(b"abc", b"def"))
        await answer.read()
        answer.release()
        assert b"chunked" not in upstream.requests[0]
        assert upstream.requests[0].endswith(b"\r\n\r\nabcdef")
        await pool.close()


async def test_body_that_fails_mid_upload_fails_the_request() -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield b"a start"
        raise ValueError("the form broke a rule")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await reader.read(1 << 16)
        await asyncio.sleep(5)
    async with Scripted(handler) as upstream:
        pool = UpstreamPool(upstream.url)
        with pytest.raises(RequestBodyFailed, match="broke a rule"):
            await pool.request("POST", "/", {}, failing())
        assert pool.connections == 0
        await pool.close()


async def test_unread_body_pauses_the_socket_instead_of_filling_memory() -> None:
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
        pool = UpstreamPool(upstream.url)
        answer = await pool.request("GET", "/", {})
        await asyncio.sleep(0.3)
        assert not sent.is_set()  # the upstream is held back by the socket, not read into memory
        total = 0
        while chunk := await answer.readany():
            total += len(chunk)
        assert total == size
        answer.release()
        await pool.close()


async def test_idle_connections_are_closed_after_keepalive() -> None:
    async with scripted([OK]) as upstream:
        pool = UpstreamPool(upstream.url, keepalive_s=0.1)
        await read_all(pool)
        assert pool.connections == 1
        await asyncio.sleep(0.3)
        assert pool.connections == 0
        await read_all(pool)
        assert upstream.connections == 2
        await pool.close()


async def test_each_waiting_request_times_out_at_its_own_deadline() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await upstream.read_request(reader)
        await asyncio.sleep(5)
    async with Scripted(handler) as upstream:
        pool = UpstreamPool(upstream.url, first_byte_s=10)
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def timed(total_s: float) -> float:
            with pytest.raises(UpstreamTimeout):
                await pool.request("GET", "/", {}, total_s=total_s)
            return loop.time() - started
        late, early = await asyncio.gather(timed(0.6), timed(0.2))
        assert 0.2 <= early < late and late >= 0.6
        await pool.close()


async def test_chunks_override_a_length_and_the_connection_is_not_reused() -> None:
    answer = (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5\r\nhello\r\n0\r\n\r\n")
    async with scripted([answer]) as upstream:
        pool = UpstreamPool(upstream.url)
        answer_ = await pool.request("GET", "/", {})
        assert answer_.content_length is None
        assert await answer_.read() == b"hello"
        answer_.release()
        await read_all(pool)
        assert upstream.connections == 2
        await pool.close()


async def test_https_upstream_is_verified_and_reached(tmp_path) -> None:  # noqa: ANN001
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    upstream = scripted([OK])
    upstream.server = await asyncio.start_server(upstream._serve, "127.0.0.1", 0, ssl=server_tls)
    url = upstream.url.replace("http://", "https://")
    try:
        trusting = ssl.create_default_context(cafile=str(cert))
        pool = UpstreamPool(url, tls=trusting)
        assert await read_all(pool) == (200, b'{"ok":true}')
        assert await read_all(pool) == (200, b'{"ok":true}')
        assert upstream.connections == 1
        await pool.close()
        untrusting = UpstreamPool(url)  # the system's trust store has never heard of this certificate
        with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
            await read_all(untrusting)
        await untrusting.close()
    finally:
        await upstream.__aexit__()


async def test_switching_protocols_answer_is_final_and_its_connection_not_reused() -> None:
    async with scripted([b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", OK]) as upstream:
        pool = UpstreamPool(upstream.url)
        assert await read_all(pool) == (101, b"")
        await read_all(pool)
        assert upstream.connections == 2
        await pool.close()
