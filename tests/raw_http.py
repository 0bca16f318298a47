"""A raw-socket HTTP/1.1 client, for requests HTTP libraries refuse to send, and a recording
upstream that keeps the exact request line of every request it is sent."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from tests.scripted_upstream import Scripted


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


async def send_raw(url: str, head: bytes, body: bytes = b"", timeout: float = 10.0) -> RawAnswer:
    """Send `head` (request line and headers, without the blank line; `Connection: close` and a
    `Host` are added when missing) and `body` on a new connection; read the answer to its end."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    lower = head.lower()
    if b"\r\nhost:" not in lower:
        head += f"\r\nHost: {parts.netloc}".encode()
    if b"\r\nconnection:" not in lower:
        head += b"\r\nConnection: close"
    try:
        writer.write(head + b"\r\n\r\n" + body)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(-1), timeout)
    finally:
        writer.close()
    return parse_answer(data)


def parse_answer(data: bytes) -> RawAnswer:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines or not lines[0].startswith("HTTP/1."):
        raise AssertionError(f"not an HTTP answer: {data[:200]!r}")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunk(body)
    return RawAnswer(status, headers, body)


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2 :]
    return out


@dataclass
class Received:
    method: str
    target: str  # exactly as the upstream read it on the request line
    head: bytes
    body: bytes

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]


Answerer = Callable[[Received], bytes]


def json_answer(status: int, body: object, extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n"
    ).encode() + data


_TASK = re.compile(r"^/v1/video(?:s|/generations)/([^/]+)(/content)?$")


def spec_answer(received: Received) -> bytes:
    """Answers like an upstream of the spec: a task id from `X-Test-Task` on submissions, a
    status for polls, bytes for downloads, a response id for responses, `{"ok": true}` otherwise."""
    head = received.head.decode("latin-1")
    if received.method == "POST" and received.path in ("/v1/video/generations", "/v1/videos"):
        task = re.search(r"\r\nx-test-task: ([^\r]+)", head, re.IGNORECASE)
        return json_answer(200, {"task_id": task[1] if task else "task_1", "status": "queued"})
    if (match := _TASK.match(received.path)) is not None:
        if match[2]:
            return b"HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: 4\r\n\r\nmp4!"
        return json_answer(200, {"task_id": match[1], "status": "processing", "progress": 10})
    if received.path == "/v1/responses":
        return json_answer(
            200,
            {
                "id": f"resp_{len(received.body)}",
                "object": "response",
                "status": "completed",
                "output": [],
                "usage": {"input_tokens": 1, "output_tokens": 1},
            },
        )
    return json_answer(200, {"ok": True})


def recording_upstream(answer: Answerer = spec_answer) -> tuple[Scripted, list[Received]]:
    """A keep-alive upstream that records every request it reads, and answers with `answer`."""
    received: list[Received] = []
    upstream: Scripted

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            raw = await upstream.read_request(reader)
            head, _, body = raw.partition(b"\r\n\r\n")
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            record = Received(method, target, head, body)
            received.append(record)
            writer.write(answer(record))
            await writer.drain()

    upstream = Scripted(handler)
    return upstream, received
