"""A deliberately separate, minimal SSE reader for tests, so the gateway's parser is not checked against itself."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass
class ReadEvent:
    name: str | None
    json: Any
    at: float
    upstream_sent_when_read: int


def _parse(block: str) -> tuple[str | None, Any]:
    name, data = None, []
    for line in block.replace("\r\n", "\n").split("\n"):
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    text = "\n".join(data)
    # The chat-completions format ends its stream with `data: [DONE]`, the one event that is no JSON.
    return name, json.loads(text) if data and text != "[DONE]" else None


async def read_events(answer: aiohttp.ClientResponse, on_event: Callable[[], int]) -> tuple[bytes, list[ReadEvent]]:
    started = time.monotonic()
    raw = b""
    pending = ""
    events: list[ReadEvent] = []
    async for chunk in answer.content.iter_any():
        raw += chunk
        pending += chunk.decode()
        normalised = pending.replace("\r\n", "\n")
        *blocks, rest = normalised.split("\n\n")
        pending = rest
        for block in blocks:
            if not block.strip() or all(line.startswith(":") for line in block.split("\n") if line):
                continue
            name, data = _parse(block)
            events.append(ReadEvent(name, data, time.monotonic() - started, on_event()))
    return raw, events
