"""A scripted upstream: a TCP server that answers with exact bytes, for the client and the gateway's tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.upstream import UpstreamPool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'


class Scripted:
    """A TCP server that calls `handler(reader, writer, connection_number)` for each connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Scripted:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        # Run apart from the server's own callback task, so one cancelled at the end is not an error.
        task = asyncio.ensure_future(self.handler(reader, writer, self.connections))
        self._handlers.add(task)
        try:
            await asyncio.shield(task)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        """One request: its head, and a Content-Length or chunked body."""
        head = await reader.readuntil(b"\r\n\r\n")
        lower = head.lower()
        body = b""
        if b"content-length:" in lower:
            length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
        elif b"transfer-encoding: chunked" in lower:
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                body += (await reader.readexactly(size + 2))[:-2] if size else b""
                if not size:
                    await reader.readuntil(b"\r\n")
                    break
        self.requests.append(head + body)
        return head + body


def scripted(answers: list[bytes]) -> Scripted:
    """Each request on any connection gets the next of `answers`; the last one repeats."""
    upstream: Scripted

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        index = 0
        while True:
            await upstream.read_request(reader)
            writer.write(answers[min(index, len(answers) - 1)])
            await writer.drain()
            index += 1

    upstream = Scripted(handler)
    return upstream


def numbered(number: int) -> bytes:
    """An answer that says which request it answers: {"answer": number}."""
    body = b'{"answer":%d}' % number
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)


def first_then_numbered(first: bytes, close: bool = False) -> Scripted:
    """The first request, on whichever connection, gets `first` (and, with `close`, its connection
    is closed after it); every later request gets `numbered(n)`, n counting all requests."""
    upstream: Scripted
    count = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        nonlocal count
        while True:
            await upstream.read_request(reader)
            count += 1
            writer.write(first if count == 1 else numbered(count))
            await writer.drain()
            if count == 1 and close:
                return

    upstream = Scripted(handler)
    return upstream


async def read_all(
    pool: UpstreamPool, method: str = "POST", body: bytes = b"{}", path: str = "/v1/messages"
) -> tuple[int, bytes]:
    """One request through `pool`: its answer's status and whole body, the answer released."""
    answer = await pool.request(method, path, {"Content-Type": "application/json"}, body)
    try:
        return answer.status, await answer.read()
    finally:
        answer.release()
