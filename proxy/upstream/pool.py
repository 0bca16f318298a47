"""`UpstreamPool`: keep-alive HTTP/1.1 connections to one upstream origin.

The gateway's own client, in place of a general-purpose one: it sends the headers it is
given and no others, leaves bodies encoded as they came, and costs a handful of calls per
request. It sends each request once: whether a failed one may go again is the forwarder's
call, made from the facts the error carries.

Open connections are not capped unless the operator sets `max_connections` (model traffic is
long streams: each holds its connection for minutes); past a cap a request waits for a free
connection within the connect timeout, then fails with `PoolExhausted`. Apart from that, at
most `max_idle` connections are kept for reuse, newest first. An idle connection is retired
after `keepalive_s`, or a second before the upstream's own announced idle timeout; one idle for
a second or more is checked before reuse, so one the upstream has closed is dropped, never
written to.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from proxy.upstream.connection import Body, Connection
from proxy.upstream.deadlines import Deadlines
from proxy.upstream.errors import ConnectFailed, ConnectTimeout, InvalidRequest, PoolExhausted
from proxy.upstream.response_stream import ResponseStream

_NO_BODY_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS", "TRACE"})
# Retire an idle connection this long before the upstream said it would close it.
_IDLE_MARGIN_S = 1.0
# A connection idle this long is asked (one poll of its socket) whether the upstream closed it.
# Upstreams close idle connections after seconds, and the event loop sees an end of file that
# came earlier by itself; a busy pool, whose connections come back within milliseconds, skips
# the system call.
_CHECK_AFTER_S = 1.0


class UpstreamPool:
    """Connections to one origin (`base_url`, whose path, if any, prefixes every request)."""

    __slots__ = (
        "scheme",
        "host",
        "port",
        "prefix",
        "host_header",
        "max_connections",
        "max_idle",
        "keepalive_s",
        "connect_s",
        "first_byte_s",
        "idle_s",
        "total_s",
        "deadlines",
        "_ssl",
        "_idle",
        "_open",
        "_waiters",
        "_sweeper",
        "_closed",
        "_loop",
    )

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int | None = None,
        max_idle: int = 256,
        keepalive_s: float = 60.0,
        connect_s: float = 10.0,
        first_byte_s: float = 120.0,
        idle_s: float = 120.0,
        total_s: float = 900.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"an upstream must be an http:// or https:// URL, not {base_url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        default_port = 443 if parts.scheme == "https" else 80
        self.port = parts.port or default_port
        self.prefix = parts.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if self.port == default_port else f"{host}:{self.port}"
        self.max_connections = max_connections
        self.max_idle = max_idle
        self.keepalive_s = keepalive_s
        self.connect_s = connect_s
        self.first_byte_s = first_byte_s
        self.idle_s = idle_s
        self.total_s = total_s
        self.deadlines = Deadlines()
        # https: the system's trust store and hostname checks, unless a context is given.
        self._ssl = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
        self._idle: deque[Connection] = deque()
        self._open: set[Connection] = set()
        self._waiters: deque[asyncio.Future[Connection | None]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def connections(self) -> int:
        return len(self._open)

    @property
    def idle(self) -> int:
        """Open connections waiting for a request."""
        return len(self._idle)

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot (`max_connections` reached)."""
        return len(self._waiters)

    async def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: Body | None = None,
        *,
        total_s: float | None = None,
        waited: Callable[[float], None] | None = None,
    ) -> ResponseStream:
        """Send a request (`target`: the path and query, already encoded) once, and return its
        answer once the head is in; an UpstreamError says how far the request got. `waited` is
        told how long the request waited for a connection slot, if it had to (a capped pool)."""
        if body is None:
            body = b""
        loop = self._loop
        if loop is None:  # the pool's loop, asked for once (each ask is a getpid() system call)
            loop = self._loop = asyncio.get_running_loop()
        deadline = loop.time() + (total_s if total_s is not None else self.total_s)
        head, chunked = self._head(method, target, headers, body)
        connection = self._reuse(loop) or await self._acquire(loop, deadline, waited)
        try:
            return await connection.send(loop, method, head, body, chunked, self.first_byte_s, self.idle_s, deadline)
        except BaseException:
            connection.finished(reusable=False)
            raise

    def _head(self, method: str, target: str, headers: Mapping[str, str], body: Body) -> tuple[bytes, bool]:
        lines = [f"{method} {self.prefix}{target} HTTP/1.1", f"Host: {self.host_header}"]
        lines += map(": ".join, headers.items())
        chunked = False
        if isinstance(body, bytes | bytearray | memoryview):
            if body or method not in _NO_BODY_METHODS:
                lines.append(f"Content-Length: {len(body)}")
        elif "content-length" not in headers and "Content-Length" not in headers:
            lines.append("Transfer-Encoding: chunked")
            chunked = True
        text = "\r\n".join(lines)
        # A line break inside a name or value would let it write a header (or a request) of its own.
        if text.count("\n") != len(lines) - 1 or text.count("\r") != len(lines) - 1:
            raise InvalidRequest("a header name or value holds a line break")
        return (text + "\r\n\r\n").encode("utf-8", "surrogateescape"), chunked

    def _reuse(self, loop: asyncio.AbstractEventLoop) -> Connection | None:
        """The most recently used idle connection still fit to reuse: not past its idle time, and
        with nothing to read (an upstream that closed it has sent its end of file)."""
        idle = self._idle
        now = loop.time()
        while idle:
            connection = idle.pop()
            idle_for = now - connection.idle_since
            announced = connection.upstream_idle_s
            limit = self.keepalive_s if announced is None else min(self.keepalive_s, announced - _IDLE_MARGIN_S)
            if idle_for < limit and connection.usable and (idle_for < _CHECK_AFTER_S or not connection.readable()):
                return connection
            connection.close()
        return None

    async def _acquire(
        self, loop: asyncio.AbstractEventLoop, deadline: float, waited: Callable[[float], None] | None
    ) -> Connection:
        if self._closed:
            raise ConnectFailed("the channel's pool is closed")
        if self.max_connections is not None and len(self._open) >= self.max_connections:
            found = await self._wait_for_slot(loop, deadline, waited)
            if found is not None:
                return found
        return await self._connect(loop, deadline)

    async def _wait_for_slot(
        self, loop: asyncio.AbstractEventLoop, deadline: float, waited: Callable[[float], None] | None
    ) -> Connection | None:
        """A connection handed over on release, or None when a slot frees up for a new one; how
        long that took goes to `waited`, however the wait ended."""
        started = loop.time()
        waiter: asyncio.Future[Connection | None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(min(loop.time() + self.connect_s, deadline)):
                return await waiter
        except TimeoutError:
            self._pass_on(waiter)
            raise PoolExhausted(
                f"all {self.max_connections} connections the channel may open stayed busy for {self.connect_s:g}s"
            ) from None
        except BaseException:
            self._pass_on(waiter)
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            if waited is not None:
                waited(loop.time() - started)

    def _pass_on(self, waiter: asyncio.Future[Connection | None]) -> None:
        """A wait that ended (timed out, cancelled) just as it was handed a connection or a slot:
        the next request gets it, or the slot would be held by nobody for good."""
        if waiter.done() and not waiter.cancelled():
            handed = waiter.result()
            if handed is not None:
                self.put_back(handed)
            else:
                self._free_slot()

    async def _connect(self, loop: asyncio.AbstractEventLoop, deadline: float) -> Connection:
        connection = Connection(self.deadlines, self.put_back, self.forget)
        self._open.add(connection)  # holds its slot while connecting
        try:
            async with asyncio.timeout_at(min(loop.time() + self.connect_s, deadline)):
                await loop.create_connection(
                    lambda: connection,
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None,
                )
        except TimeoutError:
            self.forget(connection)
            raise ConnectTimeout(f"no connection to {self.host}:{self.port} within {self.connect_s:g}s") from None
        except OSError as exc:  # refused, unreachable, unresolvable, TLS (ssl.SSLError is an OSError)
            self.forget(connection)
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        except BaseException:
            self.forget(connection)
            connection.close()
            raise
        return connection

    def put_back(self, connection: Connection) -> None:
        """A connection whose answer was read to its end: to a waiting request, else idle."""
        if self._closed or not connection.usable:
            connection.close()  # closing: the upstream's end of file is in; it frees its slot
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        loop = self._loop or asyncio.get_running_loop()
        connection.idle_since = loop.time()
        self._idle.append(connection)
        if len(self._idle) > self.max_idle:
            self._idle.popleft().close()  # the one idle longest
        if self._sweeper is None:
            self._sweeper = loop.call_later(self.keepalive_s, self._sweep)

    def forget(self, connection: Connection) -> None:
        """A connection closed: its slot goes to a waiting request, which opens a new one."""
        if connection not in self._open:
            return
        self._open.discard(connection)
        self._free_slot()

    def _free_slot(self) -> None:
        """A slot came free: the first request still waiting opens a connection in it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _sweep(self) -> None:
        """Close connections idle past keepalive_s (the oldest are at the left)."""
        self._sweeper = None
        now = asyncio.get_running_loop().time()
        idle = self._idle
        while idle and (idle[0].closed or now - idle[0].idle_since >= self.keepalive_s):
            idle.popleft().close()
        if idle:
            wait = self.keepalive_s - (now - idle[0].idle_since)
            self._sweeper = asyncio.get_running_loop().call_later(max(wait, 0.05), self._sweep)

    async def close(self) -> None:
        self._closed = True
        self.deadlines.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        while self._idle:
            self._idle.pop().close()
        for connection in list(self._open):
            connection.close()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(ConnectFailed("the channel's pool is closed"))
        self._waiters.clear()
