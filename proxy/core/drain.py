"""`Drain`: stopping within `server.drain_timeout_s` in total, and saying so to every client.

On SIGTERM the gateway stops accepting connections (those the kernel had already queued are
accepted first, rather than reset with the listener), and from then on:

- **Idle keep-alive connections are closed at once**, half-closed: the gateway sends its FIN and
  reads on, dropping what arrives. A client sees its end of file before it sends anything more;
  one whose request crossed the FIN sees that end of file before any byte of an answer, and that
  request was never acted on, so sending it again elsewhere is safe, whatever its method. Nothing
  is closed under unread bytes, so no client meets a reset while the worker drains.
- **Every answer whose head goes out during the drain says `Connection: close`**, and its
  connection closes once it ends.
- **A connection whose answer began before the drain** (a stream, say) said nothing of closing,
  so its client may send its next request the moment the answer ends. It is kept REUSE_GRACE_S
  after that: a request arriving then is served, with `Connection: close`; then it is
  half-closed like the idle ones. So is a connection accepted but not yet sent its first
  request. (Connections are never closed under a request: aiohttp would drop the rest of a body
  still arriving.)
- Streams still open shortly before the deadline are cut: each ends with its format's error
  event (`server_shutting_down`) and closes its connection, so a client knows to retry rather
  than take a short answer for a whole one. A request arriving past that point is answered 503
  `server_shutting_down` with `Connection: close` (it could not be finished in time). What is
  left at the deadline is cancelled.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import socket
import struct
import termios
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from aiohttp import web

log = logging.getLogger("modelgate.drain")

CUT_BEFORE_S = 0.5  # streams are cut this long before the deadline, so their last event goes out in time
SHUTTING_DOWN = "server_shutting_down"
REUSE_GRACE_S = 2.0  # how long a connection not told to close may still bring a request, once idle
LINGER_S = 1.0  # how long the drain waits for clients to close what it half-closed (within the deadline)
_TICK_S = 0.02


class Cuttable(Protocol):
    def cut(self, revoked: bool = False) -> None: ...

    def key_name(self) -> str | None: ...


class Drain:
    """Open streams (ended at the drain's cut point, or when their key is revoked), and whether
    the gateway is draining."""

    __slots__ = ("draining", "cutting", "_streams", "_idle_since", "_half_closed", "_busy")

    def __init__(self) -> None:
        self.draining = False
        self.cutting = False  # past the cut point: a stream that opens now ends at once, and says why
        self._streams: set[Cuttable] = set()
        self._idle_since: dict[Any, float] = {}  # connections in their grace, and since when idle
        self._half_closed: set[Any] = set()
        self._busy = 0  # connections with a request or an answer under way (the answer's end included)

    def opened(self, stream: Cuttable) -> None:
        self._streams.add(stream)
        if self.cutting:
            stream.cut()

    def closed(self, stream: Cuttable) -> None:
        self._streams.discard(stream)

    def end_streams_of(self, keys: Callable[[], set[str]]) -> int:
        """End the open streams running under the keys `keys()` names (revoked ones, worked out
        only when a stream is open); how many were."""
        if not self._streams:
            return 0
        names = keys()
        ended = [stream for stream in self._streams if stream.key_name() in names]
        for stream in ended:
            stream.cut(revoked=True)
        return len(ended)

    async def run(
        self, in_flight: Callable[[], int], timeout_s: float, connections: Callable[[], Iterable[Any]] = tuple
    ) -> None:
        """Close idle connections, wait for requests in flight, cut the streams left near the
        deadline, and return by it. `connections`: the server's request handlers (aiohttp's)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self.draining = True
        closed = self.sweep(connections(), loop.time(), first=True)
        if closed:
            log.info("drain: idle keep-alive connections closed", extra={"connections": closed})
        cut_at = deadline - min(CUT_BEFORE_S, timeout_s / 2)
        while (in_flight() or self._busy or self._idle_since) and loop.time() < cut_at:
            await asyncio.sleep(_TICK_S)
            self.sweep(connections(), loop.time())
        self.cutting = True
        if self._streams:
            log.warning("drain deadline near: cutting open streams", extra={"streams": len(self._streams)})
            for stream in list(self._streams):
                stream.cut()
        while (in_flight() or self._busy or self._idle_since) and loop.time() < deadline:
            await asyncio.sleep(_TICK_S)
            self.sweep(connections(), loop.time())
        if in_flight():
            log.warning("drain deadline passed: cancelling what is left", extra={"in_flight": in_flight()})
            return
        self.sweep(connections(), loop.time(), last=True)
        # Clients close their side once they read the end of file; until then a request that crossed
        # the FIN is still read (and dropped), not met with a reset.
        linger_end = min(deadline, loop.time() + LINGER_S)
        while any(handler.transport is not None for handler in self._half_closed) and loop.time() < linger_end:
            await asyncio.sleep(_TICK_S)

    def sweep(self, handlers: Iterable[Any], now: float, first: bool = False, last: bool = False) -> int:
        """Half-close the idle connections whose time has come: on the first sweep every one that
        has carried a request, later each once idle for REUSE_GRACE_S, on the last all of them.
        Those left in their grace (or with a request's bytes arriving) are kept in `_idle_since`,
        and those serving a request or writing an answer counted in `_busy`: a request's handler
        may have returned while its answer's end is still being written, and that connection is
        about to be idle, not gone. Returns how many it closed."""
        closed = busy = 0
        waiting: dict[Any, float] = {}
        for handler in handlers:
            if not parked(handler):
                # Serving a request or its answer (`Connection: close` ends it, unless it began
                # before the drain), or already half-closed, or closing.
                transport = handler.transport
                busy += handler not in self._half_closed and transport is not None and not transport.is_closing()
                continue
            since = self._idle_since.get(handler, now)
            if _bytes_waiting(handler.transport):
                waiting[handler] = since  # a request arriving: it will be served
            elif last or (first and served(handler)) or now - since >= REUSE_GRACE_S:
                half_close(handler)
                self._half_closed.add(handler)
                closed += 1
            else:
                waiting[handler] = since
        self._idle_since, self._busy = waiting, busy
        return closed


