"""The SSE parser frames events without rewriting a byte."""

from __future__ import annotations

import pytest

from proxy.wire.sse import SSEEvent, SSEParser

STREAMS = [
    b"event: a\ndata: {\"x\":1}\n\nevent: b\ndata: 2\n\n",
    b"event: a\r\ndata: {\"x\":1}\r\n\r\n: ping\r\n\r\nevent: b\r\ndata: 2\r\n\r\n",
    b"data: one\rdata: two\r\r",
    b": comment only\n\ndata: [DONE]\n\n",
]


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("size", [1, 2, 3, 5, 1000])
def test_events_are_whole_and_bytes_are_kept_whatever_the_reads(stream, size):  # noqa: ANN001
    parser = SSEParser()
    events = []
    for start in range(0, len(stream), size):
        events.extend(parser.feed(stream[start:start + size]))
    assert b"".join(e.raw for e in events) + parser.flush() == stream
    whole = SSEParser().feed(stream)
    assert [e.raw for e in events] == [e.raw for e in whole]


def test_an_event_is_returned_as_soon_as_its_blank_line_arrives():
    parser = SSEParser()
    assert parser.feed(b"event: a\ndata: 1\n") == []
    assert [e.name for e in parser.feed(b"\n")] == ["a"]


def test_fields_are_parsed_on_demand():
    event = SSEParser().feed(b"event: response.created\ndata: {\"a\":\ndata: 1}\n\n")[0]
    assert event.name == "response.created" and event.json() == {"a": 1}
    ping = SSEParser().feed(b": keep-alive\n\n")[0]
    assert ping.is_comment and ping.json() is None
    assert SSEParser().feed(b"data: [DONE]\n\n")[0].json() is None


def test_a_built_event_round_trips():
    event = SSEEvent.build({"type": "x"}, name="x")
    assert event.raw == b'event: x\ndata: {"type":"x"}\n\n'
    assert SSEParser().feed(event.raw)[0].json() == {"type": "x"}
