"""Reading the client's request body the way its route needs it.

JSON and raw bodies are read whole, within a size limit. A multipart edit is read only
until its `model` field has passed (kept in a spool that moves to disk past a few MB);
the rest streams to the upstream as it arrives, observed on the way.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from aiohttp import StreamReader, web

from proxy.config import GatewayConfig
from proxy.core.exchange import Exchange
from proxy.core.headers import content_codings
from proxy.schemas.common import Violation
from proxy.wire.multipart import MultipartObserver
from proxy.wire.routes import Body, Route

_SPOOL_IN_MEMORY = 4 * 1024 * 1024
_MEDIA_TYPE = re.compile(r"(?:application|text|multipart|image|audio|video|font|model|message)/[A-Za-z0-9.+-]{1,64}")
_READ_SIZE = 256 * 1024
_MB = 1024 * 1024


class BodyError(Exception):
    """A body the gateway refuses before anything goes upstream; `param` names the culprit."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


class Pace:
    """How long a client may take over its body: `idle_s` of silence at most, and `total_s` for
    all of it, so a body trickled a byte at a time cannot hold a request open for ever."""

    __slots__ = ("idle_s", "total_s", "_deadline")

    def __init__(self, idle_s: float = 30.0, total_s: float = 300.0) -> None:
        self.idle_s = idle_s
        self.total_s = total_s
        self._deadline = 0.0  # set at the first wait: a body that came whole never reads the clock

    async def read(self, content: StreamReader) -> bytes:
        """The next chunk of a client's body; 408 past either limit."""
        if content.is_eof():  # all of it is here: no wait, so no timer
            return await content.read(_READ_SIZE)
        now = asyncio.get_running_loop().time()
        if not self._deadline:
            self._deadline = now + self.total_s
        left = self._deadline - now
        if left <= 0:
            raise self._late()
        try:
            async with asyncio.timeout(min(self.idle_s, left)):
                return await content.read(_READ_SIZE)
        except TimeoutError:
            if self.idle_s < left:
                raise BodyError(408, f"the request body stopped arriving: nothing for {self.idle_s:g}s") from None
            raise self._late() from None

    def _late(self) -> BodyError:
        return BodyError(408, f"the request body did not arrive within {self.total_s:g}s")


def body_limits(config: GatewayConfig, route: Route) -> tuple[int, int]:
    """Bytes allowed for a whole body and for a streamed upload: `routes.<route>.max_body_mb`, else
    the route's own limit (within the server's), else the server's."""
    server = config.server
    configured = config.routes.get(route.name)  # type: ignore[call-overload]
    if configured is not None and configured.max_body_mb is not None:
        limit = int(configured.max_body_mb * _MB)
        return limit, limit
    if route.max_body_mb is not None:
        limit = int(min(route.max_body_mb, server.max_json_body_mb) * _MB)
        return limit, limit
    return int(server.max_json_body_mb * _MB), int(server.max_upload_mb * _MB)


async def read_body(
    ex: Exchange, limit: int, upload_limit: int | None = None, idle_s: float = 30.0, total_s: float = 300.0
) -> None:
    """Fill `ex.body` or `ex.body_stream`; raise BodyError for a body the gateway refuses,
    408 for one that stops arriving for `idle_s` or is not whole within `total_s`."""
    kind = ex.route.body
    if kind is Body.NONE:
        return
    request = ex.request
    if kind is not Body.RAW and content_codings(request.headers):
        # The gateway reads these bodies to check them; an encoded one it would forward unread.
        raise BodyError(415, "Content-Encoding: send the request body without one", "Content-Encoding")
    if kind is Body.JSON_OR_MULTIPART and request.content_type == "multipart/form-data":
        observer = MultipartObserver.for_content_type(request.headers.get("content-type", ""))
        if observer is None:
            raise BodyError(400, "multipart/form-data needs exactly one boundary of RFC 2046's characters")
        upload_limit = upload_limit or limit
        declared = request.content_length
        if declared is not None and declared > upload_limit:  # refused before a byte of it is read
            raise BodyError(413, f"upload of {declared} bytes is over the {upload_limit}-byte limit")
        await _open_multipart(ex, observer, upload_limit, Pace(idle_s, total_s))
        return
    content_type = request.headers.get("Content-Type")
    if kind is not Body.RAW and content_type is not None and "json" not in content_type.split(";", 1)[0].lower():
        sent = content_type.split(";", 1)[0].strip()
        # The media type is named back only when it is one: a header may hold anything, a key too.
        named = f", not {sent}" if _MEDIA_TYPE.fullmatch(sent) else ""
        raise BodyError(400, f"Content-Type: must be application/json{named}", "Content-Type")
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyError(413, f"request body of {declared} bytes is over the {limit}-byte limit")
    ex.body = await _read_whole(request, limit, idle_s, total_s)
    if kind is Body.RAW or not ex.body:
        return
    parsed = ex.json()
    if parsed is None and ex.body.strip() != b"null":
        raise BodyError(400, "request body is not valid JSON")
    if isinstance(parsed, dict) and parsed.get("stream") is True:
        ex.streaming = True


