"""Simulated images upstream: real PNG bytes, as Base64, native URLs, or streamed partial images."""

from __future__ import annotations

import base64
import functools
import re
import struct
import zlib
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from proxy.formats import IMAGES
from simulator.core import Answer, Simulator, json_answer, now, sse, stream

_SIZE = re.compile(r"^(\d{2,5})x(\d{2,5})$")


def is_image_model(model: str) -> bool:
    return "image" in model or model.startswith("picmodel-")


@functools.lru_cache(maxsize=16)
def png(width: int, height: int, rgb: tuple[int, int, int] = (64, 128, 192)) -> bytes:
    """A solid-colour RGB PNG, valid to any decoder."""
    row = b"\x00" + bytes(rgb) * width
    raw = zlib.compress(row * height, 6)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


@functools.lru_cache(maxsize=16)
def png_base64(width: int, height: int) -> str:
    return base64.b64encode(png(width, height)).decode()


def _dimensions(size: Any) -> tuple[int, int]:
    match = _SIZE.match(size) if isinstance(size, str) else None
    if not match:
        return 1024, 1024
    return min(int(match[1]), 4096), min(int(match[2]), 4096)


async def images(sim: Simulator, request: web.Request) -> web.StreamResponse:
    body, knobs = await sim.receive(request, IMAGES)
    if not isinstance(body, dict):
        raise Answer(IMAGES.error_response(400, "body must be a JSON object or a form"))
    editing = request.path.endswith("/edits")
    width, height = _dimensions(body.get("size"))
    count = int(body.get("n") or 1)
    output_format = body.get("output_format") or "png"
    meta = {
        "background": "opaque",
        "output_format": output_format,
        "quality": body.get("quality") or "medium",
        "size": f"{width}x{height}",
    }
    usage = {
        "total_tokens": 50 + 1056 * count,
        "input_tokens": 50,
        "output_tokens": 1056 * count,
        "input_tokens_details": {"text_tokens": 50, "image_tokens": 0},
    }
    streaming = body.get("stream") in (True, "true")
    if not streaming:
        if body.get("response_format") == "url":
            data = [{"url": _store(sim, request, width, height)} for _ in range(count)]
        else:
            data = [{"b64_json": png_base64(width, height)} for _ in range(count)]
        sim.produce(usage["input_tokens"], usage["output_tokens"], images=count)
        if knobs.no_usage:
            return json_answer({"created": now(), "data": data, **meta}, request)
        sim.report(usage["input_tokens"], usage["output_tokens"])
        return json_answer({"created": now(), "data": data, **meta, "usage": usage}, request)
    kind = "image_edit" if editing else "image_generation"
    partials = int(body.get("partial_images") or 0)

    def events() -> Iterator[bytes]:
        for index in range(partials):
            yield sse(
                f"{kind}.partial_image",
                {
                    "type": f"{kind}.partial_image",
                    "partial_image_index": index,
                    "b64_json": png_base64(64, 64),
                    "created_at": now(),
                    **meta,
                },
            )
        sim.produce(usage["input_tokens"], usage["output_tokens"], images=1)
        said = {} if knobs.no_usage else {"usage": usage}
        if not knobs.no_usage:
            sim.report(usage["input_tokens"], usage["output_tokens"])
        yield sse(
            f"{kind}.completed",
            {"type": f"{kind}.completed", "b64_json": png_base64(width, height), "created_at": now(), **meta, **said},
        )

    return await stream(sim, request, knobs, events())


def _store(sim: Simulator, request: web.Request, width: int, height: int) -> str:
    file_id = sim.new_id("img")
    sim.remember(sim.files, file_id, png(width, height))
    return f"{request.scheme}://{request.host}/_sim/files/{file_id}.png"


async def file(sim: Simulator, request: web.Request) -> web.Response:
    data = sim.files.get(request.match_info["file_id"])
    if data is None:
        raise web.HTTPNotFound()
    return web.Response(body=data, content_type="image/png")
