"""Server-sent events, framed without being rewritten.

The parser cuts a byte stream into events at blank lines and keeps each event's exact
bytes, so passthrough is a write of `raw`: comment lines (keep-alive pings), CRLF line
endings and unknown fields reach the client as the upstream sent them. Parsing the
fields of an event happens only when something asks.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.wire import jsonutil

# A blank line ends an event; lines end in CRLF, LF or CR (WHATWG HTML, 9.2.6).
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r|\n\r\n|\r\n\n")
_LINE_END = re.compile(r"\r\n|\r|\n")
_UNPARSED = object()


class SSEEvent:
    """One event: its exact bytes, and its fields on demand."""

    __slots__ = ("raw", "_name", "_data", "_json")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._name: str | None | object = _UNPARSED
        self._data: str | None | object = _UNPARSED
        self._json: Any = _UNPARSED

    @classmethod
    def build(cls, data: Any, name: str | None = None) -> SSEEvent:
        """A new event carrying `data` as JSON (for plugins that replace an event)."""
        head = f"event: {name}\n".encode() if name else b""
        return cls(head + b"data: " + jsonutil.dumps(data) + b"\n\n")

    @property
    def name(self) -> str | None:
        if self._name is _UNPARSED:
            self._parse_fields()
        return self._name  # type: ignore[return-value]

    @property
    def data(self) -> str | None:
        if self._data is _UNPARSED:
            self._parse_fields()
        return self._data  # type: ignore[return-value]

    @property
    def is_comment(self) -> bool:
        """True when the event holds only comment lines (a keep-alive ping)."""
        return self.name is None and self.data is None

    def json(self) -> Any:
        """The data field decoded as JSON, or None when it is absent or not JSON (`[DONE]`)."""
        if self._json is _UNPARSED:
            data = self.data
            try:
                self._json = jsonutil.loads(data) if data else None
            except jsonutil.JSONDecodeError:
                self._json = None
        return self._json

    def _parse_fields(self) -> None:
        name: str | None = None
        data: list[str] = []
        for line in _LINE_END.split(self.raw.decode("utf-8", "replace")):
            if not line or line[0] == ":":
                continue
            field, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        self._name = name
        self._data = "\n".join(data) if data else None

    def __repr__(self) -> str:
        return f"SSEEvent({self.raw[:80]!r})"


class SSEParser:
    """Feeds on network reads and returns each complete event as soon as its blank line arrives."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        buffer = self._buffer + chunk if self._buffer else chunk
        events: list[SSEEvent] = []
        start = 0
        # A terminator may straddle the previous read; look back far enough to see it whole.
        search_from = max(0, len(self._buffer) - 3)
        while match := _EVENT_END.search(buffer, search_from):
            end = match.end()
            events.append(SSEEvent(buffer[start:end]))
            start = search_from = end
        self._buffer = buffer[start:]
        return events

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream (an unterminated event), verbatim."""
        rest, self._buffer = self._buffer, b""
        return rest
