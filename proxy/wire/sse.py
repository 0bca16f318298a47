"""Server-sent events, framed without being rewritten.

The parser cuts a byte stream into events at blank lines and keeps each event's exact
bytes, so passthrough is a write of `raw`: comment lines (keep-alive pings), CRLF line
endings and unknown fields reach the client as the upstream sent them. Parsing the
fields of an event happens only when something asks.

Where an event ends is where a browser's EventSource ends it (WHATWG HTML, 9.2.6 "Interpreting
an event stream"): a line ends in CRLF, in a LF or in a CR alone, and every blank line ends an
event, whatever spelling its line ends have (`\\n\\r`, `\\r\\n\\r` then any byte but a LF, ...),
one at the stream's start or after a byte order mark included. A plugin that reads the events
(usage, the response pin) sees each event a client sees: an event the parser missed would be
one nobody counts. A blank line whose last byte is a CR is not over until the next byte says
whether a LF follows (CRLF is one line end): its event waits for that byte, or for the stream's
end (`flush`), so that the events and their bytes are the same however the network cut the reads.

Its work is linear in the bytes fed: each read is searched once (and the byte before it, where
a blank line may have begun), the first bytes of each event by the pattern and the rest by
`bytes.find` (a few ns a byte, where the pattern scans at tens: over a read of 256 KB it would
hold the worker's loop for milliseconds), and the reads an event came in are joined once, when
it ends. What it holds is bounded: an event may be at most `max_event` bytes, blank line
included; one that grows past that before its blank line comes is refused as soon as it does
(`EventTooLarge`), so an upstream that never ends an event costs the gateway that much and no
more.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.core import jsonutil

# Where a blank line begins: the last byte of a line end, then the first byte of another. Lines
# end in CRLF, LF or CR, so the first byte is any LF or CR, and the second any LF or CR that does
# not make a CRLF with it. Each match is a blank line, starting at its second byte, and each blank
# line is a match but one that starts the stream (after its byte order mark, if it has one).
_BLANK = re.compile(rb"\n[\n\r]|\r\r")
_KEYS = (b"\n\n", b"\n\r", b"\r\r")  # the same, one `bytes.find` each
_LINE_END = re.compile(r"\r\n|\r|\n")  # (CRLF first: one line end, not two)
_BOM = b"\xef\xbb\xbf"  # a stream may start with one; it is no part of the first line
_CR, _LF = 13, 10
_find = bytes.find  # (a name of its own, so that a test can count the bytes searched)
_UNPARSED = object()


class SSEEvent:
    """One event: its exact bytes, and its fields on demand."""

    __slots__ = ("raw", "_bom", "_name", "_data", "_json")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._bom = False  # it is a stream's first event, and its bytes start with a byte order mark
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
        """True when the event holds only comment lines (a keep-alive ping), or nothing."""
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
        text = self.raw.decode("utf-8", "replace")
        if self._bom:  # (decoding the stream drops it: a browser reads the first line without it)
            text = text[1:]
        for line in _LINE_END.split(text):
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


# The pattern looks this far past where an event begins (an event this short, the most of
# them, is found by it alone); an event that runs longer is found by its keys.
_WINDOW = 512


class _Keys:
    """Where blank lines begin in one read's bytes, left to right. Past the window, each key's next
    place is remembered while it lies ahead, so each key is searched for once over the read,
    however many events it holds."""

    __slots__ = ("data", "places")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.places: list[int] | None = None  # looked for once an event runs past the window

    def blank_after(self, at: int) -> int:
        """Where the first blank line that begins after byte `at` (the last of a line end, or
        any byte before one) begins; -1 if none does in these bytes."""
        data = self.data
        window = at + _WINDOW
        # (a match within the window is the first of all; one that the window's end cuts in two
        # starts at its last byte, where the keys are looked for from)
        match = _BLANK.search(data, at, window)
        if match is not None:
            return match.start() + 1
        if window >= len(data):
            return -1
        return self._by_keys(max(at, window - 1))

    def _by_keys(self, start: int) -> int:
        data, places = self.data, self.places
        if places is None:
            # -1: none ahead; -2: not looked for yet. Bytes with no LF, or no CR, are told by memchr.
            no_lf, no_cr = _find(data, b"\n", start) < 0, _find(data, b"\r", start) < 0
            places = self.places = [-1 if no_lf else -2, -1 if no_lf or no_cr else -2, -1 if no_cr else -2]
        first = -1
        for i, place in enumerate(places):
            if place != -1 and place < start:
                place = places[i] = _find(data, _KEYS[i], start)
            if place >= 0 and (first < 0 or place < first):
                first = place
        return first + 1 if first >= 0 else -1


def _begins_blank(before: int, byte: int) -> bool:
    """Whether `byte`, after `before`, begins a blank line (what `_BLANK` matches)."""
    return (before == _LF or before == _CR) and (byte == _CR or (byte == _LF and before == _LF))


class SSEParser:
    """Feeds on network reads and returns each complete event as soon as its blank line arrives."""

    __slots__ = ("_held", "_size", "_last", "_pending", "_head", "_bom", "max_event")

    def __init__(self, max_event: int | None = None) -> None:
        # The event begun and not yet ended, as the reads brought it: kept, never copied, until
        # it ends.
        self._held: list[bytes] = []
        self._size = 0
        # The byte before the next read, where a blank line may have begun. The stream starts as
        # a line does after a line end: a line end first is a blank line.
        self._last = _LF
        # What is held is a whole event whose blank line ended in a CR: one more byte, a LF or
        # not, says whether it ends there or after that LF.
        self._pending = False
        # The stream's first bytes while they may be a byte order mark, which is no line's.
        self._head: bytes | None = b""
        self._bom = False  # the next event is the stream's first, and starts with one
        self.max_event = max_event

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events `chunk` completes; EventTooLarge once an event is over `max_event` bytes."""
        events: list[SSEEvent] = []
        if not chunk:
            return events
        limit = self.max_event
        held = self._size
        origin = 0  # where the read's lines begin (past a byte order mark)
        before = self._last  # the byte before `origin`, as far as lines go
        if self._head is not None:
            head = self._head + chunk
            if len(head) < 3 and _BOM.startswith(head):  # (no line end in it: nothing to find yet)
                if limit is not None and held + len(chunk) > limit:
                    self._refuse(limit, events)
                self._head = head
                self._held.append(chunk)
                self._size = held + len(chunk)
                self._last = chunk[-1]
                return events
            self._head = None
            if head.startswith(_BOM):
                origin, before, self._bom = len(chunk) - (len(head) - 3), _LF, True
        start = 0  # where the event begun in this read starts (0 too when it began in an earlier one)
        pos = origin  # where the next blank line may begin
        if self._pending:  # the blank line that ended the last read ended in a CR: it ends here
            self._pending = False
            pos = 1 if chunk[0] == _LF else 0
            if limit is not None and held + pos > limit:
                self._refuse(limit, events)
            if pos:
                self._held.append(chunk[:1])
            events.append(SSEEvent(b"".join(self._held)))
            self._held, self._size, held = [], 0, 0
            start = pos
        size = len(chunk)
        blank_after = _Keys(chunk).blank_after
        if pos == origin:  # the byte before it came in an earlier read (or is no byte of the stream's)
            blank = pos if pos < size and _begins_blank(before, chunk[pos]) else blank_after(pos)
        else:
            blank = blank_after(pos - 1)
        while blank >= 0:
            if chunk[blank] == _LF:
                end = blank + 1
            elif blank + 1 < size:
                end = blank + 2 if chunk[blank + 1] == _LF else blank + 1
            else:  # a CR last: held below, until the next byte
                self._pending = True
                break
            if limit is not None and end - start + held > limit:
                self._refuse(limit, events)
            if held:
                self._held.append(chunk[:end])
                raw = b"".join(self._held)
                self._held, self._size, held = [], 0, 0
            else:
                raw = chunk[start:end]
            events.append(SSEEvent(raw))
            start = end
            blank = blank_after(end - 1)
        if start < size:
            rest = chunk[start:] if start else chunk
            if limit is not None and held + len(rest) > limit:
                self._refuse(limit, events)
            self._held.append(rest)
            self._size = held + len(rest)
        self._last = chunk[-1] if size > origin else before
        if self._bom and events:
            self._first(events)
        return events

    def _first(self, events: list[SSEEvent]) -> None:
        """The stream's first event starts with a byte order mark, which its first line does not."""
        self._bom = False
        events[0]._bom = True

    def _refuse(self, limit: int, events: list[SSEEvent]) -> None:
        # What was held is let go now: the exception's traceback holds `feed`'s frame, and
        # whoever catches it may keep that until a garbage collection.
        self._held, self._size, self._pending = [], 0, False
        if self._bom and events:
            self._first(events)
        raise EventTooLarge(limit, events)

    @property
    def pending(self) -> bool:
        """Whether what is held is a whole event, waiting on one byte to know where it ends."""
        return self._pending

    def flush(self) -> tuple[list[SSEEvent], bytes]:
        """At the stream's end: the event that end completes (one whose blank line ended in a CR:
        no LF will follow it), and whatever is left after the last event (an event begun and
        never ended), verbatim."""
        raw = b"".join(self._held)
        pending = self._pending
        self._held, self._size, self._pending = [], 0, False
        if not pending:
            return [], raw
        events = [SSEEvent(raw)]
        if self._bom:
            self._first(events)
        return events, b""
