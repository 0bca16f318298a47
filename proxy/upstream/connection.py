"""`Connection`: one keep-alive HTTP/1.1 connection to an upstream, one exchange at a time.

An asyncio Protocol rather than streams: bytes go from the socket callback straight into
the answer's framing, with no reader task and no extra buffer between them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable
from typing import TYPE_CHECKING

from proxy.upstream.answer import Answer
from proxy.upstream.errors import BadAnswer, ConnectionLost, RequestBodyFailed, UpstreamError, UpstreamTimeout
from proxy.upstream.framing import MAX_HEAD, Framing, framing_for, parse_head

if TYPE_CHECKING:
    from proxy.upstream.pool import UpstreamPool

Body = bytes | AsyncIterable[bytes]


class Connection(asyncio.Protocol):
    """A pooled connection. `send` writes one request and gives the future of its answer's head."""

    __slots__ = ("pool", "transport", "uses", "idle_since", "closed", "_buffer", "_method", "_deadline", "_head",
                 "_framing", "_answer", "_keep_alive", "_writing_paused", "_drain", "_writer", "_first_byte_s",
                 "_reading_paused")

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.uses = 0
        self.idle_since = 0.0
        self.closed = False
        self._buffer = b""
        self._method = ""
        self._deadline = 0.0
        self._head: asyncio.Future[Answer] | None = None
        self._framing: Framing | None = None
        self._answer: Answer | None = None
        self._keep_alive = False
        self._writing_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._first_byte_s = 0.0
        self._reading_paused = False

    # -- one exchange --

    def send(self, loop: asyncio.AbstractEventLoop, method: str, head: bytes, body: Body, chunked: bool,
             first_byte_s: float, idle_s: float, deadline: float) -> asyncio.Future[Answer]:
        """Write the request; the future resolves with the answer once its head is in. The caller
        awaits it directly (no coroutine of its own here: one frame less on every resume)."""
        transport = self.transport
        assert transport is not None and self._head is None
        self.uses += 1
        self._method = method
        self._deadline = deadline
        self._first_byte_s = first_byte_s
        self._framing = self._answer = None
        waiter = self._head = loop.create_future()
        if isinstance(body, bytes | bytearray | memoryview):
            transport.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                transport.write(body)
            self._await_head(loop)
        else:
            transport.write(head)
            self._writer = loop.create_task(self._stream(body, chunked, idle_s))
        return waiter

    async def _stream(self, body: AsyncIterable[bytes], chunked: bool, idle_s: float) -> None:
        """Write a streamed body, chunked unless its length was declared; the first-byte
        clock starts once the upstream has all of it."""
        transport = self.transport
        assert transport is not None
        try:
            async for chunk in body:
                if not chunk:
                    continue
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                if self._writing_paused:
                    await self._drained(idle_s)
            if chunked:
                transport.write(b"0\r\n\r\n")
        except Exception as exc:
            # The upstream must never take half a request for a whole one: the connection goes.
            self._fail_head(exc if isinstance(exc, UpstreamError)
                            else RequestBodyFailed(f"the request body failed: {exc}"))
            self.close()
            return
        if self._head is not None and not self._head.done():
            self._await_head(asyncio.get_running_loop())

    async def _drained(self, idle_s: float) -> None:
        drain = self._drain = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(idle_s):
                await drain
        except TimeoutError:
            raise UpstreamTimeout(f"the upstream read none of the request body for {idle_s:g}s") from None

    def _await_head(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pool.deadlines.watch(self, min(loop.time() + self._first_byte_s, self._deadline))

    def timed_out(self) -> None:
        """Its deadline passed (`Deadlines` calls this): no head yet, or a read of the body waited too long."""
        if self._answer is not None:
            self._answer.time_out()
            return
        self._fail_head(UpstreamTimeout(f"no answer within {self._first_byte_s:g}s"))
        self.close()

    def _fail_head(self, error: BaseException) -> None:
        waiter = self._head
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def finished(self, reusable: bool) -> None:
        """The answer is done with: back to the pool, or closed."""
        writer, self._writer = self._writer, None
        if writer is not None and not writer.done():
            writer.cancel()
            reusable = False
        self._head = None
        self._answer = None
        if reusable and self._keep_alive and not self.closed:
            self.resume_reading()
            self.pool.put_back(self)
        else:
            self.close()

    def close(self) -> None:
        self.pool.deadlines.unwatch(self)
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()
            self.pool.forget(self)

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self.closed:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self.closed:
            self._reading_paused = False
            self.transport.resume_reading()

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._answer is not None:
            self._body(data)
            return
        if self._head is None or self._head.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted again
            return
        buffer = self._buffer + data if self._buffer else data
        try:
            while True:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD:
                        raise BadAnswer(f"the answer's head is over {MAX_HEAD} bytes")
                    self._buffer = buffer
                    return
                head = parse_head(buffer[:end])
                buffer = buffer[end + 4:]
                if head.status >= 200 or head.status == 101:
                    break  # 1xx interim answers (100 Continue, 103 Early Hints) are read past
            framing = framing_for(head, self._method)
        except BadAnswer as exc:
            self._fail_head(exc)
            self.close()
            return
        self._buffer = b""
        self.pool.deadlines.unwatch(self)
        # Both a length and chunks (RFC 9112 6.3: chunks win) is how requests get smuggled, and
        # after a 101 the connection no longer speaks HTTP: neither is reused.
        self._keep_alive = head.keep_alive and not framing.until_close and head.status != 101 and not (
            "transfer-encoding" in head.headers and "content-length" in head.headers)
        answer = Answer(self, head.status, head.reason, head.headers, self.pool.idle_s, self._deadline)
        self._framing, self._answer = framing, answer
        if framing.finished:
            answer.finish()
            if buffer:
                self._keep_alive = False
        elif buffer:
            self._body(buffer)
        self._head.set_result(answer)  # type: ignore[union-attr]

    def _body(self, data: bytes) -> None:
        answer, framing = self._answer, self._framing
        assert answer is not None and framing is not None
        if answer.complete:
            self._keep_alive = False  # more than the body said: never reuse this connection
            self.close()
            return
        out: list[bytes] = []
        try:
            end = framing.feed(data, out)
        except BadAnswer as exc:
            answer.fail(exc)
            self.close()
            return
        if out:
            answer.feed(out, len(data) if end < 0 else end)
        if end >= 0:
            if end < len(data):
                self._keep_alive = False
            answer.finish()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        was_closed, self.closed = self.closed, True
        if not was_closed:
            self.pool.forget(self)
        self.pool.deadlines.unwatch(self)
        answer = self._answer
        if answer is None:
            self._fail_head(ConnectionLost("the upstream closed the connection before answering",
                                           answered=bool(self._buffer)))
        elif not answer.complete:
            if self._framing is not None and self._framing.until_close and exc is None:
                answer.finish()
            else:
                answer.fail(ConnectionLost("the upstream closed the connection mid-answer", answered=True))
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_exception(ConnectionLost("the upstream closed the connection mid-request", answered=False))

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)
