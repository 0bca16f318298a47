"""The SSE parser frames events where a browser does, without rewriting a byte, in time and
memory linear in what it is fed."""

from __future__ import annotations

import re
import tracemalloc
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wire import sse
from proxy.wire.sse import EventTooLarge, SSEEvent, SSEParser
from tests.sse_spec import dispatched, interpret

STREAMS = [
    b'event: a\ndata: {"x":1}\n\nevent: b\ndata: 2\n\n',
    b'event: a\r\ndata: {"x":1}\r\n\r\n: ping\r\n\r\nevent: b\r\ndata: 2\r\n\r\n',
    b"data: one\rdata: two\r\r",
    b": comment only\n\ndata: [DONE]\n\n",
    b'data: {"a":1}\n\rdata: {"b":2}\n\r\n\r\n\rdata: 3\r\n\r',
    b"\xef\xbb\xbf\ndata: 1\n\n\n\r\n",
]


def read_all(parser: SSEParser, stream: bytes, size: int) -> tuple[list[SSEEvent], bytes]:
    events = []
    for start in range(0, len(stream), size):
        events.extend(parser.feed(stream[start : start + size]))
    last, rest = parser.flush()
    return events + last, rest


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("size", [1, 2, 3, 5, 1000])
def test_events_are_whole_and_bytes_are_kept_whatever_the_reads(stream, size):
    events, rest = read_all(SSEParser(), stream, size)
    assert b"".join(e.raw for e in events) + rest == stream
    whole, whole_rest = read_all(SSEParser(), stream, len(stream))
    assert [e.raw for e in events] == [e.raw for e in whole] and rest == whole_rest


# Each spelling of a blank line: LF, CR or CRLF after a line's LF, CR or CRLF; and a browser's
# events from each (the line end before the blank line's is the data line's own).
SPELLINGS = [
    first + blank for first in (b"\n", b"\r", b"\r\n") for blank in (b"\n", b"\r", b"\r\n") if first + blank != b"\r\n"
]  # (a CR then a LF is one line end: no blank line)


@pytest.mark.parametrize("end", SPELLINGS)
@pytest.mark.parametrize("size", [1, 2, 3, 1000])
def test_every_spelling_of_a_blank_line_ends_an_event_as_a_browser_ends_it(end, size):
    stream = b'data: {"a":1}' + end + b'data: {"b":2}' + end + b'event: last\ndata: {"c":3}' + end
    events, rest = read_all(SSEParser(), stream, size)
    assert [e.json() for e in events] == [{"a": 1}, {"b": 2}, {"c": 3}] and events[2].name == "last"
    assert [e.raw for e in events] == interpret(stream).cut(stream)[0] and rest == b""


def test_a_blank_line_of_lf_then_cr_ends_an_event():
    """`\n\r` (a LF ending the data line, then a blank line that a CR alone ends) was no event's
    end to the parser before: the two events were one to the plugins, whose data (two JSON
    documents) was no JSON, while a browser had both."""
    events = SSEParser().feed(b'data: {"a":1}\n\rdata: {"b":2}\n\n')
    assert [e.json() for e in events] == [{"a": 1}, {"b": 2}]
    events = SSEParser().feed(b'data: {"a":1}\r\n\rdata: {"b":2}\r\n\r\n')
    assert [e.raw for e in events] == [b'data: {"a":1}\r\n\r', b'data: {"b":2}\r\n\r\n']


def test_a_blank_line_ending_in_a_cr_waits_for_the_next_byte_or_the_stream_s_end():
    parser = SSEParser()
    assert parser.feed(b"data: 1\r\n\r") == [] and parser.pending  # a LF may yet make it CRLF
    assert [e.raw for e in parser.feed(b"\ndata: 2\n\r")] == [b"data: 1\r\n\r\n"]
    # no LF after it: that event ended at its CR
    assert [e.raw for e in parser.feed(b"data: 3\n\n")] == [b"data: 2\n\r", b"data: 3\n\n"]
    parser.feed(b"data: 4\r\r")
    last, rest = parser.flush()  # the stream's end: no LF will come
    assert [e.data for e in last] == ["4"] and rest == b""
    assert SSEParser().flush() == ([], b"")


