"""The simulated response-format upstream: answers (JSON or streamed), background responses that
run on after their answer, and the stored responses the SDK reads back (retrieve, a stream
resumed with `?stream=true&starting_after=N`, delete, input items, cancel)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from proxy.core import jsonutil
from proxy.formats import RESPONSES
from simulator.core import Answer, Knobs, Simulator, count_words, json_answer, now, sse, stream
from simulator.turns import Conversation, Offered, answer_pieces, arguments, next_call, result_text


async def responses(sim: Simulator, request: web.Request) -> web.StreamResponse:
    body, knobs = await sim.receive(request, RESPONSES)
    if not isinstance(body, dict):
        raise Answer(RESPONSES.error_response(400, "body must be a JSON object"))
    previous_id = body.get("previous_response_id")
    turn = 1
    if previous_id is not None:
        previous = sim.responses.get(previous_id)
        if previous is None:
            raise Answer(
                web.json_response(
                    {
                        "error": {
                            "message": f"Previous response with id '{previous_id}' not found.",
                            "type": "invalid_request_error",
                            "param": "previous_response_id",
                            "code": "previous_response_not_found",
                        }
                    },
                    status=400,
                )
            )
        turn = previous["turn"] + 1
    made = _make(sim, body, knobs, turn)
    background = body.get("background") is True
    if body.get("store", True) is not False:
        sim.remember(
            sim.responses,
            made["response"]["id"],
            {
                **made,
                "turn": turn,
                "input": input_items(sim, body.get("input")),
                "background": background,
                "done_at": time.monotonic() + (knobs.background_ms / 1000 if background else 0),
            },
        )
    if background:  # it runs to its end whoever waits for it: all of it is made
        sim.produce(made["input_tokens"], made["output_tokens"])
    if not body.get("stream"):
        if background:
            return json_answer({**made["response"], "status": "queued", "output": [], "usage": None}, request)
        sim.produce(made["input_tokens"], made["output_tokens"])
        if not knobs.no_usage:
            sim.report(made["input_tokens"], made["output_tokens"])
        return json_answer(made["response"], request)
    return await stream(sim, request, knobs, _events(sim, made, counted=background, no_usage=knobs.no_usage))


def _make(sim: Simulator, body: dict[str, Any], knobs: Knobs, turn: int) -> dict[str, Any]:
    """Everything a response is: its final object, and what its stream is made of."""
    input_tokens = count_words(body.get("input")) + count_words(body.get("instructions"))
    conversation = _conversation(sim, body)
    tool = next_call(conversation)
    pieces = answer_pieces(
        conversation, knobs.output_tokens, lead=[f"Turn {turn}:"] if conversation.schema is None else None
    )
    item_id = sim.new_id("msg")
    message = {
        "type": "message",
        "id": item_id,
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "".join(pieces), "annotations": []}],
    }
    output: list[dict[str, Any]] = [message]
    output_tokens = len(pieces)
    if tool is not None:
        output = [
            {
                "type": "function_call",
                "id": sim.new_id("fc"),
                "call_id": sim.new_id("call"),
                "name": tool.name,
                "status": "completed",
                "arguments": jsonutil.dumps(arguments(tool)).decode(),
            }
        ]
        output_tokens = knobs.output_tokens
    usage = (
        None
        if knobs.no_usage
        else {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        }
    )
    response_id = sim.new_id("resp")
    return {
        "response": _response_object(body, response_id, "completed", output, usage),
        "started": _response_object(body, response_id, "in_progress", [], None),
        "message": message,
        "pieces": pieces,
        "tool": tool is not None,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
    }


def _conversation(sim: Simulator, body: dict[str, Any]) -> Conversation:
    """The request as the turn logic reads it (simulator/turns.py)."""
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    conversation = Conversation(
        tools=[
            Offered(t["name"], t.get("parameters"))
            for t in tools
            if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str)
        ]
    )
    choice = body.get("tool_choice")
    if choice in ("auto", "none", "required"):
        conversation.choice = choice
    elif isinstance(choice, dict) and choice.get("type") == "function":
        conversation.named = choice.get("name")
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        conversation.choice = "required" if choice.get("mode") == "required" else "auto"
        allowed = choice.get("tools") if isinstance(choice.get("tools"), list) else []
        conversation.allowed = {t["name"] for t in allowed if isinstance(t, dict) and isinstance(t.get("name"), str)}
    items = body.get("input") if isinstance(body.get("input"), list) else []
    conversation.called = [i.get("name") for i in items if isinstance(i, dict) and i.get("type") == "function_call"]
    previous, hops = body.get("previous_response_id"), 0
    while (stored := sim.responses.get(previous)) is not None and hops < 100:  # type: ignore[arg-type]
        conversation.called += [o.get("name") for o in stored["response"]["output"] if o.get("type") == "function_call"]
        previous, hops = stored["response"].get("previous_response_id"), hops + 1
    for item in reversed(items):  # the tool results given since the user last spoke
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call_output":
            conversation.results.insert(0, result_text(item.get("output")))
        elif item.get("role") == "user":
            break
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        conversation.schema = fmt.get("schema") if isinstance(fmt.get("schema"), dict) else {}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        conversation.schema = True
    return conversation


def _events(
    sim: Simulator, made: dict[str, Any], counted: bool, no_usage: bool = False, after: int = -1
) -> Iterator[bytes]:
    """A response's stream, each event with its sequence number (those up to `after` left out, as
    a resumed stream leaves them); `counted`: what it makes is counted already (a background
    response's, when it started), else each delta is counted as it is made."""
    seq = iter(range(1_000_000))
    final, message = made["response"], made["message"]
    item_id, text = message["id"], message["content"][0]["text"]

    def event(kind: str, **fields: Any) -> bytes | None:
        number = next(seq)
        return sse(kind, {"type": kind, "sequence_number": number, **fields}) if number > after else None

    def made_all() -> Iterator[bytes | None]:
        if not counted:
            sim.produce(made["input_tokens"])
        yield event("response.created", response=made["started"])
        yield event("response.in_progress", response=made["started"])
        if made["tool"]:
            if not counted:
                sim.produce(output_tokens=made["output_tokens"])
            call = final["output"][0]
            yield event(
                "response.output_item.added", output_index=0, item={**call, "arguments": "", "status": "in_progress"}
            )
            yield event(
                "response.function_call_arguments.delta", item_id=call["id"], output_index=0, delta=call["arguments"]
            )
            yield event(
                "response.function_call_arguments.done",
                item_id=call["id"],
                output_index=0,
                name=call["name"],
                arguments=call["arguments"],
            )
            yield event("response.output_item.done", output_index=0, item=call)
        else:
            yield event(
                "response.output_item.added", output_index=0, item={**message, "status": "in_progress", "content": []}
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event("response.content_part.added", item_id=item_id, output_index=0, content_index=0, part=part)
            for piece in made["pieces"]:
                if not counted:
                    sim.produce(output_tokens=1)
                yield event("response.output_text.delta", item_id=item_id, output_index=0, content_index=0, delta=piece)
            yield event("response.output_text.done", item_id=item_id, output_index=0, content_index=0, text=text)
            yield event(
                "response.content_part.done",
                item_id=item_id,
                output_index=0,
                content_index=0,
                part={**part, "text": text},
            )
            yield event("response.output_item.done", output_index=0, item=message)
        if not no_usage and not counted:  # a live stream's closing counts (a stored one's were told before)
            sim.report(made["input_tokens"], made["output_tokens"])
        yield event("response.completed", response=final)

    return (raw for raw in made_all() if raw is not None)


def input_items(sim: Simulator, given: Any) -> list[dict[str, Any]]:
    """A request's input as the stored items `GET /v1/responses/{id}/input_items` lists."""
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": given}]}]
    items = [item for item in given if isinstance(item, dict)] if isinstance(given, list) else []
    return [
        {
            "id": item.get("id") or sim.new_id("msg"),
            "status": "completed",
            **({"type": "message"} if "role" in item else {}),
            **item,
        }
        for item in items
    ]


async def stored_response(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """GET (also as a stream resumed), DELETE, `/input_items` and `/cancel` on a response this
    simulator made. A background response reads as in progress until it has run its time."""
    knobs = (await sim.receive(request, RESPONSES))[1]
    response_id = request.match_info["response_id"]
    stored = sim.responses.get(response_id)
    if stored is None:
        raise Answer(
            web.json_response(
                {
                    "error": {
                        "message": f"Response with id '{response_id}' not found.",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                },
                status=404,
            )
        )
    response: dict[str, Any] = stored["response"]
    running = time.monotonic() < stored["done_at"] and response["status"] == "completed"
    if request.method == "DELETE":
        del sim.responses[response_id]
        return json_answer({"id": response_id, "object": "response", "deleted": True}, request)
    if request.path.endswith("/input_items"):
        items = stored["input"]
        return json_answer(
            {
                "object": "list",
                "data": items,
                "has_more": False,
                "first_id": items[0]["id"] if items else None,
                "last_id": items[-1]["id"] if items else None,
            },
            request,
        )
    if request.path.endswith("/cancel"):
        if not stored["background"]:
            raise Answer(
                web.json_response(
                    {
                        "error": {
                            "message": "Only responses created with background=true can be cancelled.",
                            "type": "invalid_request_error",
                            "param": None,
                            "code": None,
                        }
                    },
                    status=400,
                )
            )
        # A running one stops here, saying nothing of what it made so far; one that ran its time
        # keeps what it said.
        cancelled = {"status": "cancelled", "output": [], "usage": None} if running else {"status": "cancelled"}
        stored["response"] = response = {**response, **cancelled}
        return json_answer(response, request)
    if request.query.get("stream") == "true":  # resumed: its events once it has run its time
        if (wait := stored["done_at"] - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        after = request.query.get("starting_after", "")
        return await stream(
            sim,
            request,
            knobs,
            _events(
                sim,
                stored,
                counted=True,
                after=int(after) if after.isdigit() else -1,
                no_usage=response.get("usage") is None,
            ),
        )
    if running:
        return json_answer({**response, "status": "in_progress", "output": [], "usage": None}, request)
    return json_answer(response, request)


def _response_object(
    body: dict[str, Any], response_id: str, status: str, output: list[Any], usage: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": now(),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body.get("model"),
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation", "disabled"),
        "usage": usage,
        "user": body.get("user"),
        # the tier that served it, as an upstream says: the one asked for, `auto` served as `default`
        "service_tier": "default" if body.get("service_tier") in (None, "auto") else body.get("service_tier"),
        "metadata": body.get("metadata") or {},
    }
