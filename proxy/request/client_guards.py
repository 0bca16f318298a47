"""Limits on what one client may hold or send: connections, header bytes, silence mid-body,
and a streamed answer it has stopped reading.

The HTTP parser keeps its own outer fence (no single header line longer than the whole header
budget, at most twice `max_headers` lines), refused with a bare 400 before any endpoint is
known. Inside that fence the gateway answers in the endpoint's own error shape: 431 for
headers over budget, 503 once `max_connections` are open, 408 for a body that stops
arriving. A connection that never finishes its headers is closed after
`keepalive_timeout_s`, as an idle keep-alive connection is.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from proxy.config.model import ServerConfig
from proxy.observability.metrics import CONNECTIONS_REFUSED


class ConnectionCount:
    """Client connections open right now, counted as aiohttp's server makes and loses them.

    Past `max_connections` a request gets a 503 in its endpoint's shape and its connection is
    closed. Connections that never send a request would not meet that check, so past the limit
    plus some headroom a new connection is closed as it is accepted: descriptors stay bounded."""

    __slots__ = ("open", "refused")

    def __init__(self) -> None:
        self.open = 0
        self.refused = 0

    def watch(self, server: web.Server, max_connections: int) -> None:
        made, lost = server.connection_made, server.connection_lost
        hard_cap = max_connections + max(16, max_connections // 10)

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            self.open += 1
            made(handler, transport)
            if self.open > hard_cap:
                self.refused += 1
                CONNECTIONS_REFUSED.inc()
                transport.close()

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            self.open -= 1
            lost(handler, exc)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]


def parser_limits(config: ServerConfig) -> dict[str, int]:
    """The HTTP parser's outer fence, passed to aiohttp's request handler."""
    budget = config.max_header_kb * 1024
    return {"max_line_size": budget, "max_field_size": budget, "max_headers": 2 * config.max_headers}


def header_problem(request: web.Request, config: ServerConfig) -> str | None:
    """Why a request's headers are over the budget, or None."""
    raw = request.raw_headers
    if len(raw) > config.max_headers:
        return f"{len(raw)} request headers; the limit is {config.max_headers}"
    size = len(request.raw_path) + sum(len(name) + len(value) + 4 for name, value in raw)
    if size > config.max_header_kb * 1024:
        return f"request headers of {size} bytes; the limit is {config.max_header_kb} KB"
    return None


class ReaderWatch:
    """Cuts off a client that has stopped reading a streamed answer.

    A client that keeps its connection open but reads nothing would otherwise hold its handler,
    and the upstream stream behind it, for as long as it likes. Every `idle_s` one timer looks:
    bytes waiting in the transport, none of them drained and nothing more written since the
    last look means the client is not reading; the connection is aborted, which cancels the
    handler and closes the upstream. A slow reader drains something and is left alone."""

    __slots__ = ("_ex", "_idle_s", "_handle", "_written", "_waiting")

    def __init__(self, ex: Any, idle_s: float) -> None:
        self._ex = ex
        self._idle_s = idle_s
        self._written = -1
        self._waiting = 0
        self._handle: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(idle_s, self._look)

    def _look(self) -> None:
        transport = self._ex.request.transport
        if transport is None or transport.is_closing():
            self._handle = None
            return
        waiting, written = transport.get_write_buffer_size(), self._ex.outcome.bytes_out
        if waiting > 0 and waiting >= self._waiting and written == self._written:
            self._ex.outcome.failed(f"the client stopped reading: nothing drained for {self._idle_s:g}s")
            self._handle = None
            transport.abort()
            return
        self._waiting, self._written = waiting, written
        self._handle = asyncio.get_running_loop().call_later(self._idle_s, self._look)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
