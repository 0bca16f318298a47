"""`Connection`: one keep-alive HTTP/1.1 connection to an upstream, one exchange at a time.

An asyncio Protocol rather than streams: bytes go from the socket callback straight into the
answer's parser, with no reader task and no extra buffer between them. It never sends a
request twice and never decides whether one may go again: when an exchange fails, the error
carries how far the request got (proxy/upstream/errors.py) and the caller decides.
"""

from __future__ import annotations

import asyncio
import re
import select
from collections.abc import AsyncIterable, Callable

from proxy.upstream.deadlines import Deadlines
from proxy.upstream.errors import BadAnswer, ConnectionLost, RequestBodyFailed, UpstreamError, UpstreamTimeout, Written
from proxy.upstream.flow import FlowControl
from proxy.upstream.parser import ResponseParser
from proxy.upstream.response_stream import ResponseStream

Body = bytes | AsyncIterable[bytes]
_KEEP_ALIVE_TIMEOUT = re.compile(r"(?:^|[,;\s])timeout\s*=\s*(\d{1,6})")


class Connection(asyncio.Protocol):
    """A pooled connection. `send` writes one request and gives the future of its answer's head.

    `idle(connection)` is told when it may carry another request; `lost(connection)` when it
    closes (the pool passes both in: a connection does not know its pool)."""

    __slots__ = (
        "transport",
        "flow",
        "uses",
        "idle_since",
        "upstream_idle_s",
        "closed",
        "_deadlines",
        "_idle",
        "_lost",
        "_parser",
        "_head",
        "_answer",
        "_written",
        "_answered",
        "_writer",
        "_first_byte_s",
        "_idle_s",
        "_deadline",
        "_poll",
        "_spare",
    )

    def __init__(
        self, deadlines: Deadlines, idle: Callable[[Connection], None], lost: Callable[[Connection], None]
    ) -> None:
        self.transport: asyncio.Transport | None = None
        self.flow: FlowControl | None = None
        self.uses = 0
        self.idle_since = 0.0
        self.upstream_idle_s: float | None = None  # how long the upstream keeps it idle (its Keep-Alive: timeout)
        self.closed = False
        self._deadlines = deadlines
        self._idle = idle
        self._lost = lost
        self._parser: ResponseParser | None = None
        self._head: asyncio.Future[ResponseStream] | None = None
        self._answer: ResponseStream | None = None
        self._written = Written.NOTHING
        self._answered = False
        self._writer: asyncio.Task[None] | None = None
        self._first_byte_s = 0.0
        self._idle_s = 0.0
        self._deadline = 0.0
        self._poll: select.poll | None = None  # asks the socket, between requests, whether the upstream closed it
        self._spare: ResponseParser | None = None  # the last answer's parser, to read the next one

    # -- one exchange --

    def send(
        self,
        loop: asyncio.AbstractEventLoop,
        method: str,
        head: bytes,
        body: Body,
        chunked: bool,
        first_byte_s: float,
        idle_s: float,
        deadline: float,
    ) -> asyncio.Future[ResponseStream]:
        """Write the request; the future resolves with the answer once its head is in. The caller
        awaits it directly (no coroutine of its own here: one frame less on every resume)."""
        transport = self.transport
        assert transport is not None and self._head is None
        self.uses += 1
        spare, self._spare = self._spare, None
        if spare is None:
            self._parser = ResponseParser(method)
        else:
            spare.expect(method)
            self._parser = spare
        self._answer = None
        self._answered = False
        self._deadline = deadline
        self._first_byte_s = first_byte_s
        self._idle_s = idle_s
        waiter = self._head = loop.create_future()
        if isinstance(body, bytes | bytearray | memoryview):
            if len(body) < 65536:
                transport.write(head + body)
            else:
                transport.write(head)
                transport.write(body)
            self._written = Written.ALL
            self._await_head(loop)
        else:
            transport.write(head)
            self._written = Written.PART
            self._writer = loop.create_task(self._stream(body, chunked, idle_s))
        return waiter

    @property
    def usable(self) -> bool:
        """Open, and not closing (an end of file read but not yet handled counts as closing)."""
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def readable(self) -> bool:
        """Bytes or an end-of-file wait on the idle socket: the upstream closed it (or talks out of turn)."""
        transport = self.transport
        if transport is None or self.closed or transport.is_closing():
            return True
        try:
            return self._poll is not None and bool(self._poll.poll(0))
        except OSError:
            return True

    async def _stream(self, body: AsyncIterable[bytes], chunked: bool, idle_s: float) -> None:
        """Write a streamed body, chunked unless its length was declared; the first-byte
        clock starts once the upstream has all of it."""
        transport, flow = self.transport, self.flow
        assert transport is not None and flow is not None
        try:
            async for chunk in body:
                if not chunk:
                    continue
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                await flow.drain(idle_s)
            if chunked:
                transport.write(b"0\r\n\r\n")
        except Exception as exc:
            # The upstream must never take half a request for a whole one: the connection goes.
            self._fail(exc if isinstance(exc, UpstreamError) else RequestBodyFailed(f"the request body failed: {exc}"))
            self.close()
            return
        self._written = Written.ALL
        if self._head is not None and not self._head.done():
            self._await_head(asyncio.get_running_loop())

    def _await_head(self, loop: asyncio.AbstractEventLoop) -> None:
        self._deadlines.watch(self, min(loop.time() + self._first_byte_s, self._deadline))

    def timed_out(self) -> None:
        """Its deadline passed (`Deadlines` calls this): no head yet, or a read of the body waited too long."""
        if self._answer is not None:
            self._answer.time_out()
            return
        self._fail(UpstreamTimeout(f"no answer within {self._first_byte_s:g}s"))
        self.close()

    def _fail(self, error: UpstreamError) -> None:
        """The exchange failed: the error learns how far the request got, and whoever waits gets it."""
        error.written = self._written
        error.answered = error.answered or self._answered
        error.reused = self.uses > 1
        if self._answer is not None:
            self._answer.fail(error)
            return
        waiter = self._head
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def finished(self, reusable: bool) -> None:
        """The caller is done with this exchange: back to the pool, or closed."""
        writer, self._writer = self._writer, None
        if writer is not None and not writer.done():
            writer.cancel()
            reusable = False
        parser, self._parser = self._parser, None
        self._head = None
        self._answer = None
        if reusable and parser is not None and parser.reusable and not self.closed:
            if parser.head is not None and (keep_alive := parser.head.headers.get("keep-alive")):
                self.upstream_idle_s = _upstream_idle_s(keep_alive)
            # llhttp reads the next answer afresh, except after HEAD: it still awaits that body
            self._spare = parser if parser.method != "HEAD" else None
            flow = self.flow
            assert flow is not None
            if flow.reading_paused:
                flow.resume_reading()
            self._idle(self)
        else:
            self.close()

    def close(self) -> None:
        self._deadlines.unwatch(self)
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()
            self._lost(self)

    # -- the answer's link back (proxy/upstream/response_stream.py) --

    def pause_reading(self) -> None:
        if self.flow is not None:
            self.flow.pause_reading()

    def resume_reading(self) -> None:
        if self.flow is not None:
            self.flow.resume_reading()

    def watch(self, at: float) -> None:
        self._deadlines.watch(self, at)

    def unwatch(self) -> None:
        self._deadlines.unwatch(self)

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.flow = FlowControl(transport)  # type: ignore[arg-type]
        socket = transport.get_extra_info("socket")
        if socket is not None:
            self._poll = select.poll()
            self._poll.register(socket.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:
            self.close()  # bytes nobody asked for: this connection cannot be trusted again
            return
        self._answered = True
        try:
            parser.feed(data)
        except BadAnswer as exc:
            self._fail(exc)
            self.close()
            return
        except Exception as exc:  # fail closed: whatever broke, the answer is not to be trusted
            self._fail(BadAnswer(f"the answer could not be read: {type(exc).__name__}"))
            self.close()
            return
        answer = self._answer
        if answer is None:
            head = parser.head
            if head is None:
                return
            self._deadlines.unwatch(self)
            answer = self._answer = ResponseStream(self, head.status, head.headers, self._idle_s, self._deadline)
            waiter = self._head
            assert waiter is not None
            if not waiter.done():
                waiter.set_result(answer)
        chunks, size = parser.take()
        if chunks:
            answer.feed(chunks, size)
        if parser.done and not answer.complete:
            answer.finish()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        was_closed, self.closed = self.closed, True
        if not was_closed:
            self._lost(self)
        self._deadlines.unwatch(self)
        if self.flow is not None:
            self.flow.lost()
        answer, parser = self._answer, self._parser
        if answer is None:
            if self._head is not None and not self._head.done():
                self._fail(
                    ConnectionLost("the upstream closed the connection before answering", answered=self._answered)
                )
        elif not answer.complete:
            if exc is None and parser is not None and parser.connection_closed():
                answer.finish()
            else:
                self._fail(ConnectionLost("the upstream closed the connection mid-answer", answered=True))

    def pause_writing(self) -> None:
        if self.flow is not None:
            self.flow.pause_writing()

    def resume_writing(self) -> None:
        if self.flow is not None:
            self.flow.resume_writing()


def _upstream_idle_s(keep_alive: str) -> float | None:
    """The idle timeout an upstream announces (`Keep-Alive: timeout=5`), if it does."""
    found = _KEEP_ALIVE_TIMEOUT.search(keep_alive.lower())
    return float(found[1]) if found else None