# What follows reads aiohttp's request handler (aiohttp.web_protocol.RequestHandler), which has no
# public word for "idle between requests"; tests/test_drain.py checks these names still hold.


def parked(handler: Any) -> bool:
    """Waiting for its next request, with none begun or queued, on an open connection."""
    waiter = handler._waiter  # set while the handler waits for a request, None while one is served
    transport = handler.transport
    return (
        waiter is not None
        and not waiter.done()
        and not handler._messages
        and transport is not None
        and not transport.is_closing()
    )


def served(handler: Any) -> bool:
    """Whether the connection has carried a request (one that has not may be about to send its first)."""
    return handler._request_count > 0


def half_close(handler: Any) -> None:
    """Send FIN and take no further request on the connection: aiohttp's handler stops (what
    arrives is dropped unread) and the transport closes once the client closes its side."""
    transport = handler.transport
    handler.close()
    if transport.can_write_eof():
        transport.write_eof()
    else:
        transport.close()


def _bytes_waiting(transport: asyncio.BaseTransport) -> bool:
    """Bytes in the socket that the event loop has not read yet: a request arriving."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        count = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return False
    return struct.unpack("i", count)[0] > 0


def accept_queued(listeners: Sequence[Any]) -> list[socket.socket]:
    """The connections the kernel has queued on the listening sockets, which closing them would
    reset. Call it just before they close, with no await between: then only what the kernel
    completes in those microseconds is left to be reset."""
    taken: list[socket.socket] = []
    for listener in listeners:
        # asyncio and uvloop hand out wrappers of the listener; a duplicate of its descriptor accepts alike.
        with socket.socket(fileno=os.dup(listener.fileno())) as sock:
            sock.setblocking(False)
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:  # BlockingIOError: none left
                    break
                conn.setblocking(False)
                taken.append(conn)
    return taken


def close_when_draining(drain: Drain, keepalive_requests: int) -> Callable[[web.Request, web.StreamResponse], object]:
    """An on_response_prepare hook: `Connection: close` on an answer while draining, or once its
    connection has carried `keepalive_requests` requests, so long-lived keep-alive clients move
    to new connections (and, with workers, spread over new worker processes)."""

    async def hook(request: web.Request, response: web.StreamResponse) -> None:
        served = getattr(request.protocol, "_request_count", 0)  # aiohttp's count for this connection
        if drain.draining or served >= keepalive_requests:
            response.force_close()
            response.headers["Connection"] = "close"  # its head is written after this hook

    return hook
