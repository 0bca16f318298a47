"""A fast fake upstream for the benchmark: raw asyncio HTTP/1.1, canned answers, keep-alive.

It must never be the bottleneck, so it skips aiohttp: one JSON message answer (a chat completion
at `/v1/chat/completions`), and an SSE stream of N message events spaced by D ms when the body
asks for `"stream":true`. A request with
`x-delay-ms: N` gets its JSON answer N ms late, as a model that takes that long would.
Usage: .venv/bin/python bench/upstream.py PORT [EVENTS] [GAP_MS]
"""

from __future__ import annotations

import asyncio
import sys

MESSAGE = (
    b'{"id":"msg_bench","type":"message","role":"assistant","model":"msgmodel-haiku-4-5",'
    b'"content":[{"type":"text","text":"hello from the bench upstream"}],"stop_reason":"end_turn",'
    b'"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":6}}'
)
COMPLETION = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":1,"model":"bench",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"hello from the bench upstream"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":6,"total_tokens":18}}'
)
JSON_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(MESSAGE)
CHAT_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(COMPLETION)
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def sse_events(count: int) -> list[bytes]:
    events = [
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","usage":{"input_tokens":3}}}\n\n'
    ]
    events += [
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"tok"}}\n\n'
    ] * max(0, count - 3)
    events.append(
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
        b'"usage":{"output_tokens":5}}\n\n'
    )
    events.append(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    return events


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Upstream(asyncio.Protocol):
    def __init__(self, events: list[bytes], gap_s: float) -> None:
        self.buffer = b""
        self.events = events
        self.gap_s = gap_s
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                length = int(head[at + 15 : head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0 else None])
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            if b'"stream":true' in body:
                gap = self.gap_s
                at = head.find(b"x-gap-ms:")
                if at >= 0:
                    gap = float(head[at + 9 : head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0 else None]) / 1000
                asyncio.get_running_loop().create_task(self.stream(gap))
            elif (at := head.find(b"x-delay-ms:")) >= 0:
                delay = float(head[at + 11 : head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0 else None]) / 1000
                asyncio.get_running_loop().call_later(delay, self.answer)
            else:
                self.answer(head.startswith(b"post /v1/chat/completions"))

    def answer(self, chat: bool = False) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(CHAT_HEAD + COMPLETION if chat else JSON_HEAD + MESSAGE)

    async def stream(self, gap_s: float) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(SSE_HEAD)
        for index, event in enumerate(self.events):
            if index and gap_s:
                await asyncio.sleep(gap_s)
            if transport.is_closing():
                return
            transport.write(chunk(event))
        transport.write(b"0\r\n\r\n")


async def main(port: int, events: int, gap_ms: float) -> None:
    loop = asyncio.get_running_loop()
    canned = sse_events(events)
    server = await loop.create_server(lambda: Upstream(canned, gap_ms / 1000), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(
        main(
            int(sys.argv[1]),
            int(sys.argv[2]) if len(sys.argv) > 2 else 20,
            float(sys.argv[3]) if len(sys.argv) > 3 else 0.0,
        )
    )
