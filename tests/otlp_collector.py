"""An OTLP/HTTP trace receiver for tests (`collector` fixture): it takes JSON and protobuf, as
collectors do, and keeps each export as OTLP/JSON (ids in hex), whichever encoding it came in."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass
class Collector:
    """An OTLP/HTTP receiver that answers with the statuses it is told to, then 200."""

    url: str = ""
    statuses: list[int] = field(default_factory=list)
    posts: list[tuple[dict[str, str], dict]] = field(default_factory=list)
    reply: bytes = b"{}"
    answering: asyncio.Event = field(default_factory=asyncio.Event)  # cleared: requests stall until set
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def spans(self) -> list[dict]:
        return [
            span
            for _, body in self.posts
            for resource in body["resourceSpans"]
            for scope in resource["scopeSpans"]
            for span in scope["spans"]
        ]

    def scoped(self) -> list[tuple[str, dict]]:
        """Each span with its instrumentation scope's name."""
        return [
            (scope["scope"].get("name", ""), span)
            for _, body in self.posts
            for resource in body["resourceSpans"]
            for scope in resource["scopeSpans"]
            for span in scope["spans"]
        ]


def as_json(raw: bytes, content_type: str) -> dict:
    """An export as OTLP/JSON: protobuf decoded and written as OTLP's JSON writes it (ids in hex)."""
    if content_type != "application/x-protobuf":
        return json.loads(raw)
    decoded = json_format.MessageToDict(ExportTraceServiceRequest.FromString(raw), use_integers_for_enums=True)
    _base64_ids_to_hex(decoded)
    return decoded


def _base64_ids_to_hex(node: object) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _base64_ids_to_hex(value)
    elif isinstance(node, list):
        for item in node:
            _base64_ids_to_hex(item)


def attributes(span: dict) -> dict:
    """A span's attributes as {key: value}, each value as OTLP/JSON typed it."""
    found = {}
    for pair in span.get("attributes", []):
        ((kind, value),) = pair["value"].items()
        found[pair["key"]] = int(value) if kind == "intValue" else value
    return found


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    found = Collector()
    found.answering.set()

    async def receive(request: web.Request) -> web.Response:
        raw = await request.read()  # aiohttp undoes a Content-Encoding: gzip
        await found.answering.wait()
        status = found.statuses.pop(0) if found.statuses else 200
        if status == 200:
            found.posts.append((dict(request.headers), as_json(raw, request.content_type)))
            found.arrived.set()
        return web.Response(
            status=status,
            body=found.reply if status == 200 else b"busy",
            content_type="application/json",
            headers={"Retry-After": "0"} if status == 503 else None,
        )

    app = web.Application()
    app.router.add_post("/v1/traces", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    found.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1/traces"  # type: ignore[union-attr]
    yield found
    found.answering.set()
    await runner.cleanup()
