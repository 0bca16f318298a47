"""Streaming (spec 6): events forwarded as they arrive, in the spec's order, bytes intact; aborts reach the upstream."""

from __future__ import annotations

import asyncio
import hashlib
import json
import textwrap
import time
import uuid
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import BEARER
from tests.scripted_upstream import Scripted
from tests.sse import read_events

GAP_MS = 300
MSG = {"x-api-key": "sk-demo-key", "msgapi-version": "2023-06-01"}


def edit_form() -> aiohttp.FormData:
    form = aiohttp.FormData()
    form.add_field("model", "imagegen-2")
    form.add_field("prompt", "p")
    form.add_field("stream", "true")
    form.add_field("partial_images", "2")
    form.add_field("image", b"\x89PNG\r\n\x1a\n....", filename="a.png", content_type="image/png")
    return form


STREAMS = {
    "messages": (
        "/v1/messages",
        MSG,
        {
            "model": "msgmodel-sonnet-4-5",
            "max_tokens": 50,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
        ["message_start", "content_block_start"]
        + ["content_block_delta"] * 3
        + ["content_block_stop", "message_delta", "message_stop"],
    ),
    "responses": (
        "/v1/responses",
        BEARER,
        {"model": "respmodel-4o", "input": "hi", "stream": True},
        ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
        + ["response.output_text.delta"] * 3
        + [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ],
    ),
    "chat_completions": (  # asking for its usage: the stream comes byte for byte as the upstream sent it
        "/v1/chat/completions",
        BEARER,
        {
            "model": "respmodel-4o",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}],
        },
        [None] * 7,  # the role, three words, the finish reason, the usage, [DONE]
    ),
    "stream_generate_content": (
        "/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse&key=sk-demo-key",
        {},
        {"contents": [{"parts": [{"text": "hi"}]}]},
        [None] * 3,
    ),
    "image_generations": (
        "/v1/images/generations",
        BEARER,
        {"model": "imagegen-2", "prompt": "p", "stream": True, "partial_images": 2, "size": "1024x1024"},
        ["image_generation.partial_image"] * 2 + ["image_generation.completed"],
    ),
    "image_edits": ("/v1/images/edits", BEARER, None, ["image_edit.partial_image"] * 2 + ["image_edit.completed"]),
}


async def stream_through(gw, http, name: str, extra: dict[str, str] | None = None):
    path, headers, body, expected = STREAMS[name]
    request_id = uuid.uuid4().hex
    headers = {
        **headers,
        "x-sim-chunk-delay-ms": str(GAP_MS),
        "x-sim-output-tokens": "3",
        "X-Request-Id": request_id,
        **(extra or {}),
    }
    sim = gw.sim()
    started = time.monotonic()
    kwargs = {"json": body} if body is not None else {"data": edit_form()}
    async with http.post(gw.url + path, headers=headers, **kwargs) as answer:
        assert answer.status == 200
        assert answer.headers["Cache-Control"] == "no-cache" and answer.headers["X-Accel-Buffering"] == "no"
        raw, events = await read_events(answer, on_event=lambda: sim.events_sent[request_id])
    return raw, events, expected, time.monotonic() - started, request_id


@pytest.mark.parametrize("name", list(STREAMS))
async def test_events_arrive_as_sent_and_in_the_spec_order(gateway, http, name):
    raw, events, expected, duration, request_id = await stream_through(gateway, http, name)
    assert [e.name for e in events] == expected
    # Each event reached the client before the upstream had written the next one: never an event
    # behind, until the one with the closing counts: from it on the events go with the stream's
    # end, after the request's bookkeeping (an SDK has its whole answer with them).
    # A chat stream's finish goes with its closing counts (and [DONE]): the answer is never whole before them.
    closing = len(events) - (3 if name == "chat_completions" else 1)
    if name == "messages":
        closing = expected.index("message_delta")
    assert [e.upstream_sent_when_read for e in events] == list(range(1, closing + 1)) + [len(events)] * (
        len(events) - closing
    )
    # ... so the first one came long before a third of the stream had passed.
    assert events[0].at - 0 < duration / 3
    assert hashlib.sha256(raw).hexdigest() == gateway.sim().stream_digests[request_id]
    if name == "stream_generate_content":
        assert all("candidates" in e.json for e in events)
        assert events[-1].json["candidates"][0]["finishReason"] == "STOP"
        assert events[-1].json["usageMetadata"]["candidatesTokenCount"] == 3