def test_a_byte_order_mark_starts_no_line():
    """Decoding the stream drops one leading BOM: the first line starts after it, a blank one too."""
    stream = b"\xef\xbb\xbfdata: 1\n\n\xef\xbb\xbfdata: 2\n\n"
    for size in (1, 2, 4, 1000):
        events, _ = read_all(SSEParser(), stream, size)
        assert [e.data for e in events] == ["1", None]  # the second's is a field named "\ufeffdata"
    events, _ = read_all(SSEParser(), b"\xef\xbb\xbf\r\ndata: 1\n\n", 1)
    assert [e.raw for e in events] == [b"\xef\xbb\xbf\r\n", b"data: 1\n\n"]


def test_an_event_is_returned_as_soon_as_its_blank_line_arrives():
    parser = SSEParser()
    assert parser.feed(b"event: a\ndata: 1\n") == []
    assert [e.name for e in parser.feed(b"\n")] == ["a"]


def test_fields_are_parsed_on_demand():
    event = SSEParser().feed(b'event: response.created\ndata: {"a":\ndata: 1}\n\n')[0]
    assert event.name == "response.created" and event.json() == {"a": 1}
    ping = SSEParser().feed(b": keep-alive\n\n")[0]
    assert ping.is_comment and ping.json() is None
    assert SSEParser().feed(b"data: [DONE]\n\n")[0].json() is None


def test_a_built_event_round_trips():
    event = SSEEvent.build({"type": "x"}, name="x")
    assert event.raw == b'event: x\ndata: {"type":"x"}\n\n'
    assert SSEParser().feed(event.raw)[0].json() == {"type": "x"}


# -- any chunking gives what the whole stream gives ------------------------------------------------


def reference(stream: bytes, limit: int | None) -> tuple[list[bytes], bytes | None]:
    """The events of a whole stream as the spec reads it (cut at its blank lines), and what is left;
    past the cap, the events before the first one over it and None."""
    events, rest = interpret(stream).cut(stream)
    for i, event in enumerate(events):
        if limit is not None and len(event) > limit:
            return events[:i], None
    return (events, None) if limit is not None and len(rest) > limit else (events, rest)


def chunked(parser: SSEParser, stream: bytes, cuts: list[int]) -> tuple[list[bytes], bytes | None]:
    events: list[bytes] = []
    bounds = [0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)]
    try:
        for start, end in zip(bounds, bounds[1:]):
            events += [e.raw for e in parser.feed(stream[start:end])]
    except EventTooLarge as refused:
        return events + [e.raw for e in refused.events], None
    last, rest = parser.flush()
    return events + [e.raw for e in last], rest


# Line ends of every kind, in every order, between short fields: blank lines of every spelling
# (and byte order marks, whole or not, which only the stream's first bytes may be).
PIECES = st.sampled_from(
    [b"\r", b"\n", b"\r\n", b"data: x", b"event: y", b": ping", b"a", b"\xff", b"data:", b"\xef\xbb\xbf", b"\xef\xbb"]
)


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(PIECES, max_size=40),
    cuts=st.lists(st.integers(min_value=0), max_size=12),
    limit=st.one_of(st.none(), st.integers(min_value=1, max_value=60)),
    window=st.integers(1, 9),
)
def test_any_chunking_gives_the_events_and_bytes_of_the_whole_stream(pieces, cuts, limit, window):
    stream = b"".join(pieces)
    events, rest = chunked(SSEParser(limit), stream, cuts)
    assert (events, rest) == reference(stream, limit)
    if rest is not None:
        assert b"".join(events) + rest == stream  # not a byte rewritten, added or lost
        # and the events a browser dispatches are the ones the plugins read
        whole = SSEParser()
        parsed = whole.feed(stream) + whole.flush()[0]
        assert dispatched(parsed) == interpret(stream).events
    with patch.object(sse, "_WINDOW", window):  # events found by their keys, as long ones are
        assert chunked(SSEParser(limit), stream, cuts) == (events, rest)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 64])
