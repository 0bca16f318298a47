"""Simulated chat upstreams: the message format and content generation (the response format: simulator/responses.py)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.formats import CONTENT, MESSAGES
from proxy.wire import jsonutil
from simulator.core import Answer, Simulator, count_words, json_answer, sse, stream, words
from simulator.media import is_image_model, png_base64


def placeholder_args(schema: Any) -> dict[str, Any]:
    """Arguments that satisfy a tool's schema well enough to look like a real call."""
    if not isinstance(schema, dict):
        return {}
    props = schema.get("properties") or {}
    kinds = {"string": "simulated", "STRING": "simulated", "integer": 1, "INTEGER": 1, "number": 1.0,
             "NUMBER": 1.0, "boolean": True, "BOOLEAN": True}
    return {name: kinds.get((spec or {}).get("type"), "simulated")
            for name, spec in props.items() if name in (schema.get("required") or list(props))}


# --- message format ---------------------------------------------------------------------------

async def messages(sim: Simulator, request: web.Request) -> web.StreamResponse:
    body, knobs = await sim.receive(request, MESSAGES)
    if not isinstance(body, dict):
        raise Answer(MESSAGES.error_response(400, "body must be a JSON object"))
    model = body.get("model", "msgmodel-sonnet-4-5")
    input_tokens = count_words(body.get("messages")) + count_words(body.get("system"))
    text = " ".join(words(knobs.output_tokens))
    tool = _pending_tool(body.get("tools"), body.get("messages"))
    message_id = sim.new_id("msg")
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
    stop_reason = "end_turn"
    if tool is not None:
        blocks.append({"type": "tool_use", "id": sim.new_id("toolu"), "name": tool["name"],
                       "input": placeholder_args(tool.get("input_schema"))})
        stop_reason = "tool_use"
    usage = {"input_tokens": input_tokens, "output_tokens": knobs.output_tokens,
             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    said = {} if knobs.no_usage else {"usage": usage}
    if not body.get("stream"):
        sim.produce(input_tokens, knobs.output_tokens)
        if not knobs.no_usage:
            sim.report(input_tokens, knobs.output_tokens)
        return json_answer({"id": message_id, "type": "message", "role": "assistant", "model": model,
                            "content": blocks, "stop_reason": stop_reason, "stop_sequence": None, **said}, request)

    def events():  # noqa: ANN202
        sim.produce(input_tokens)
        opening = {} if knobs.no_usage else {"usage": {**usage, "output_tokens": 1}}
        yield sse("message_start", {"type": "message_start", "message": {
            "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, **opening}})
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                yield sse("content_block_start", {"type": "content_block_start", "index": index,
                                                  "content_block": {"type": "text", "text": ""}})
                for i, word in enumerate(words(knobs.output_tokens)):
                    sim.produce(output_tokens=1)
                    yield sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                      "delta": {"type": "text_delta", "text": word if i == 0 else " " + word}})
            else:
                yield sse("content_block_start", {"type": "content_block_start", "index": index, "content_block":
                                                  {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}})
                yield sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta":
                                                  {"type": "input_json_delta", "partial_json": jsonutil.dumps(block["input"]).decode()}})
            yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
        final = {"input_tokens": input_tokens, "output_tokens": knobs.output_tokens}
        closing = {} if knobs.no_usage else {"usage": final}
        if not knobs.no_usage:
            sim.report(input_tokens, knobs.output_tokens)
        yield sse("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": stop_reason, "stop_sequence": None, **closing}, **closing})
        yield sse("message_stop", {"type": "message_stop"})

    return await stream(sim, request, knobs, events())


def _pending_tool(tools: Any, history: Any) -> dict[str, Any] | None:
    """The tool to call: the first custom tool, unless the last turn already answered a call."""
    if not isinstance(tools, list) or not tools or not isinstance(tools[0], dict):
        return None
    last = history[-1] if isinstance(history, list) and history else None
    content = last.get("content") if isinstance(last, dict) else None
    if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
        return None
    return tools[0]


# --- content-generation format ----------------------------------------------------------------

