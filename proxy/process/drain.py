"""`Drain`: stopping within `server.drain_timeout_s` in total, and saying so to every client.

On SIGTERM the gateway stops accepting connections and waits for requests in flight; every
answer from then on says `Connection: close`, and the connection of one whose head went out
before (a stream) is closed once it ends, so no client sends its retry to a gateway on its way
out. (Connections are not closed under their clients: aiohttp would drop the rest of a body
still arriving, and an idle keep-alive connection closed now races the request its client may
be sending on it.)
Streams still open shortly before the deadline are cut: each ends with its format's error event
(`server_shutting_down`), so a client knows to retry rather than take a short answer for a whole
one. What is left at the deadline is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from aiohttp import web

log = logging.getLogger("modelgate.drain")

CUT_BEFORE_S = 0.5  # streams are cut this long before the deadline, so their last event goes out in time
SHUTTING_DOWN = "server_shutting_down"


class Cuttable(Protocol):
    def cut(self) -> None: ...


class Drain:
    """Open streams, and whether the gateway is draining."""

    __slots__ = ("draining", "cutting", "_streams")

    def __init__(self) -> None:
        self.draining = False
        self.cutting = False  # past the cut point: a stream that opens now ends at once, and says why
        self._streams: set[Cuttable] = set()

    def opened(self, stream: Cuttable) -> None:
        self._streams.add(stream)
        if self.cutting:
            stream.cut()

    def closed(self, stream: Cuttable) -> None:
        self._streams.discard(stream)

    async def run(self, in_flight: Callable[[], int], timeout_s: float) -> None:
        """Wait for requests in flight, cut the streams left near the deadline, and return by it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self.draining = True
        cut_at = deadline - min(CUT_BEFORE_S, timeout_s / 2)
        while in_flight() and loop.time() < cut_at:
            await asyncio.sleep(0.05)
        self.cutting = True
        if self._streams:
            log.warning("drain deadline near: cutting open streams", extra={"streams": len(self._streams)})
            for stream in list(self._streams):
                stream.cut()
        while in_flight() and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if in_flight():
            log.warning("drain deadline passed: cancelling what is left", extra={"in_flight": in_flight()})


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
