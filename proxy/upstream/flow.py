"""`FlowControl`: back-pressure on one upstream connection, both ways.

Reading pauses while an answer's unread body is over its high-water mark (a slow client slows
the upstream down instead of filling the gateway's memory); writing a streamed request body
waits while the transport's buffer is full.
"""

from __future__ import annotations

import asyncio

from proxy.upstream.errors import ConnectionLost, UpstreamTimeout


class FlowControl:
    __slots__ = ("_transport", "reading_paused", "_writing_paused", "_drain")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.reading_paused = False
        self._writing_paused = False
        self._drain: asyncio.Future[None] | None = None

    def pause_reading(self) -> None:
        if not self.reading_paused and not self._transport.is_closing():
            self.reading_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and not self._transport.is_closing():
            self.reading_paused = False
            self._transport.resume_reading()

    # -- writing: the protocol's pause_writing/resume_writing land here --

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    async def drain(self, idle_s: float) -> None:
        """Wait until the transport takes more, at most `idle_s`."""
        if not self._writing_paused:
            return
        drain = self._drain = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(idle_s):
                await drain
        except TimeoutError:
            raise UpstreamTimeout(f"the upstream read none of the request body for {idle_s:g}s") from None

    def lost(self) -> None:
        """The connection is gone: a body waiting to be written never will be."""
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_exception(ConnectionLost("the upstream closed the connection mid-request", answered=False))
