"""HTTP/1.1 answers as bytes: the head, and the three ways a body is delimited (RFC 9112 6).

Each body framing takes the bytes as they arrive, appends the body's own bytes to a list,
and says where the body ended: -1 while it goes on. Pure Python is enough here: a head
is parsed once per answer, and a chunk of a stream costs one `find` and two slices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from multidict import CIMultiDict

from proxy.upstream.errors import BadAnswer

MAX_HEAD = 65536        # as aiohttp's max_field_size the gateway used before
_MAX_LINE = 8192
_STATUS = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9][0-9])(?: (.*))?")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")


@dataclass(slots=True)
class Head:
    status: int
    reason: str
    headers: CIMultiDict[str]
    keep_alive: bool


def parse_head(raw: bytes) -> Head:
    """The status line and fields of an answer, `raw` ending before the blank line."""
    lines = raw.split(b"\r\n")
    status = _STATUS.fullmatch(lines[0])
    if status is None:
        raise BadAnswer(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            # also obsolete line folding (RFC 9112 5.2 lets a client reject it) and bare LFs
            raise BadAnswer(f"malformed header line: {line[:80]!r}")
        headers.add(name.decode("ascii"), value.strip(b" \t").decode("utf-8", "surrogateescape"))
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if status[1] == b"1" else "keep-alive" in connection
    return Head(int(status[2]), (status[3] or b"").decode("latin-1"), headers, keep_alive)


class Framing:
    """How an answer's body ends."""

    __slots__ = ()
    until_close = False

    @property
    def finished(self) -> bool:
        """Nothing more to read (a body that was empty from the start)."""
        return False

    def feed(self, data: bytes, out: list[bytes]) -> int:
        raise NotImplementedError


class NoBody(Framing):
    """Answers to HEAD, and 204 and 304 answers: the head is all there is."""

    __slots__ = ()

    @property
    def finished(self) -> bool:
        return True

    def feed(self, data: bytes, out: list[bytes]) -> int:
        return 0


class Fixed(Framing):
    """A Content-Length body."""

    __slots__ = ("need",)

    def __init__(self, length: int) -> None:
        self.need = length

    @property
    def finished(self) -> bool:
        return not self.need

    def feed(self, data: bytes, out: list[bytes]) -> int:
        size = len(data)
        if size < self.need:
            out.append(data)
            self.need -= size
            return -1
        take = self.need
        out.append(data if size == take else data[:take])
        self.need = 0
        return take


class UntilClose(Framing):
    """Neither length nor chunks: the body is whatever arrives before the connection closes."""

    __slots__ = ()
    until_close = True

    def feed(self, data: bytes, out: list[bytes]) -> int:
        out.append(data)
        return -1


_SIZE, _DATA, _CRLF, _TRAILER = range(4)


class Chunked(Framing):
    """Transfer-Encoding: chunked. Extensions and trailer fields are read past, not kept."""

    __slots__ = ("state", "need", "line")

    def __init__(self) -> None:
        self.state = _SIZE
        self.need = 0
        self.line = b""

    def feed(self, data: bytes, out: list[bytes]) -> int:
        pos, end = 0, len(data)
        while pos < end:
            state = self.state
            if state == _DATA:
                take = min(self.need, end - pos)
                out.append(data[pos:pos + take])
                pos += take
                self.need -= take
                if not self.need:
                    self.state, self.need = _CRLF, 2
            elif state == _CRLF:
                take = min(self.need, end - pos)
                if data[pos:pos + take] != b"\r\n"[2 - self.need:2 - self.need + take]:
                    raise BadAnswer("a chunk is not followed by CRLF")
                pos += take
                self.need -= take
                if not self.need:
                    self.state = _SIZE
            else:
                newline = data.find(b"\n", pos)
                if newline < 0:
                    self.line += data[pos:]
                    if len(self.line) > _MAX_LINE:
                        raise BadAnswer("a chunk size line is too long")
                    return -1
                line = self.line + data[pos:newline] if self.line else data[pos:newline]
                self.line = b""
                pos = newline + 1
                if self._line(line.removesuffix(b"\r")):
                    return pos
        return -1

    def _line(self, line: bytes) -> bool:
        """A size line or a trailer line; True at the blank line that ends the body."""
        if self.state == _TRAILER:
            return not line
        size = line.split(b";", 1)[0].strip(b" \t")
        if _HEX.fullmatch(size) is None:
            raise BadAnswer(f"bad chunk size: {line[:40]!r}")
        self.need = int(size, 16)
        self.state = _DATA if self.need else _TRAILER
        return False


def framing_for(head: Head, method: str) -> Framing:
    """RFC 9112 6.3, in its order: no body, chunked, length, until close."""
    status = head.status
    if method == "HEAD" or status in (204, 304) or status < 200:
        return NoBody()
    encoding = head.headers.get("transfer-encoding")
    if encoding is not None:
        if encoding.rsplit(",", 1)[-1].strip().lower() == "chunked":
            return Chunked()
        return UntilClose()
    length = head.headers.getall("content-length", None)
    if length is None:
        return UntilClose()
    if len(set(length)) > 1 or not (length[0].isascii() and length[0].isdigit()):
        raise BadAnswer(f"bad Content-Length: {', '.join(length)[:40]}")
    return Fixed(int(length[0]))