def test_an_event_over_the_cap_is_refused_after_the_events_before_it_whatever_the_reads(size):
    stream = b"data: 1\n\n" + b"data: " + b"x" * 100 + b"\n\ndata: 3\n\n"
    assert chunked(SSEParser(50), stream, list(range(0, len(stream), size))) == ([b"data: 1\n\n"], None)
    # exactly at the cap is whole
    assert chunked(SSEParser(108), stream, list(range(0, len(stream), size)))[0][1] == b"data: " + b"x" * 100 + b"\n\n"


def test_an_event_that_never_ends_is_refused_once_past_the_cap_and_nothing_is_kept():
    parser = SSEParser(max_event=1000)
    parser.feed(b"data: ")
    with pytest.raises(EventTooLarge) as refused:
        for _ in range(100):
            parser.feed(b"x" * 100)
    assert refused.value.limit == 1000 and refused.value.events == []
    assert parser.flush() == ([], b"")


# -- linear work ----------------------------------------------------------------------------------


class Counting:
    """Counts the bytes the parser's searches are handed, from where each starts to where it
    stops: its finds (to the key found, or the end) and its pattern's searches (to the match's end)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.scanned = 0
        pattern, find = sse._BLANK, sse._find
        counting = self

        class Pattern:
            def search(self, data: bytes, pos: int = 0, endpos: int | None = None) -> re.Match[bytes] | None:
                stop = len(data) if endpos is None else min(endpos, len(data))
                found = pattern.search(data, pos, stop)
                counting.scanned += (found.end() if found else stop) - pos
                return found

        def counted_find(data: bytes, key: bytes, start: int) -> int:
            at = find(data, key, start)
            counting.scanned += (at + len(key) if at >= 0 else len(data)) - start
            return at

        monkeypatch.setattr(sse, "_BLANK", Pattern())
        monkeypatch.setattr(sse, "_find", counted_find)


STREAMS_TO_SCAN = {
    "long events": (b"data: " + b"x" * 20_000 + b"\n\n") * 3,
    "long events of many lines": (b"data: xxxxxxxx\n" * 2000 + b"\n") * 3,
    "many short events": b"event: a\ndata: 1\n\n" * 3000,
    "many short CRLF events": b"event: a\r\ndata: 1\r\n\r\n" * 3000,
    "many short events ended by a CR": b"event: a\ndata: 1\n\r" * 3000,
    "long lines ended by CRs": (b"data: " + b"x" * 5000 + b"\r") * 12 + b"\r",
}


@pytest.mark.parametrize("read", [1, 7, 4096, 65536])
@pytest.mark.parametrize("name", list(STREAMS_TO_SCAN))
def test_the_bytes_searched_are_linear_in_the_bytes_fed(monkeypatch, read, name):
    stream = STREAMS_TO_SCAN[name]
    events = len(interpret(stream).blank_lines)
    counting = Counting(monkeypatch)
    parser = SSEParser()
    reads = 0
    for start in range(0, len(stream), read):
        parser.feed(stream[start : start + read])
        reads += 1
    # Each read looked over once by the pattern (the first bytes of each event), once for a LF and
    # once for a CR and once for each key (the rest), and the pattern over a few bytes more an
    # event and a read (the byte before, where a blank line began): never again over the event
    # held so far.
    assert counting.scanned <= (1 + 2 + len(sse._KEYS)) * len(stream) + 6 * reads + 8 * events, counting.scanned


def test_the_bytes_copied_are_linear_in_the_bytes_fed():
    """Memory allocated feeding an event that never ends: the growth of one buffer (amortised),
    not a new buffer the size of the event at every read (that made the parser quadratic)."""
    parser = SSEParser()
    read = b"x" * 1024
    parser.feed(b"data: ")
    tracemalloc.start()
    try:
        allocated = 0
        for _ in range(4000):  # a 4 MB event
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            parser.feed(read)
            allocated += tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    fed = 4000 * len(read)
    # A quadratic parser allocates about 4000 * 2 MB = 8 GB here; this one a few times what it holds.
    assert allocated < 4 * fed, allocated
