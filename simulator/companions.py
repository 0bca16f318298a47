"""The simulator's answers to the token counts SDKs ask for around the endpoints (the stored
responses: simulator/responses.py)."""

from __future__ import annotations

from aiohttp import web

from proxy.formats import CONTENT, MESSAGES
from simulator.core import Answer, Simulator, count_words, json_answer


async def count_tokens(sim: Simulator, request: web.Request) -> web.StreamResponse:
    body, _ = await sim.receive(request, MESSAGES)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise Answer(MESSAGES.error_response(400, "messages: Field required"))
    return json_answer({"input_tokens": count_words(body.get("messages")) + count_words(body.get("system"))}, request)


async def count_content_tokens(sim: Simulator, request: web.Request) -> web.StreamResponse:
    body, _ = await sim.receive(request, CONTENT)
    if not isinstance(body, dict):
        raise Answer(CONTENT.error_response(400, "Invalid JSON payload received."))
    contents = body.get("contents")
    request_contents = (
        body.get("generateContentRequest", {}).get("contents")
        if isinstance(body.get("generateContentRequest"), dict)
        else None
    )
    return json_answer({"totalTokens": count_words(contents) + count_words(request_contents)}, request)