async def _read_whole(request: web.Request, limit: int, idle_s: float, total_s: float) -> bytes:
    content = request.content
    if content.is_eof():  # the whole body came with the headers, as small JSON bodies do
        data = content.read_nowait()
        if len(data) > limit:
            raise BodyError(413, f"request body is over the {limit}-byte limit")
        return data
    chunks: list[bytes] = []
    size = 0
    pace = Pace(idle_s, total_s)
    while chunk := await pace.read(request.content):
        size += len(chunk)
        if size > limit:
            raise BodyError(413, f"request body is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


async def _open_multipart(ex: Exchange, observer: MultipartObserver, limit: int, pace: Pace) -> None:
    ex.multipart = observer
    body = MultipartBody(ex.request, observer, pace)
    body.checks.append(_size_check(limit))
    body.checks.append(_single_fields)
    await body.read_until_field("model")
    stream_flag = observer.field("stream")
    ex.streaming = stream_flag is not None and stream_flag.strip().lower() == "true"
    ex.body_stream = body


class BodyRejected(Exception):
    """A streamed body broke a rule mid-way; sending it upstream stops at once."""


FormCheck = Callable[[MultipartObserver, bool], "Violation | None"]


def _size_check(limit: int) -> FormCheck:
    def too_large(observer: MultipartObserver, finished: bool) -> Violation | None:
        if sum(part.size for part in observer.parts) > limit:
            return Violation("", f"the upload is over the {limit}-byte limit", status=413)
        return None

    return too_large


# Form fields the gateway decides by: given twice, a reader that takes the other one would see
# another request than the one checked.
_DECIDING_FIELDS = ("model", "stream", "response_format")


def _single_fields(observer: MultipartObserver, finished: bool) -> Violation | None:
    deciding = [part for part in observer.parts if part.name in _DECIDING_FIELDS]
    if any(part.is_file for part in deciding):  # a reader may still take it for the field
        return Violation("", "a form field the gateway decides by is sent as a file")
    if len({part.name for part in deciding}) != len(deciding):
        return Violation("", "a form field the gateway decides by is given twice")
    return None


class MultipartBody:
    """A multipart body: its start spooled while the fields that route it are found, the rest streamed.

    Checks (plugins add them) run on the observer after every chunk and at the end, then the
    gates; the first violation stops the upstream request before its body is complete."""

    __slots__ = ("_content", "observer", "_spool", "declared_length", "checks", "gates", "rejection", "_pace")

    def __init__(self, request: web.Request, observer: MultipartObserver, pace: Pace) -> None:
        self._content = request.content
        self._pace = pace
        self.observer = observer
        self._spool = Spool()
        self.declared_length = request.content_length
        self.checks: list[FormCheck] = []
        # What must agree to the finished form before its last chunk goes (a budget reserving for
        # counts a form named only after its files): awaited once, at the end.
        self.gates: list[Callable[[], Awaitable[Violation | None]]] = []
        self.rejection: Violation | None = None

    def run_checks(self, finished: bool) -> Violation | None:
        for check in self.checks:
            violation = check(self.observer, finished)
            if violation is not None:
                return violation
        return None

    async def read_until_field(self, name: str) -> None:
        observer = self.observer
        while observer.field(name) is None and not observer.done and not observer.error:
            chunk = await self._pace.read(self._content)
            if not chunk:
                break
            observer.feed(chunk)
            self._spool.write(chunk)
            if (violation := self.run_checks(False)) is not None:
                self._spool.close()
                raise BodyError(violation.status, str(violation))
        if observer.error:
            self._spool.close()
            raise BodyError(400, f"malformed multipart body: {observer.error}")

    def remove_field(self, name: str) -> bool:
        """Drop a small text field from the spooled start (where SDKs put their fields)."""
        # A part: its delimiter, header lines (never empty, so the match stays in one part's
        # headers) one of which names the field, the blank line, and a one-line value.
        pattern = re.compile(
            rb"(--"
            + re.escape(self.observer.boundary)
            + rb"\r\n(?:[^\r\n]+\r\n)*?[^\r\n]*(?<=[; \t])name=\"?"
            + re.escape(name.encode())
            + rb'"?(?:;[^\r\n]*)?\r\n(?:[^\r\n]+\r\n)*\r\n[^\r\n]*\r\n)'
        )
        delta = self._spool.remove(pattern)
        if delta is None:
            return False
        if self.declared_length is not None:
            self.declared_length += delta
        return True

    def rename_model(self, old: str, new: str) -> bool:
        """Swap the `model` field's value in the spooled start; the declared length follows. False
        when it is not there to swap (it came after a large file): the caller must not send it."""
        pattern = re.compile(
            rb'((?<=[; \t])name="?model"?(?:;[^\r\n]*)?\r\n(?:[^\r\n]+\r\n)*\r\n)'
            + re.escape(old.encode())
            + rb"(\r\n--)"
        )
        delta = self._spool.substitute(pattern, new.encode())
        if delta is None:
            return False
        if self.declared_length is not None:
            self.declared_length += delta
        return True

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # One chunk is held back, so the checks of a finished body run before the upstream
        # has all of it: a body that fails them never reaches the upstream whole.
        held = b""
        try:
            for chunk in self._spool.replay():
                if held:
                    yield held
                held = chunk
            while chunk := await self._next_chunk():
                self.observer.feed(chunk)
                self._stop_if_rejected(False)
                if held:
                    yield held
                held = chunk
            self.observer.finish()
            if self.observer.error:
                self.rejection = Violation("", f"malformed multipart body: {self.observer.error}")
                raise BodyRejected(str(self.rejection))
            self._stop_if_rejected(True)
            for gate in self.gates:
                if (violation := await gate()) is not None:
                    self.rejection = violation
                    raise BodyRejected(str(violation))
            if held:
                yield held
        finally:
            self._spool.close()

    async def _next_chunk(self) -> bytes:
        try:
            return await self._pace.read(self._content)
        except BodyError as exc:  # the client went quiet mid-upload: the upstream must not wait on it
            self.rejection = Violation("", str(exc), status=exc.status)
            raise BodyRejected(str(exc)) from None

    def _stop_if_rejected(self, finished: bool) -> None:
        if self.observer.error:
            self.rejection = Violation("", f"malformed multipart body: {self.observer.error}")
            raise BodyRejected(str(self.rejection))
        if self.checks and (violation := self.run_checks(finished)) is not None:
            self.rejection = violation
            raise BodyRejected(str(violation))


class Spool:
    """Bytes kept in memory up to a few MB, then in a temporary file."""

    __slots__ = ("_memory", "_file", "size")

    def __init__(self) -> None:
        self._memory = bytearray()
        self._file: tempfile.SpooledTemporaryFile[bytes] | None = None
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self._file is None and len(self._memory) + len(chunk) <= _SPOOL_IN_MEMORY:
            self._memory += chunk
            return
        if self._file is None:
            self._file = tempfile.SpooledTemporaryFile(max_size=0)
            self._file.write(self._memory)
            self._memory = bytearray()
        self._file.write(chunk)

    def substitute(self, pattern: re.Pattern[bytes], value: bytes) -> int | None:
        """Put `value` between the two groups of `pattern`'s first match; the size change, or None."""
        if self._file is not None:
            return None
        match = pattern.search(self._memory)
        if match is None:
            return None
        delta = len(value) - (match.start(2) - match.end(1))
        self._memory[match.end(1) : match.start(2)] = value
        self.size += delta
        return delta

    def remove(self, pattern: re.Pattern[bytes]) -> int | None:
        """Cut `pattern`'s first match (group 1) out; the size change, or None."""
        if self._file is not None:
            return None
        match = pattern.search(self._memory)
        if match is None:
            return None
        del self._memory[match.start(1) : match.end(1)]
        self.size -= match.end(1) - match.start(1)
        return -(match.end(1) - match.start(1))

    def replay(self) -> Iterator[bytes]:
        if self._file is None:
            if self._memory:
                yield bytes(self._memory)
            return
        self._file.seek(0)
        while chunk := self._file.read(_READ_SIZE):
            yield chunk

    def close(self) -> None:
        self._memory = bytearray()
        if self._file is not None:
            self._file.close()
            self._file = None
