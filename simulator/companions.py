"""The simulator's answers to the calls SDKs make around the endpoints: token counts, and the
stored responses (retrieve, delete, input items, cancel)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.formats import CONTENT, MESSAGES, RESPONSES
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
    request_contents = body.get("generateContentRequest", {}).get("contents") if isinstance(
        body.get("generateContentRequest"), dict) else None
    return json_answer({"totalTokens": count_words(contents) + count_words(request_contents)}, request)


async def stored_response(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """GET, DELETE, `/input_items` and `/cancel` on a response this simulator made."""
    await sim.receive(request, RESPONSES)
    response_id = request.match_info["response_id"]
    stored = sim.responses.get(response_id)
    if stored is None:
        raise Answer(web.json_response({"error": {"message": f"Response with id '{response_id}' not found.",
                                                  "type": "invalid_request_error", "param": None,
                                                  "code": None}}, status=404))
    response: dict[str, Any] = stored["response"]
    if request.method == "DELETE":
        del sim.responses[response_id]
        return json_answer({"id": response_id, "object": "response", "deleted": True}, request)
    if request.path.endswith("/input_items"):
        items = stored["input"]
        return json_answer({"object": "list", "data": items, "has_more": False,
                            "first_id": items[0]["id"] if items else None,
                            "last_id": items[-1]["id"] if items else None}, request)
    if request.path.endswith("/cancel"):
        if not stored["background"]:
            raise Answer(web.json_response({"error": {"message": "Only responses created with background=true "
                                                      "can be cancelled.", "type": "invalid_request_error",
                                                      "param": None, "code": None}}, status=400))
        stored["response"] = response = {**response, "status": "cancelled", "output": [], "usage": None}
    return json_answer(response, request)
