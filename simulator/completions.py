"""The simulated chat-completions upstream: a `chat.completion` (JSON) or its chunks (streamed),
with tool calls by the turn logic every chat format shares (simulator/turns.py), `n` choices,
and usage in the body, or in a closing chunk only when the request asks
(`stream_options.include_usage`), as the real upstream does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiohttp import web

from proxy.core import jsonutil
from proxy.formats import CHAT
from simulator.core import Answer, Knobs, Simulator, count_words, json_answer, now, stream
from simulator.turns import Conversation, Offered, answer_pieces, arguments, next_call, result_text


async def completions(sim: Simulator, request: web.Request) -> web.StreamResponse:
    body, knobs = await sim.receive(request, CHAT)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise Answer(CHAT.error_response(400, "messages: required", "invalid_request_error", param="messages"))
    made = _make(sim, body, knobs)
    if not body.get("stream"):
        sim.produce(made["input_tokens"], made["output_tokens"])
        if not knobs.no_usage:
            sim.report(made["input_tokens"], made["output_tokens"])
        return json_answer(made["completion"], request)
    options = body.get("stream_options")
    asked = isinstance(options, dict) and options.get("include_usage") is True
    return await stream(sim, request, knobs, _chunks(sim, made, with_usage=asked and not knobs.no_usage))


def _make(sim: Simulator, body: dict[str, Any], knobs: Knobs) -> dict[str, Any]:
    conversation = _conversation(body)
    call = next_call(conversation)
    n = body.get("n") if isinstance(body.get("n"), int) and body["n"] > 0 else 1
    input_tokens = count_words(body.get("messages"))
    choices, pieces = [], []
    for index in range(n):
        if call is not None:
            calls = [
                {
                    "id": sim.new_id("call"),
                    "type": "function",
                    "function": {"name": call.name, "arguments": jsonutil.dumps(arguments(call)).decode()},
                }
            ]
            message = {"role": "assistant", "content": None, "tool_calls": calls, "refusal": None}
            pieces.append([])
            reason = "tool_calls"
        else:
            said = answer_pieces(conversation, knobs.output_tokens)
            pieces.append(said)
            message = {"role": "assistant", "content": "".join(said), "refusal": None}
            reason = "stop"
        choices.append({"index": index, "message": message, "logprobs": None, "finish_reason": reason})
    output_tokens = sum(max(1, len(p)) for p in pieces)
    usage = {
        "prompt_tokens": input_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }
    completion = {
        "id": sim.new_id("chatcmpl"),
        "object": "chat.completion",
        "created": now(),
        "model": body.get("model"),
        "choices": choices,
        "system_fingerprint": "fp_simulated",
    }
    if not knobs.no_usage:
        completion["usage"] = usage
    return {
        "completion": completion,
        "pieces": pieces,
        "usage": usage,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
    }


def _conversation(body: dict[str, Any]) -> Conversation:
    """The request as the turn logic reads it (simulator/turns.py)."""
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    functions = [t.get("function") for t in tools if isinstance(t, dict) and t.get("type") == "function"]
    conversation = Conversation(
        tools=[Offered(f["name"], f.get("parameters")) for f in functions if isinstance(f, dict) and "name" in f]
    )
    choice = body.get("tool_choice")
    if choice in ("auto", "none", "required"):
        conversation.choice = choice
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        conversation.named = choice["function"].get("name")
    messages = [m for m in body["messages"] if isinstance(m, dict)]
    for message in messages:
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                conversation.called.append(call["function"].get("name"))
    for message in reversed(messages):  # the tool results given since the user last spoke
        if message.get("role") == "tool":
            conversation.results.insert(0, result_text(message.get("content")))
        elif message.get("role") == "user":
            break
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = fmt.get("json_schema")
        conversation.schema = schema.get("schema") if isinstance(schema, dict) and schema.get("schema") else {}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        conversation.schema = True
    return conversation


def _chunks(sim: Simulator, made: dict[str, Any], with_usage: bool) -> Iterator[bytes]:
    completion = made["completion"]
    head = {k: completion[k] for k in ("id", "created", "model", "system_fingerprint")}

    def chunk(choices: list[dict[str, Any]], **more: Any) -> bytes:
        payload = {**head, "object": "chat.completion.chunk", "choices": choices, **more}
        return b"data: " + jsonutil.dumps(payload) + b"\n\n"

    sim.produce(made["input_tokens"])
    for choice, pieces in zip(completion["choices"], made["pieces"]):
        index, message = choice["index"], choice["message"]
        yield chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        if message.get("tool_calls"):
            sim.produce(output_tokens=1)
            for position, call in enumerate(message["tool_calls"]):
                arguments_text = call["function"]["arguments"]
                half = len(arguments_text) // 2  # arguments arrive in parts, as they do upstream
                opening = {**call, "index": position, "function": {"name": call["function"]["name"], "arguments": ""}}
                for delta in (
                    {"tool_calls": [opening]},
                    {"tool_calls": [{"index": position, "function": {"arguments": arguments_text[:half]}}]},
                    {"tool_calls": [{"index": position, "function": {"arguments": arguments_text[half:]}}]},
                ):
                    yield chunk([{"index": index, "delta": delta, "finish_reason": None}])
        for piece in pieces:
            sim.produce(output_tokens=1)
            yield chunk([{"index": index, "delta": {"content": piece}, "finish_reason": None}])
        yield chunk([{"index": index, "delta": {}, "finish_reason": choice["finish_reason"]}])
    if with_usage:
        sim.report(made["input_tokens"], made["output_tokens"])
        yield chunk([], usage=made["usage"])
    yield b"data: [DONE]\n\n"
