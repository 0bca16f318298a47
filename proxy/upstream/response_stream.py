"""`ResponseStream`: one upstream answer, its head complete, its body read as it arrives."""

from __future__ import annotations

import asyncio
from typing import Protocol

from multidict import CIMultiDict

from proxy.upstream.errors import UpstreamTimeout


class Link(Protocol):
    """What an answer needs of the connection it arrives on (the connection is one)."""

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def watch(self, at: float) -> None: ...  # call the answer's time_out at `at` (loop time)
    def unwatch(self) -> None: ...
    def finished(self, reusable: bool) -> None: ...  # the answer is done with


# Body bytes held unread before the connection stops reading from the socket, so a slow
# client slows the upstream down instead of filling the gateway's memory.
_HIGH_WATER = 256 * 1024


class ResponseStream:
    """An upstream's answer. Read the body with `readany`, then `release` (or `close`) it.

    Between reads the body may be silent for `idle_s`; the whole exchange ends at the
    pool's total deadline. A released answer whose body was read to its end hands its
    connection back to the pool; anything else closes the connection."""

    __slots__ = ("status", "headers", "idle_s", "_link", "_chunks", "_size", "_done", "_error", "_waiter", "_deadline")

    def __init__(self, link: Link, status: int, headers: CIMultiDict[str], idle_s: float, deadline: float) -> None:
        self.status = status
        self.headers = headers
        self.idle_s = idle_s
        self._link: Link | None = link
        self._chunks: list[bytes] = []
        self._size = 0
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._deadline = deadline

    @property
    def content_type(self) -> str:
        """The media type alone, lower-cased (as aiohttp's `content_type`)."""
        value = self.headers.get("content-type")
        if value is None:
            return "application/octet-stream"
        return value.partition(";")[0].strip().lower()

    @property
    def content_length(self) -> int | None:
        """The declared length; None for a chunked body, whose Transfer-Encoding overrides it."""
        if "transfer-encoding" in self.headers:
            return None
        value = self.headers.get("content-length")
        return int(value) if value is not None and value.isascii() and value.isdigit() else None

    @property
    def complete(self) -> bool:
        """The whole body has arrived (it may not all have been read yet)."""
        return self._done

    async def readany(self) -> bytes:
        """Whatever body bytes have arrived, waiting for some if none have; b"" at the end."""
        if not self._chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            await self._wait()
            if not self._chunks:
                if self._error is not None:
                    raise self._error
                return b""
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        if self._size > _HIGH_WATER and self._link is not None:
            self._link.resume_reading()
        self._size = 0
        return data

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body (for small answers: health checks, webhook deliveries)."""
        parts: list[bytes] = []
        size = 0
        while chunk := await self.readany():
            parts.append(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                self.close()
                raise ValueError(f"the answer is over {limit} bytes")
        return b"".join(parts)

    def release(self) -> None:
        """Done with this answer: a complete body returns the connection to the pool."""
        link, self._link = self._link, None
        if link is not None:
            link.finished(self._done and self._error is None and not self._chunks)

    def close(self) -> None:
        """Stop reading this answer; its connection is closed, never reused."""
        link, self._link = self._link, None
        if link is not None:
            link.finished(False)
        if not self._done and self._error is None:
            self._error = ConnectionResetError("the answer was closed before its end")
        self._wake()  # a read waiting on it ends now (closed from elsewhere: a drain's cut)

    # -- fed by the connection --

    def feed(self, chunks: list[bytes], size: int) -> None:
        self._chunks += chunks
        self._size += size
        if self._size > _HIGH_WATER and self._link is not None:
            self._link.pause_reading()
        self._wake()

    def finish(self) -> None:
        self._done = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        if not self._done and self._error is None:  # the first cause is the one worth telling
            self._error = error
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        link = self._link
        if link is None:
            raise ConnectionResetError("the answer was released before its end")
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        link.watch(min(loop.time() + self.idle_s, self._deadline))
        try:
            await waiter
        finally:
            link.unwatch()
            self._waiter = None

    def time_out(self) -> None:
        """A read waited past the idle gap or the total deadline."""
        quiet = asyncio.get_running_loop().time() < self._deadline
        what = f"no data for {self.idle_s:g}s" if quiet else "the total timeout passed"
        self.fail(UpstreamTimeout(f"the upstream's answer stalled: {what}"))
        self.close()
