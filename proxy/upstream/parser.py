"""`ResponseParser`: one upstream answer off the wire, framed by llhttp (through httptools).

Sans-IO: the connection feeds it bytes and reads what they made (a head, body bytes, the end);
the parser never calls back up. llhttp runs with none of its leniency flags: it refuses bare
LFs, obs-fold, a space before a colon, control characters in values, malformed chunk sizes,
duplicate Content-Length and Content-Length beside Transfer-Encoding. On top of it these rules
give h11's verdicts where llhttp's differ (docs/architecture.md has the table):

- Transfer-Encoding must be exactly `chunked`, on one line (`gzip, chunked`, a second line,
  anything else: refused, where llhttp would read until close);
- a head (status line and fields, interim answers included) is at most `MAX_HEAD` bytes, and
  trailers at most `MAX_TRAILERS`; a stretch of framing bytes with no progress (a chunk-size
  line with a huge extension) at most `MAX_LINE`;
- a `101 Switching Protocols` is refused: the gateway never asks for one. Other 1xx interim
  answers (100 Continue, 103 Early Hints) are read past, as RFC 9110 15.2 asks of a client;
- a 1xx with a body, a status under 100 or a version other than 1.0/1.1 is refused;
- an answer to HEAD has no body whatever its length says (httptools cannot tell llhttp so), and
  HEAD, 204 and 304 answers announcing one retire their connection (a late body would otherwise
  be read as the next answer); bytes past any answer's end, or a second answer, do the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import httptools
from multidict import CIMultiDict

from proxy.upstream.errors import BadAnswer

MAX_HEAD = 65536  # as aiohttp's max_field_size the gateway used before
MAX_TRAILERS = 16384  # h11's limit on any incomplete event
MAX_LINE = 8192  # framing bytes between two signs of progress (a chunk-size line with extensions)


@dataclass(slots=True)
class Head:
    status: int
    headers: CIMultiDict[str]  # (the reason phrase is not kept: nobody reads it, RFC 9112 4)


class ResponseParser:
    """Reads the answers of one connection, one request at a time: `expect(method)` before each.
    After each `feed`: `head` once the final head is in, `take()` the body bytes so far, `done`
    at the answer's end, `reusable` whether the connection may carry another request."""

    __slots__ = (
        "head",
        "done",
        "extra",
        "until_close",
        "_parser",
        "method",
        "_fields",
        "_fed",
        "_head_bytes",
        "_trailer_bytes",
        "_chunks",
        "_size",
        "_delivered",
        "_chunk_lines",
        "_progress",
        "_quiet",
        "_keep_alive",
        "_in_body",
        "_chunked",
    )

    def __init__(self, method: str) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._chunked = True  # so that expect() sets the chunked answer's counters too
        self.expect(method)

    def expect(self, method: str) -> None:
        """Ready for the answer to the next request. llhttp starts each message afresh once the
        last one ended; after a HEAD answer (whose body llhttp still awaits) use a new parser."""
        self.head: Head | None = None
        self.done = False
        self.extra = False  # bytes came past the answer's end
        self.until_close = False  # the body ends when the connection does
        self.method = method  # the request's: an answer to HEAD has no body
        self._fields: list[tuple[str, str]] = []
        self._fed = 0  # bytes fed while no final head is in
        self._head_bytes = 0  # the head's bytes as its fields came out of the parser
        self._chunks: list[bytes] = []
        self._size = 0
        self._delivered = 0  # body bytes, all told
        self._keep_alive = False
        self._in_body = False
        if self._chunked:  # only a chunked answer moves these (`_progress` is reset by every feed)
            self._chunk_lines = 0  # chunk-size lines read
            self._trailer_bytes = 0
            self._quiet = 0  # framing bytes since the last sign of progress
            self._progress = False
            self._chunked = False

    @property
    def reusable(self) -> bool:
        """The answer ended cleanly and the connection may carry another request."""
        return self.done and self._keep_alive and not self.extra

    def feed(self, data: bytes) -> None:
        """Parse `data`; BadAnswer when it breaks a rule (the connection must then close)."""
        if self.done:
            self.extra = True  # the answer ended: nothing more may come on this connection
            return
        self._progress = False
        # Before a head, no body, trailer or chunk line has been counted; after one, only a
        # chunked body has framing to check.
        counts = (self._head_bytes, self._trailer_bytes, self._delivered, self._chunk_lines) if self._chunked else None
        head_bytes = self._head_bytes
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise BadAnswer("the upstream switched protocols unasked") from None
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, BadAnswer):
                raise cause from None
            raise BadAnswer(f"the answer could not be read: {cause or exc}") from None
        except httptools.HttpParserError as exc:
            if self.done:  # bytes after a complete answer: the answer stands, the connection goes
                self.extra = True
                return
            raise BadAnswer(f"malformed answer: {exc}") from None
        if self.head is None:
            self._fed += len(data)  # all of it belongs to heads: interim ones, or the final one unfinished
            if self._fed > MAX_HEAD:
                raise BadAnswer(f"the answer's head is over {MAX_HEAD} bytes")
        elif self._chunked and not self.extra:  # past an answer's end the bytes are not its framing
            self._check_framing(len(data), counts or (head_bytes, 0, 0, 0))

    def _check_framing(self, size: int, before: tuple[int, int, int, int]) -> None:
        """Framing bytes (chunk-size lines, CRLFs) stay within MAX_LINE per line, in one read or
        spread over many: a line may not hide megabytes of extensions."""
        head, trailers, delivered, lines = before
        framing = size - (self._delivered - delivered) - (self._trailer_bytes - trailers) - (self._head_bytes - head)
        if framing > (self._chunk_lines - lines + 1) * (MAX_LINE + 4):
            raise BadAnswer(f"a chunk-size line is over {MAX_LINE} bytes")
        self._quiet = 0 if self._progress else self._quiet + size
        if self._quiet > MAX_LINE:
            raise BadAnswer(f"a chunk-size line is over {MAX_LINE} bytes")

    def take(self) -> tuple[list[bytes], int]:
        """The body bytes read since the last take, and their size."""
        chunks, size = self._chunks, self._size
        if chunks:
            self._chunks, self._size = [], 0
        return chunks, size

    def connection_closed(self) -> bool:
        """The connection closed: True when that ends the answer (a body read until close)."""
        if self.until_close and self.head is not None and not self.done:
            self.done = True
            return True
        return self.done

    # -- httptools callbacks (called inside feed_data) --

    def on_message_begin(self) -> None:
        if self.head is not None and (self.done or self._in_body):
            self.extra = True  # a second answer to one request

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.done:
            self.extra = True  # a second answer's fields: never read into this one
            return
        if self._in_body:  # a trailer field: read past, within its limit
            self._trailer_bytes += len(name) + len(value) + 4
            if self._trailer_bytes > MAX_TRAILERS:
                raise BadAnswer(f"the answer's trailers are over {MAX_TRAILERS} bytes")
            self._progress = True
            return
        self._head_bytes += len(name) + len(value) + 4  # checked once the head is whole (one read at most)
        # llhttp has taken the leading whitespace off the value, not the trailing
        self._fields.append(
            (name.decode("latin-1"), value.rstrip(b" \t").decode("latin-1") if value.isascii() else _text(value))
        )

    def on_headers_complete(self) -> None:
        if self.head is not None:
            self.extra = True  # a second answer to one request: it never replaces the first
            return
        status = self._parser.get_status_code()
        self._head_bytes += 19  # the status line and the blank line after the fields
        if self._head_bytes > MAX_HEAD:
            raise BadAnswer(f"the answer's head is over {MAX_HEAD} bytes")
        self._progress = True
        if status < 100 or self._parser.get_http_version() not in ("1.1", "1.0"):
            raise BadAnswer(f"not an HTTP/1.x answer status: HTTP/{self._parser.get_http_version()} {status}")
        if status == 101:
            raise BadAnswer("the upstream switched protocols unasked (101)")
        if status < 200:  # interim: read past, the final answer follows
            self._fields = []
            return
        headers: CIMultiDict[str] = CIMultiDict(self._fields)
        self._fields = []
        encodings = headers.getall("transfer-encoding", None)
        if encodings is not None:
            if len(encodings) > 1 or encodings[0].lower() != "chunked":
                raise BadAnswer(
                    f"unsupported Transfer-Encoding: {', '.join(encodings)[:40]!r} (only one 'chunked' is read)"
                )
            self._chunked = True
        self.head = Head(status, headers)
        self._keep_alive = self._parser.should_keep_alive()
        no_body = self.method == "HEAD" or status in (204, 304)
        if no_body and (self._chunked or headers.get("content-length", "0") != "0"):
            # No body, whatever the fields announce; but one an upstream sends anyway may come
            # late and be read as the next answer: the connection is retired.
            self._keep_alive = False
        if self.method == "HEAD":
            self.done = True  # llhttp would wait for the body the length announces; there is none
            return
        self._in_body = True
        if no_body:
            return
        self.until_close = not self._chunked and "content-length" not in headers

    def on_body(self, body: bytes) -> None:
        if self.done:
            self.extra = True
            return
        if self.head is None:
            raise BadAnswer("an interim (1xx) answer carries a body")
        self._chunks.append(body)
        self._size += len(body)
        self._delivered += len(body)
        self._progress = True

    def on_chunk_header(self) -> None:
        self._chunk_lines += 1
        self._progress = True

    def on_message_complete(self) -> None:
        if self.head is None:
            return  # an interim answer ended
        if self.done:
            self.extra = self.extra or self._in_body
            return
        self.done = True
        self._in_body = False


def _text(value: bytes) -> str:
    """A field value that is not ASCII as text: UTF-8, or, failing that, Latin-1 (what obs-text
    meant before UTF-8), so that every value can be written on to the client."""
    value = value.rstrip(b" \t")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")
