"""Server-sent events, framed without being rewritten.

The parser cuts a byte stream into events at blank lines and keeps each event's exact
bytes, so passthrough is a write of `raw`: comment lines (keep-alive pings), CRLF line
endings and unknown fields reach the client as the upstream sent them. Parsing the
fields of an event happens only when something asks.

Its work is linear in the bytes fed: each read is searched once (and the three bytes before
it, where a blank line may have begun), the first bytes of each event by the pattern and the
rest by `bytes.find` (a few ns a byte, where the pattern scans at tens: over a read of 256 KB
it would hold the worker's loop for milliseconds), and the reads an event came in are joined
once, when it ends. What it holds is bounded: an event may be at most `max_event` bytes, blank
line included; one that grows past that before its blank line comes is refused as soon as it
does (`EventTooLarge`), so an upstream that never ends an event costs the gateway that much and
no more.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.wire import jsonutil

# A blank line ends an event; lines end in CRLF, LF or CR (WHATWG HTML, 9.2.6).
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r|\n\r\n|\r\n\n")
_LINE_END = re.compile(r"\r\n|\r|\n")
# Every event end holds one of these, from its first byte or its second ("\r\n\r\n" holds
# "\n\r\n", "\r\n\n" holds "\n\n"): where the first of them is, the pattern says which end
# starts there or just before.
_KEYS = (b"\n\n", b"\r\r", b"\n\r\n")
_find = bytes.find  # (a name of its own, so that a test can count the bytes searched)
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


class EventTooLarge(Exception):
    """An event grew past the parser's `max_event` bytes. `events`: the whole events that came
    before it in the same read, which the stream has yet to carry (whatever the network's
    reads, the same events come before the refusal)."""

    def __init__(self, limit: int, events: list[SSEEvent]) -> None:
        super().__init__(f"an event is over {limit} bytes")
        self.limit = limit
        self.events = events


# The longest event end is four bytes: the last three held may hold the start of one.
_OVERLAP = 3
# The pattern looks this far past where an event begins (an event this short, the most of
# them, is found by it alone); an event that runs longer is found by its keys.
_WINDOW = 512


class _Ends:
    """The event ends in one read's bytes, left to right. Past the window, each key's next place
    is remembered while it lies ahead, so each key is searched for once over the read, however
    many events it holds."""

    __slots__ = ("data", "places")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.places: list[int] | None = None  # looked for once an event runs past the window

    def after(self, start: int) -> int | None:
        """The end of the first event end at or after `start`, if there is one."""
        data = self.data
        window = start + _WINDOW
        # (a match within the window is the first of all: one that runs past the window's end
        # starts in its last three bytes, where the keys are looked for from, and one that
        # starts earlier fits in it)
        match = _EVENT_END.search(data, start, window)
        if match is not None:
            return match.end()
        if window >= len(data):
            return None
        return self._by_keys(max(start, window - _OVERLAP))

    def _by_keys(self, start: int) -> int | None:
        data, places = self.data, self.places
        if places is None:
            # -1: none ahead. Bytes with no line end at all (one long line) are told by memchr alone.
            none = _find(data, b"\n", start) < 0 and _find(data, b"\r", start) < 0
            places = self.places = [-1, -1, -1] if none else [-2, -2, -2]  # (-2: not looked for yet)
        first = -1
        for i, place in enumerate(places):
            if place != -1 and place < start:
                place = places[i] = _find(data, _KEYS[i], start)
            if place >= 0 and (first < 0 or place < first):
                first = place
        if first < 0:
            return None
        # An end starts at a key or one byte before it: none starts earlier.
        match = _EVENT_END.search(data, max(start, first - 1))
        return match.end() if match is not None else None


class SSEParser:
    """Feeds on network reads and returns each complete event as soon as its blank line arrives."""

    __slots__ = ("_held", "_size", "_tail", "max_event")

    def __init__(self, max_event: int | None = None) -> None:
        # The event begun and not yet ended, as the reads brought it: kept, never copied, until
        # it ends; `_tail`, its last bytes, where the blank line that ends it may have begun.
        self._held: list[bytes] = []
        self._size = 0
        self._tail = b""
        self.max_event = max_event

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events `chunk` completes; EventTooLarge once an event is over `max_event` bytes."""
        limit = self.max_event
        events: list[SSEEvent] = []
        held = self._size
        first_end: int | None = None
        if held:  # a blank line begun in what is held and ended by the new bytes
            tail = self._tail
            found = _EVENT_END.search(tail + chunk[:_OVERLAP])
            if found is not None and found.start() < len(tail):  # (it never ends in the tail: that was searched)
                first_end = found.end() - len(tail)
        ends = _Ends(chunk)
        start = 0
        while (end := first_end if first_end is not None else ends.after(start)) is not None:
            first_end = None
            if limit is not None and end - start + held > limit:
                self._refuse(limit, events)
            if held:
                self._held.append(chunk[:end])
                raw = b"".join(self._held)
                self._held, self._size, self._tail, held = [], 0, b"", 0
            else:
                raw = chunk[start:end]
            events.append(SSEEvent(raw))
            start = end
        if start < len(chunk):
            rest = chunk[start:] if start else chunk
            if limit is not None and held + len(rest) > limit:
                self._refuse(limit, events)
            self._held.append(rest)
            self._size = held + len(rest)
            self._tail = rest[-_OVERLAP:] if len(rest) >= _OVERLAP else (self._tail + rest)[-_OVERLAP:]
        return events

    def _refuse(self, limit: int, events: list[SSEEvent]) -> None:
        # What was held is let go now: the exception's traceback holds `feed`'s frame, and
        # whoever catches it may keep that until a garbage collection.
        self._held, self._size, self._tail = [], 0, b""
        raise EventTooLarge(limit, events)

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream (an unterminated event), verbatim."""
        rest = b"".join(self._held)
        self._held, self._size, self._tail = [], 0, b""
        return rest