async def test_split_events_comments_and_crlf_pass_through_intact(gateway, http):
    knobs = {"x-sim-split": "1", "x-sim-comments": "1", "x-sim-crlf": "1"}
    raw, events, expected, _, request_id = await stream_through(gateway, http, "messages", knobs)
    assert hashlib.sha256(raw).hexdigest() == gateway.sim().stream_digests[request_id]
    assert raw.count(b": ping\r\n\r\n") == len(expected)
    assert b"\n\n" not in raw.replace(b"\r\n", b"")
    assert [e.name for e in events if e.name] == expected


async def test_client_disconnect_mid_stream_closes_the_upstream(gateway):
    sim = gateway.sim()
    body = {
        "model": "msgmodel-sonnet-4-5",
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    headers = {**MSG, "x-sim-chunk-delay-ms": "200", "x-sim-output-tokens": "50"}
    async with aiohttp.ClientSession() as http:
        answer = await http.post(gateway.url + "/v1/messages", json=body, headers=headers)
        await answer.content.readuntil(b"\n\n")
        assert sim.open_streams == 1
        answer.close()  # drop the connection mid-stream
    for _ in range(100):
        if sim.aborted == 1 and sim.open_streams == 0:
            break
        await asyncio.sleep(0.02)
    assert sim.aborted == 1 and sim.open_streams == 0


@pytest.mark.parametrize("stream", [True, False])
async def test_client_disconnect_before_the_first_byte_cancels_the_upstream(gateway, stream):
    sim = gateway.sim()
    body = {
        "model": "msgmodel-sonnet-4-5",
        "max_tokens": 50,
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
    }
    headers = {**MSG, "x-sim-latency-ms": "5000"}
    async with aiohttp.ClientSession() as http:
        task = asyncio.create_task(http.post(gateway.url + "/v1/messages", json=body, headers=headers))
        for _ in range(100):
            if sim.requests:
                break
            await asyncio.sleep(0.02)
        task.cancel()
    for _ in range(100):
        if sim.aborted == 1:
            break
        await asyncio.sleep(0.02)
    assert sim.aborted == 1


@pytest.mark.parametrize("mode", ["stream", "stream with its usage read", "bytes of known length", "buffered"])
async def test_an_answer_ends_only_after_its_bookkeeping(start_gateway, http, mode):
    """on_complete (where the ledger journals its record) runs before the client has the end of its
    answer, however it is relayed: a streamed answer's end, the last bytes of one of known length
    (relayed as they come) and a buffered body all wait for it; a stream's events do not."""
    from tests.recording_plugin import EndHolder

    EndHolder.holding, EndHolder.release = asyncio.Event(), asyncio.Event()
    read = {"buffered": "usage, ", "stream with its usage read": "sse, "}.get(mode, "")
    plugins = f"auth, {read}tests.recording_plugin:EndHolder"
    gateway = await start_gateway(f"routes: {{messages: {{plugins: [{plugins}]}}}}")
    body = {
        "model": "msgmodel-sonnet-4-5",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": mode.startswith("stream"),
    }
    received = bytearray()

    async def fetch() -> aiohttp.ClientResponse:
        async with http.post(gateway.url + "/v1/messages", json=body, headers={**MSG, "x-test-hold": "1"}) as answer:
            async for chunk in answer.content.iter_any():
                received.extend(chunk)
            return answer

    fetching = asyncio.get_running_loop().create_task(fetch())
    try:
        await asyncio.wait_for(EndHolder.holding.wait(), 5)  # the upstream's answer has been relayed, or read whole
        await asyncio.sleep(0.3)
        assert not fetching.done(), "the client had its whole answer before the request's bookkeeping ran"
        if mode == "stream":
            assert b"message_stop" in received  # every event is there: only the end waits
        if mode == "stream with its usage read":  # an SDK has its whole answer with the closing counts
            assert b"content_block_stop" in received and b"message_delta" not in received, received
    finally:
        EndHolder.release.set()
    answer = await asyncio.wait_for(fetching, 5)
    assert answer.status == 200
    if mode.startswith("stream"):
        assert answer.headers.get("Content-Length") is None and received.endswith(b"\n\n")
        assert received.count(b"event: message_stop") == 1
    else:
        assert "Content-Length" in answer.headers and received.endswith(b"}")  # (decompressed)


async def test_what_a_stream_holds_for_its_end_is_bounded_like_a_buffered_answer(start_gateway, http):
    """Events after the closing counts wait for the end only up to what the relay holds of a whole
    answer (server.max_json_body_mb): an upstream that goes on past them is written on, not held."""
    from tests.recording_plugin import EndHolder

    EndHolder.holding, EndHolder.release = asyncio.Event(), asyncio.Event()
    gateway = await start_gateway("""
        server: {max_json_body_mb: 0.0002}
        routes: {messages: {plugins: [auth, sse, tests.recording_plugin:EndHolder]}}
        """)
    body = {
        "model": "msgmodel-sonnet-4-5",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    received = bytearray()

    async def fetch() -> None:
        async with http.post(gateway.url + "/v1/messages", json=body, headers={**MSG, "x-test-hold": "1"}) as answer:
            async for chunk in answer.content.iter_any():
                received.extend(chunk)

    fetching = asyncio.get_running_loop().create_task(fetch())
    try:
        await asyncio.wait_for(EndHolder.holding.wait(), 5)
        await asyncio.sleep(0.3)
        assert b"event: message_delta" in received and b"event: message_stop" in received  # over the bound: written
    finally:
        EndHolder.release.set()
    await asyncio.wait_for(fetching, 5)
    assert received.count(b"event: message_stop") == 1 and received.endswith(b"\n\n")


async def test_a_client_that_leaves_during_the_bookkeeping_cuts_none_of_it_short(start_gateway, http):
    """The client resets its connection while its request's on_complete hooks run (the handler is
    cancelled then): every hook still runs to its end, so no settlement is left half made."""
    from tests.recording_plugin import EndHolder

    EndHolder.holding, EndHolder.release = asyncio.Event(), asyncio.Event()
    EndHolder.finished = []
    gateway = await start_gateway("routes: {messages: {plugins: [auth, sse, tests.recording_plugin:EndHolder]}}")
    body = {
        "model": "msgmodel-sonnet-4-5",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    answer = await http.post(gateway.url + "/v1/messages", json=body, headers={**MSG, "x-test-hold": "1"})
    await asyncio.wait_for(EndHolder.holding.wait(), 5)
    answer.connection.transport.abort()  # type: ignore[union-attr]  # gone, its bookkeeping under way
    await asyncio.sleep(0.3)  # the handler is cancelled by now
    EndHolder.release.set()
    for _ in range(50):
        if EndHolder.finished:
            break
        await asyncio.sleep(0.05)
    assert len(EndHolder.finished) == 1


# -- blank lines of every spelling, from an upstream through the gateway ---------------------------


def message_stream(blank: bytes, line: bytes = b"\n", last: str = "message_stop") -> list[bytes]:
    """A message stream (input 11 tokens, output 7 in its closing counts) whose lines end in `line`
    and whose blank lines in `blank`, as the pieces an upstream writes: each cut just after its
    blank line's first byte, so that a read may end in a CR that a LF follows, or does not."""
    payloads = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "msgmodel-haiku-4-5",
                    "content": [],
                    "usage": {"input_tokens": 11, "output_tokens": 1},
                },
            },
        ),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        *[
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}},
            )
            for word in ("a", "b", "c")
        ],
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    payloads = payloads[: [name for name, _ in payloads].index(last) + 1]
    pieces = []
    for name, payload in payloads:
        event = b"event: " + name.encode() + line + b"data: " + json.dumps(payload).encode() + line
        pieces += [event + blank[:1], blank[1:]]
    return pieces


