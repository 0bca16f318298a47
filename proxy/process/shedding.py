"""Refusing on the connection, as a request's head is parsed, while the worker sheds load.

While a worker is overloaded (proxy/process/admission.py) most of what it does is refuse, and a
refusal made through aiohttp costs a fifth to a quarter of a served request (a request object,
a task, the router, a response and its head, the keep-alive bookkeeping): at three times its
capacity, refusing alone takes most of the worker, and what it admits waits behind the
refusals. So while the worker sheds, a request whose connection is otherwise idle is decided as
aiohttp's parser hands over its head: refused, its answer (the same 503 `overloaded` in its
endpoint's shape, with `Retry-After` and its request id) is written on the connection there and
then; admitted, it goes on to aiohttp as any other, marked so that it is not decided twice.

Only the plain case is decided here; anything else goes aiohttp's way, which decides the same:
a connection with a request in progress or queued (answers keep their order), a body not all
arrived (what is left would have to be read and dropped), a request that asks to close or to
upgrade, one with an `Expect` (aiohttp's way answers those it does not do with a 417),
HTTP/1.0, a target with escapes or off the interface's endpoints, a worker draining, a
connection at its `keepalive_requests`, and a client not reading its answers (SEND_BOUND bytes
of them waiting: aiohttp then waits for it rather than buffering more).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpVersion11, RawRequestMessage
from aiohttp.web_protocol import RequestHandler

from proxy.observability.metrics import SHED, child
from proxy.process.admission import RETRY_AFTER_S
from proxy.process.refusals import RefusingHandler, RefusingServer
from proxy.request.gateway import OVERLOADED_MESSAGE, Gateway, answer_id, refusal_body
from proxy.wire.routes import Route

log = logging.getLogger("modelgate.admission")

SEND_BOUND = 64 * 1024  # answers written and not yet taken by the client, past which aiohttp's way waits for it
_PLAIN = re.compile(r"[A-Za-z0-9._~:/-]+")  # a target path the router reads as it is written
_PARAMETER = re.compile(r"\{[^}]+\}")


class Endpoints:
    """The route aiohttp's router finds for a plain path on the interface's endpoints: a path
    parameter matches one segment, and routes are tried in the order they were added."""

    __slots__ = ("_exact", "_templated")

    def __init__(self, routes: Iterable[Route]) -> None:
        self._exact: dict[tuple[str, str], Route] = {}
        self._templated: list[tuple[str, re.Pattern[str], Route]] = []
        for route in routes:
            if "{" not in route.path:
                self._exact.setdefault((route.method, route.path), route)
                continue
            literal = _PARAMETER.split(route.path)
            self._templated.append((route.method, re.compile("[^{}/]+".join(map(re.escape, literal))), route))

    def find(self, method: str, path: str) -> Route | None:
        found = self._exact.get((method, path))
        if found is not None:
            return found
        for wanted, pattern, route in self._templated:
            if method == wanted and pattern.fullmatch(path):
                return route
        return None


class Shedder:
    """Decides, from a parsed head, whether a request is refused on its connection."""

    __slots__ = ("gateway", "admission", "endpoints")

    def __init__(self, gateway: Gateway, routes: Iterable[Route]) -> None:
        self.gateway = gateway
        self.admission = gateway.admission
        self.endpoints = Endpoints(routes)

    def in_flight(self) -> int:
        """The gateway's count, with the requests admitted here that it has not counted yet: the
        connections read in one turn would otherwise all be decided against the same count."""
        return self.gateway.in_flight + self.admission.waiting

    def refuses(self, handler: SheddingHandler, message: Any, payload: Any) -> bool:
        """Refuse `message` on `handler`'s connection (True), or leave it to aiohttp, marked
        admitted when the admission was asked."""
        gateway = self.gateway
        drain = gateway.drain
        if (
            type(message) is not RawRequestMessage
            or message.version != HttpVersion11
            or message.should_close
            or message.upgrade
            or not payload.is_eof()
            or drain is not None
            and drain.draining
            or "Expect" in message.headers
        ):
            return False
        server = gateway.runtime.config.server
        transport = handler.transport
        if (
            handler.requests_seen >= server.keepalive_requests
            or transport is None
            or transport.get_write_buffer_size() > SEND_BOUND
        ):
            return False
        path = message.path.partition("?")[0]
        route = self.endpoints.find(message.method, path) if _PLAIN.fullmatch(path) else None
        if route is None:
            return False
        admission = self.admission
        if admission.admits(self.in_flight()):
            handler.admitted = True
            admission.waiting += 1
            return False
        body = refusal_body(route, "overloaded", OVERLOADED_MESSAGE)
        request_id = answer_id(message.headers.get(server.request_id_header, ""))
        head = (
            f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Retry-After: {RETRY_AFTER_S}\r\n{server.request_id_header}: {request_id}\r\n"
            f"Content-Length: {len(body)}\r\nDate: {rfc822_formatted_time()}\r\nServer: {SERVER_SOFTWARE}\r\n\r\n"
        )
        transport.write(head.encode("ascii") + body)
        child(SHED, route.name, "overloaded").inc()
        handler.kept_alive()
        return True


class SheddingHandler(RefusingHandler):
    """aiohttp's connection handler, letting the server's `Shedder` refuse while the worker sheds."""

    __slots__ = ("admitted", "shedder")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.admitted = False  # the next request this connection hands over was admitted already
        self.shedder: Shedder | None = getattr(self._manager, "shedder", None)

    @property
    def requests_seen(self) -> int:
        return self._request_count

    def take_admission(self) -> bool:
        """Whether the request now handled was admitted here (asked once: the mark is taken)."""
        if not self.admitted:
            return False
        self.admitted = False
        self.shedder.admission.waiting -= 1  # type: ignore[union-attr]
        return True

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.admitted:  # its request never reached the gateway (the client left first)
            self.take_admission()
        super().connection_lost(exc)

    def kept_alive(self) -> None:
        """A request was answered here: the connection is not idle (aiohttp's keep-alive timer
        closes one whose handler waits past `keepalive_timeout`, and its handler waits on)."""
        if self._keepalive_timeout > 0:
            self._next_keepalive_close_time = self._loop.time() + self._keepalive_timeout

    def data_received(self, data: bytes) -> None:
        # Decided here only while the worker sheds (a share cut, or the bound reached: checked
        # inline, as this runs for every read) and aiohttp's handler waits for the next request
        # (nothing in progress or queued on this connection, so an answer written now is in its place).
        shedder = self.shedder
        if shedder is not None:
            admission = shedder.admission
            if admission.share < 1.0 or shedder.gateway.in_flight + admission.waiting >= admission.limit:
                waiter = self._waiter
                if waiter is not None and not waiter.done() and not self._messages and not self._upgraded:
                    self._shed(shedder, waiter, data)
                    return
        RequestHandler.data_received(self, data)

    def _shed(self, shedder: Shedder, waiter: Any, data: bytes) -> None:
        # aiohttp parses and queues as ever; its handler is woken below, for what is not refused.
        self._waiter = None
        try:
            while True:
                parsed = self._request_count
                super().data_received(data)
                data = b""
                queued = self._messages
                while queued and shedder.refuses(self, *queued[0]):
                    queued.popleft()
                    if self._parser is not None:
                        self._parser.message_consumed()  # as aiohttp's handler does for each it takes
                # Its parser hands over a few requests at a time: while all were refused, the next few.
                if queued or self._request_count == parsed or self._close or self._force_close or self._upgraded:
                    break
        finally:
            self._waiter = waiter
        if queued:
            if not waiter.done():
                waiter.set_result(None)
        elif self._buffer_paused:  # all refused and none left unparsed: read on
            self._resume_reading_for_buffer()


class SheddingServer(RefusingServer):
    """aiohttp's server, making `SheddingHandler`s; `shedder` set, they refuse while it sheds."""

    shedder: Shedder | None = None

    def __call__(self) -> RequestHandler:
        return SheddingHandler(self, loop=self._loop, **self._kwargs)


