"""A stream event is held only up to `server.max_stream_event_mb`: an upstream that never ends an
event gets the stream ended with the format's error event and its connection closed, the request
is recorded and charged as cut by the upstream, and the worker's memory and its other answers do
not notice (docs/security.md, "Bounds: server-sent events").

Each case runs through real sockets: a client, the gateway (in this process, or a process of its
own where its memory and latency are measured), and a scripted upstream in this process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import REGISTRY

from proxy.core import jsonutil
from proxy.formats import CHAT, CONTENT, IMAGES, MESSAGES, RESPONSES, Format
from tests.conftest import BEARER, DEMO_KEY, MESSAGE_HEADERS
from tests.scripted_upstream import Scripted

MB = 1024 * 1024
PIECE = MB  # what the upstream writes at a time: it sends as fast as the connection takes it
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
BEFORE = b'event: ping\ndata: {"n":1}\n\n'
WHOLE = "x-test-whole"  # a request carrying this header gets a short stream that ends


def framed(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class EndlessEvent(Scripted):
    """An upstream that answers a stream with `before`, then one event of `size` bytes with no
    blank line, written as fast as the connection takes it (chunked, as upstreams stream);
    `sent[i]`: how much of that event the i-th such request had written when its connection
    ended. A request carrying `WHOLE` gets `before` and one more event, and its end."""

    def __init__(self, before: bytes = BEFORE, size: int = 400 * MB) -> None:
        super().__init__(self._answer)
        self.before = before
        self.size = size
        self.sent: list[int] = []

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        piece = framed(b"x" * PIECE)
        while True:
            request = await self.read_request(reader)
            if WHOLE.encode() in request.lower():
                writer.write(SSE_HEAD + framed(self.before) + framed(b'data: {"n":2}\n\n') + b"0\r\n\r\n")
                await writer.drain()
                continue
            writer.write(SSE_HEAD + framed(self.before + b"data: "))
            sent = 0
            try:
                while sent < self.size:
                    writer.write(piece)
                    await writer.drain()
                    sent += PIECE
                writer.write(framed(b"\n\n") + b"0\r\n\r\n")  # its end, had anyone read so far
                await writer.drain()
            finally:
                self.sent.append(sent)


CONTENT_PATH = f"/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse&key={DEMO_KEY}"
STREAMS: dict[str, tuple[str, dict[str, str], dict[str, Any], Format]] = {
    "messages": (
        "/v1/messages",
        MESSAGE_HEADERS,
        {
            "model": "msgmodel-sonnet-4-5",
            "max_tokens": 50,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
        MESSAGES,
    ),
    "responses": ("/v1/responses", BEARER, {"model": "respmodel-4o", "input": "hi", "stream": True}, RESPONSES),
    "chat_completions": (
        "/v1/chat/completions",
        BEARER,
        {"model": "respmodel-4o", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        CHAT,
    ),
    "stream_generate_content": (CONTENT_PATH, {}, {"contents": [{"parts": [{"text": "hi"}]}]}, CONTENT),
    "image_generations": (
        "/v1/images/generations",
        BEARER,
        {"model": "imagegen-2", "prompt": "p", "stream": True, "partial_images": 1, "size": "1024x1024"},
        IMAGES,
    ),
}


def refusal(fmt: Format, limit_mb: str) -> bytes:
    return fmt.stream_error(
        502, f"upstream sent a stream event over the {limit_mb} MB limit", "upstream_event_too_large"
    )


def too_large_count(channel: str) -> float:
    return (
        REGISTRY.get_sample_value("modelgate_upstream_errors_total", {"channel": channel, "kind": "event_too_large"})
        or 0.0
    )


@pytest.mark.parametrize("route", list(STREAMS))
async def test_an_event_past_the_cap_ends_the_stream_with_the_format_s_error_and_closes_the_upstream(
    start_gateway, http, route
) -> None:
    path, headers, body, fmt = STREAMS[route]
    # an event just under the 64 KB cap passes whole, byte for byte; the endless one after it does not
    large = b"data: " + b"y" * (64 * 1024 - 8) + b"\n\n"
    async with EndlessEvent(before=BEFORE + large) as upstream:
        gateway = await start_gateway(f"""
            server: {{max_stream_event_mb: 0.0625}}
            channels: [{{name: endless, base_url: '{upstream.url}'}}]
            observability: {{logging: {{access_log: false}}}}
            """)
        counted = too_large_count("endless")
        async with http.post(gateway.url + path, json=body, headers=headers) as answer:
            assert answer.status == 200
            received = await asyncio.wait_for(answer.read(), 30)
        assert received == BEFORE + large + refusal(fmt, "0.0625")
        assert too_large_count("endless") == counted + 1
        # The upstream's connection was closed, not pooled: the next request opens another, and
        # the upstream could write only a few MB of its 400 before it was cut off.
        async with http.post(gateway.url + path, json=body, headers={**headers, WHOLE: "1"}) as answer:
            assert await answer.read() == BEFORE + large + b'data: {"n":2}\n\n'
        assert upstream.connections == 2
        assert len(upstream.sent) == 1 and upstream.sent[0] < 16 * MB


async def test_a_stream_cut_at_the_cap_is_recorded_and_charged_as_cut_by_the_upstream(
    ledger_db, redis_url, start_gateway, http, tmp_path
) -> None:
    # (the database outlives the gateway writing to it: fixtures end in the reverse order)
    from tests.test_metering_abuse import KEY, MSG, agreed, prompt_tokens

    body = {
        "model": "msgmodel-haiku-4-5",
        "max_tokens": 900,
        "stream": True,
        "messages": [{"role": "user", "content": "tell me"}],
    }
    delta = (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"a"}}\n\n'
    )
    async with EndlessEvent(before=delta * 3) as upstream:
        gateway = await start_gateway(
            textwrap.dedent(f"""
            server: {{max_stream_event_mb: 0.0625}}
            state: {{backend: redis, url: '{redis_url}'}}
            keys: [{{name: spender, key: {KEY}, budget: {{tokens_per_day: 100000}}}}]
            channels: [{{name: endless, base_url: '{upstream.url}'}}]
            observability: {{logging: {{access_log: false}}}}
            plugins:
              ledger: {{database_url: '{ledger_db}', flush_interval_s: 0.05, spool_dir: '{tmp_path / "spool"}'}}
            """)
        )
        async with http.post(
            gateway.url + "/v1/messages", data=jsonutil.dumps(body), headers={**MSG, "content-type": "application/json"}
        ) as answer:
            received = await asyncio.wait_for(answer.read(), 30)
        assert received.endswith(refusal(MESSAGES, "0.0625"))
    held, [row] = await agreed(redis_url, ledger_db, 1)
    assert (row["status"], row["cut_by"], row["estimated"]) == (200, "upstream", True)
    # what it had delivered and its prompt, as any stream cut short (docs/budgets.md)
    assert (row["input_tokens"], row["output_tokens"]) == (prompt_tokens(body), 3)
    assert held == row["input_tokens"] + row["output_tokens"]


# -- the acceptance: a 400 MB event, a worker of its own ------------------------------------------

HEALTHZ_BOUND_MS = 20.0
ABUSIVE_STREAMS = 20
PASSES = 3


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


async def abuse_while_sampling(http: aiohttp.ClientSession, url: str) -> list[float]:
    """ABUSIVE_STREAMS streams, each meeting a 400 MB event, one after another, while
    tests/latency_probe.py samples `/healthz`: the samples taken while a stream ran."""
    path, headers, body, fmt = STREAMS["messages"]
    probe = subprocess.Popen(
        [sys.executable, "-m", "tests.latency_probe", url, str(HEALTHZ_BOUND_MS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parent.parent,
    )
    try:
        assert probe.stdout is not None and probe.stdin is not None
        assert await asyncio.to_thread(probe.stdout.readline) == b"ready\n"
        windows = []
        for _ in range(ABUSIVE_STREAMS):
            started = time.monotonic()
            async with http.post(url + path, json=body, headers=headers) as answer:
                assert answer.status == 200
                received = await asyncio.wait_for(answer.read(), 60)
            windows.append((started, time.monotonic()))
            assert received == BEFORE + refusal(fmt, "8")  # the format's error event, and the stream's end
        probe.stdin.write(b"stop\n")
        probe.stdin.flush()
        out, _ = await asyncio.to_thread(probe.communicate, timeout=30)
    finally:
        if probe.poll() is None:
            probe.kill()
    samples = json.loads(out)
    return [best for at, best, _ in samples if any(start <= at <= end for start, end in windows)]


async def test_a_400_mb_event_with_no_blank_line_leaves_the_worker_s_memory_and_healthz_alone(spawn, http):
    """With the default cap (8 MB): the worker's peak RSS stays under its resting RSS plus the cap
    plus 50 MB, each client gets the format's error event, and `/healthz` on that worker, sampled
    from a process of its own all the while, answers within 20 ms.

    The machine's other work can delay any process for longer than that: each sample is retried
    (tests/latency_probe.py), and a whole pass of streams may be run again, up to PASSES in all;
    the bound holds in one of them or the test fails. A worker that blocks its loop (the parser
    this replaced held it 270-700 ms at a time) fails every pass."""
    path, headers, body, _ = STREAMS["messages"]
    async with EndlessEvent() as upstream:
        gateway = spawn(
            "gateway",
            config=f"""
            server: {{listen: "127.0.0.1:{{PORT}}"}}
            channels: [{{name: endless, base_url: '{upstream.url}'}}]
            """,
        )
        pid = gateway.proc.pid
        for _ in range(3):  # what a first request loads is in the worker before it is measured
            async with http.post(gateway.url + path, json=body, headers={**headers, WHOLE: "1"}) as answer:
                assert answer.status == 200 and (await answer.read()).endswith(b'data: {"n":2}\n\n')
        resting_kb = status_kb(pid, "VmRSS")
        passes: list[float] = []
        while len(passes) < PASSES:
            during = await abuse_while_sampling(http, gateway.url)
            peak_kb = status_kb(pid, "VmHWM")
            print(
                f"pass {len(passes) + 1}: RSS resting {resting_kb / 1024:.1f} MB, peak {peak_kb / 1024:.1f} MB; "
                f"upstream wrote at most {max(upstream.sent) / MB:.0f} MB of each 400 MB event; /healthz while "
                f"the streams ran: {len(during)} samples, the slowest {max(during, default=0):.2f} ms"
            )
            assert (peak_kb - resting_kb) * 1024 < 8 * MB + 50 * MB
            assert max(upstream.sent) < 8 * MB + 32 * MB  # cut off, not read: the rest sat in socket buffers
            assert len(during) >= ABUSIVE_STREAMS  # sampled while the streams ran, not only between them
            passes.append(max(during))
            if passes[-1] < HEALTHZ_BOUND_MS:
                break
    assert min(passes) < HEALTHZ_BOUND_MS, f"/healthz over {HEALTHZ_BOUND_MS} ms in every pass: {passes}"
