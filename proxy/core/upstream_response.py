"""`UpstreamResponse`: a buffered upstream answer, as `on_response` hooks read and change it."""

from __future__ import annotations

import zlib
from typing import Any

from multidict import CIMultiDict

from proxy.core import jsonutil
from proxy.core.headers import content_codings

_UNPARSED = object()
DECODED_LIMIT = 64 * 1024 * 1024  # the most of a decoded answer body the gateway will hold


class AnswerTooLarge(Exception):
    """An upstream answer larger, once decoded, than the gateway will hold."""


class UpstreamResponse:
    """A buffered upstream answer that `on_response` hooks may read and change."""

    __slots__ = ("status", "headers", "body", "changed", "_json")

    def __init__(self, status: int, headers: CIMultiDict[str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.changed = False
        self._json: Any = _UNPARSED

    @property
    def is_json(self) -> bool:
        return "json" in self.headers.get("content-type", "")

    def decoded_body(self, limit: int = DECODED_LIMIT) -> bytes | None:
        """The body without its Content-Encoding, or None when it cannot be decoded here: an
        unknown coding, more than one (in one header or several), or bytes that do not decode.
        More than `limit` bytes once decoded (a small gzip can hide a huge body) raise AnswerTooLarge."""
        codings = content_codings(self.headers)
        if not codings:
            return self.body
        if len(codings) > 1 or codings[0] not in ("gzip", "x-gzip", "deflate"):
            return None
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS if codings[0] != "deflate" else zlib.MAX_WBITS)
        try:
            data = inflate.decompress(self.body, limit + 1)
        except zlib.error:
            return None
        if len(data) > limit:
            raise AnswerTooLarge(limit)
        return data if inflate.eof else None

    def json(self) -> Any:
        if self._json is _UNPARSED:
            try:
                self._json = jsonutil.parsed(self.decoded_body() if self.is_json else None)
            except AnswerTooLarge:
                self._json = None
        return self._json

    def set_json(self, value: Any) -> None:
        self._json = value
        self.body = jsonutil.dumps(value)
        self.headers.popall("content-encoding", None)
        self.headers["Content-Type"] = "application/json"
        self.changed = True