def streaming_upstream(pieces: list[bytes], end: bool = True) -> Scripted:
    """An upstream that answers each request with a chunked SSE stream of `pieces`, one chunk each,
    a moment apart (so that the gateway's reads are likely cut where the pieces are); without
    `end`, it closes the connection after them instead of ending the body."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            await upstream.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for piece in pieces:
                if piece:
                    writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
                    await writer.drain()
                    await asyncio.sleep(0.005)
            if not end:
                return
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    upstream = Scripted(answer)
    return upstream


def metered_gateway(redis_url: str, ledger_db: str, spool: Path, upstream_url: str) -> str:
    from tests.test_metering_abuse import KEY

    return textwrap.dedent(f"""
        state: {{backend: redis, url: '{redis_url}'}}
        keys: [{{name: spender, key: {KEY}, budget: {{tokens_per_day: 100000}}}}]
        channels: [{{name: scripted, base_url: '{upstream_url}'}}]
        observability: {{logging: {{access_log: false}}}}
        plugins:
          ledger: {{database_url: '{ledger_db}', flush_interval_s: 0.05, spool_dir: '{spool}'}}
        """)


METERED_BODY = {
    "model": "msgmodel-haiku-4-5",
    "max_tokens": 900,
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}


@pytest.mark.parametrize(
    ("blank", "line", "last"),
    [
        (b"\r", b"\n", "message_stop"),  # `\n\r` blank lines: the last CR has the stream's end after it
        (b"\r", b"\r\n", "message_delta"),  # `\r\n\r`: the closing counts' event ends with the stream
        (b"\r\n", b"\n", "message_stop"),  # `\n\r\n`: a CR that a LF follows in the next read
    ],
    ids=["lf-then-cr", "crlf-then-cr", "lf-then-crlf"],
)
async def test_an_upstream_s_blank_lines_of_any_spelling_give_the_client_and_the_metering_every_event(
    ledger_db, redis_url, start_gateway, http, tmp_path, blank, line, last
) -> None:
    """Every event a browser reading the upstream would see reaches the client, byte for byte, and
    the plugins that read events: the usage is the upstream's own closing counts, not an estimate
    (an event the framing missed is one the metering never reads, and its tokens go uncharged)."""
    from tests.sse_spec import interpret
    from tests.test_metering_abuse import MSG as METERED
    from tests.test_metering_abuse import agreed

    pieces = message_stream(blank, line, last)
    sent = b"".join(pieces)
    expected = interpret(sent).events
    assert [name for name, _ in expected][-1] == last and len(expected) == (8 if last == "message_stop" else 7)
    async with streaming_upstream(pieces) as upstream:
        gateway = await start_gateway(metered_gateway(redis_url, ledger_db, tmp_path / "spool", upstream.url))
        async with http.post(gateway.url + "/v1/messages", json=METERED_BODY, headers=METERED) as answer:
            assert answer.status == 200
            received = await asyncio.wait_for(answer.read(), 10)
    assert received == sent
    assert interpret(received).events == expected  # (what the client's own reader makes of them)
    held, [row] = await agreed(redis_url, ledger_db, 1)
    assert (row["input_tokens"], row["output_tokens"], row["estimated"]) == (11, 7, False)
    assert held == 18


async def test_an_event_whole_when_the_upstream_broke_off_goes_on_before_the_error(
    ledger_db, redis_url, start_gateway, http, tmp_path
) -> None:
    """The upstream closes its connection mid-body just after a blank line ending in a CR: that
    event was whole (no byte that came after could have changed it), so the client and the
    metering get it, then the stream's error event."""
    from proxy.formats import MESSAGES
    from tests.sse_spec import interpret
    from tests.test_metering_abuse import MSG as METERED
    from tests.test_metering_abuse import agreed

    pieces = message_stream(b"\r", b"\r\n", "message_delta")
    sent = b"".join(pieces)
    async with streaming_upstream(pieces, end=False) as upstream:
        gateway = await start_gateway(metered_gateway(redis_url, ledger_db, tmp_path / "spool", upstream.url))
        async with http.post(gateway.url + "/v1/messages", json=METERED_BODY, headers=METERED) as answer:
            received = await asyncio.wait_for(answer.read(), 10)
    assert received == sent + MESSAGES.stream_error(502, "upstream closed the stream before it finished")
    assert [name for name, _ in interpret(received).events][-2:] == ["message_delta", "error"]
    held, [row] = await agreed(redis_url, ledger_db, 1)
    assert (row["cut_by"], row["input_tokens"], row["output_tokens"], row["estimated"]) == ("upstream", 11, 7, False)