# What of aiohttp's connection handler the above reads and calls (none of it public): a version
# without one of them refuses aiohttp's way alone.
_HANDLER_PARTS = (
    "_messages",
    "_waiter",
    "_upgraded",
    "_request_count",
    "_parser",
    "_buffer_paused",
    "_close",
    "_force_close",
    "_keepalive_timeout",
    "_next_keepalive_close_time",
    "_manager",
    "_loop",
)


def shed_on_connections(server: Any, gateway: Gateway, routes: Iterable[Route]) -> bool:
    """Make the app runner's server (already answering refusals in JSON: refusals.refuse_in_json)
    refuse on the connection while `gateway` sheds. Before the runner's site starts. False (and
    a warning) when this aiohttp's handler is not the one this module knows."""
    slots = {name for cls in RequestHandler.__mro__ for name in getattr(cls, "__slots__", ())}
    missing = [name for name in _HANDLER_PARTS if name not in slots]
    if missing or not hasattr(RequestHandler, "_resume_reading_for_buffer"):
        log.warning(
            "refusals under overload go through aiohttp's request handling: this aiohttp's connection "
            "handler has none of %s",
            missing or ["_resume_reading_for_buffer"],
        )
        return False
    server.__class__ = SheddingServer
    server.shedder = Shedder(gateway, routes)
    return True