async def generate_content(sim: Simulator, request: web.Request) -> web.StreamResponse:
    body, knobs = await sim.receive(request, CONTENT)
    model = request.match_info["model"]
    if not isinstance(body, dict):
        raise Answer(CONTENT.error_response(400, "Invalid JSON payload received."))
    prompt_tokens = count_words(body.get("contents")) + count_words(body.get("systemInstruction"))
    response_id = sim.new_id("sim")
    streaming = request.path.endswith(":streamGenerateContent")
    if is_image_model(model) and request.headers.get("x-sim-image-markdown") == "1":
        # some upstreams embed the image in the text as a Markdown data URL
        parts: list[dict[str, Any]] = [{"text": f"Here it is: ![image](data:image/png;base64,{png_base64(64, 64)}) done."}]
        return await _content_answer(sim, request, knobs, streaming, [parts], model, response_id, prompt_tokens,
                                     1290, "IMAGE")
    if is_image_model(model):
        parts = [{"text": "Here is the generated image."},
                 {"inlineData": {"mimeType": "image/png", "data": png_base64(256, 256)}}]
        return await _content_answer(sim, request, knobs, streaming, [parts], model, response_id, prompt_tokens,
                               1290, "IMAGE")
    call = _function_call(body.get("tools"), body.get("contents"))
    if call is not None:
        return await _content_answer(sim, request, knobs, streaming, [[{"functionCall": call}]], model, response_id,
                               prompt_tokens, 8, "TEXT")
    text = words(knobs.output_tokens)
    chunks = [[{"text": (" " if i else "") + w}] for i, w in enumerate(text)] if streaming else [[{"text": " ".join(text)}]]
    return await _content_answer(sim, request, knobs, streaming, chunks, model, response_id, prompt_tokens,
                           knobs.output_tokens, "TEXT")


async def _content_answer(sim: Simulator, request: web.Request, knobs: Any, streaming: bool, chunks: list[list[dict[str, Any]]],
                    model: str, response_id: str, prompt_tokens: int, output_tokens: int,
                    modality: str) -> web.StreamResponse:
    def chunk(index: int, parts: list[dict[str, Any]], final: bool = False) -> dict[str, Any]:
        last = final or index == len(chunks) - 1
        produced = output_tokens if last else min(output_tokens, index + 1)
        before = 0 if final or index == 0 else min(output_tokens, index)
        sim.produce(prompt_tokens if final or index == 0 else 0, produced - before)
        if last and not knobs.no_usage:
            sim.report(prompt_tokens, produced)
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if last:
            candidate["finishReason"] = "STOP"
        said = {} if knobs.no_usage else {"usageMetadata": {
            "promptTokenCount": prompt_tokens, "candidatesTokenCount": produced, "totalTokenCount": prompt_tokens + produced,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt_tokens}],
            "candidatesTokensDetails": [{"modality": modality, "tokenCount": produced}]}}
        return {"candidates": [candidate], **said, "modelVersion": model, "responseId": response_id}

    if not streaming:
        return json_answer(chunk(0, [p for parts in chunks for p in parts], final=True), request)
    if request.query.get("alt") != "sse":
        return json_answer([chunk(i, parts) for i, parts in enumerate(chunks)], request)
    # The real upstream frames these with CRLF; so does the simulator.
    events = (b"data: " + jsonutil.dumps(chunk(i, parts)) + b"\r\n\r\n" for i, parts in enumerate(chunks))
    return await stream(sim, request, knobs, events)


def _function_call(tools: Any, contents: Any) -> dict[str, Any] | None:
    if not isinstance(tools, list):
        return None
    if isinstance(contents, list) and contents and isinstance(contents[-1], dict):
        parts = contents[-1].get("parts") or []
        if any(isinstance(p, dict) and ("functionResponse" in p or "function_response" in p) for p in parts):
            return None
    for tool in tools:
        declarations = (tool or {}).get("functionDeclarations") or (tool or {}).get("function_declarations")
        if declarations:
            first = declarations[0]
            return {"name": first.get("name", "tool"), "args": placeholder_args(first.get("parameters"))}
    return None
