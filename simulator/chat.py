"""Simulated chat upstreams: the message format and content generation (the response format: simulator/responses.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiohttp import web

from proxy.core import jsonutil
from proxy.formats import CONTENT, MESSAGES
from simulator.core import Answer, Simulator, count_words, json_answer, sse, stream
from simulator.media import is_image_model, png_base64
from simulator.schema_values import value_for
from simulator.turns import Conversation, Offered, answer_pieces, arguments, next_call, result_text

# --- message format ---------------------------------------------------------------------------


async def messages(sim: Simulator, request: web.Request) -> web.StreamResponse:
    body, knobs = await sim.receive(request, MESSAGES)
    if not isinstance(body, dict):
        raise Answer(MESSAGES.error_response(400, "body must be a JSON object"))
    model = body.get("model", "msgmodel-sonnet-4-5")
    input_tokens = count_words(body.get("messages")) + count_words(body.get("system"))
    conversation = _message_conversation(body)
    tool = next_call(conversation)
    # A tool call is the whole answer, with no words before it: an agent streaming the answer
    # (pydantic-ai's run_stream) takes the first text as the final output and ends its loop there.
    pieces = answer_pieces(conversation, knobs.output_tokens)
    message_id = sim.new_id("msg")
    blocks: list[dict[str, Any]] = [{"type": "text", "text": "".join(pieces)}]
    output_tokens = len(pieces)
    stop_reason = "end_turn"
    if tool is not None:
        blocks = [{"type": "tool_use", "id": sim.new_id("toolu"), "name": tool.name, "input": arguments(tool)}]
        output_tokens = knobs.output_tokens
        stop_reason = "tool_use"
    usage = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    said = {} if knobs.no_usage else {"usage": usage}
    if not body.get("stream"):
        sim.produce(input_tokens, output_tokens)
        if not knobs.no_usage:
            sim.report(input_tokens, output_tokens)
        return json_answer(
            {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": blocks,
                "stop_reason": stop_reason,
                "stop_sequence": None,
                **said,
            },
            request,
        )

    def events() -> Iterator[bytes]:
        sim.produce(input_tokens)
        opening = {} if knobs.no_usage else {"usage": {**usage, "output_tokens": 1}}
        yield sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    **opening,
                },
            },
        )
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                yield sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
                )
                for piece in pieces:
                    sim.produce(output_tokens=1)
                    yield sse(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}},
                    )
            else:
                sim.produce(output_tokens=output_tokens)
                yield sse(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}},
                    },
                )
                yield sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": jsonutil.dumps(block["input"]).decode()},
                    },
                )
            yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
        final = {"input_tokens": input_tokens, "output_tokens": output_tokens}
        closing = {} if knobs.no_usage else {"usage": final}
        if not knobs.no_usage:
            sim.report(input_tokens, output_tokens)
        yield sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None, **closing},
                **closing,
            },
        )
        yield sse("message_stop", {"type": "message_stop"})

    return await stream(sim, request, knobs, events())


def _message_conversation(body: dict[str, Any]) -> Conversation:
    """A message-format request as the turn logic reads it (simulator/turns.py)."""
    conversation = Conversation(
        tools=[
            Offered(t["name"], t.get("input_schema"))
            for t in _list(body.get("tools"))
            if isinstance(t, dict) and isinstance(t.get("name"), str)
        ]
    )
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "none"):
        conversation.choice = kind
    elif kind == "any":
        conversation.choice = "required"
    elif kind == "tool":
        conversation.named = choice.get("name")  # type: ignore[union-attr]
    history = _list(body.get("messages"))
    for message in history:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and message.get("role") == "assistant":
            conversation.called += [
                b.get("name") for b in content if isinstance(b, dict) and b.get("type") == "tool_use"
            ]
    last = history[-1] if history and isinstance(history[-1], dict) else {}
    if last.get("role") == "user" and isinstance(last.get("content"), list):
        conversation.results = [
            result_text(b.get("content"))
            for b in last["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
    for holder in (
        body.get("output_config"),
        body,
    ):  # structured outputs: `output_config.format`, or the beta's `output_format`
        fmt = holder.get("format" if holder is not body else "output_format") if isinstance(holder, dict) else None
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            conversation.schema = fmt.get("schema") if isinstance(fmt.get("schema"), dict) else {}
            break
    return conversation


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
        parts: list[dict[str, Any]] = [
            {"text": f"Here it is: ![image](data:image/png;base64,{png_base64(64, 64)}) done."}
        ]
        return await _content_answer(
            sim, request, knobs, streaming, [parts], model, response_id, prompt_tokens, 1290, "IMAGE"
        )
    if is_image_model(model):
        parts = [
            {"text": "Here is the generated image."},
            {"inlineData": {"mimeType": "image/png", "data": png_base64(256, 256)}},
        ]
        return await _content_answer(
            sim, request, knobs, streaming, [parts], model, response_id, prompt_tokens, 1290, "IMAGE"
        )
    conversation, enum_text = _content_conversation(body)
    tool = next_call(conversation)
    if tool is not None:
        call = {"name": tool.name, "args": arguments(tool)}
        return await _content_answer(
            sim, request, knobs, streaming, [[{"functionCall": call}]], model, response_id, prompt_tokens, 8, "TEXT"
        )
    pieces = answer_pieces(conversation, knobs.output_tokens)
    if enum_text:  # `text/x.enum`: one of the schema's values, bare
        pieces = [str(value_for(conversation.schema))]
    chunks = [[{"text": p}] for p in pieces] if streaming else [[{"text": "".join(pieces)}]]
    return await _content_answer(
        sim, request, knobs, streaming, chunks, model, response_id, prompt_tokens, len(pieces), "TEXT"
    )


async def _content_answer(
    sim: Simulator,
    request: web.Request,
    knobs: Any,
    streaming: bool,
    chunks: list[list[dict[str, Any]]],
    model: str,
    response_id: str,
    prompt_tokens: int,
    output_tokens: int,
    modality: str,
) -> web.StreamResponse:
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
        said = (
            {}
            if knobs.no_usage
            else {
                "usageMetadata": {
                    "promptTokenCount": prompt_tokens,
                    "candidatesTokenCount": produced,
                    "totalTokenCount": prompt_tokens + produced,
                    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt_tokens}],
                    "candidatesTokensDetails": [{"modality": modality, "tokenCount": produced}],
                }
            }
        )
        return {"candidates": [candidate], **said, "modelVersion": model, "responseId": response_id}

    if not streaming:
        return json_answer(chunk(0, [p for parts in chunks for p in parts], final=True), request)
    if request.query.get("alt") != "sse":
        return json_answer([chunk(i, parts) for i, parts in enumerate(chunks)], request)
    # The real upstream frames these with CRLF; so does the simulator.
    events = (b"data: " + jsonutil.dumps(chunk(i, parts)) + b"\r\n\r\n" for i, parts in enumerate(chunks))
    return await stream(sim, request, knobs, events)


def _content_conversation(body: dict[str, Any]) -> tuple[Conversation, bool]:
    """A content-generation request as the turn logic reads it (both spellings of every field),
    and whether the answer is to be a bare enum value (`text/x.enum`)."""

    def get(holder: Any, camel: str) -> Any:
        snake = "".join("_" + c.lower() if c.isupper() else c for c in camel)
        return holder.get(camel, holder.get(snake)) if isinstance(holder, dict) else None

    conversation = Conversation()
    for tool in _list(body.get("tools")):
        for declaration in _list(get(tool, "functionDeclarations")):
            if isinstance(declaration, dict) and isinstance(declaration.get("name"), str):
                schema = get(declaration, "parametersJsonSchema") or get(declaration, "parameters")
                conversation.tools.append(Offered(declaration["name"], schema))
    calling = get(get(body, "toolConfig"), "functionCallingConfig")
    mode = get(calling, "mode")
    # AUTO and VALIDATED (AUTO with the arguments checked) leave the choice to the model
    conversation.choice = {"ANY": "required", "NONE": "none"}.get(mode, "auto") if isinstance(mode, str) else "auto"
    allowed = get(calling, "allowedFunctionNames")
    if isinstance(allowed, list) and allowed:
        conversation.allowed = {name for name in allowed if isinstance(name, str)}
    contents = body.get("contents")
    contents = contents if isinstance(contents, list) else [contents]
    for content in contents:
        if isinstance(content, dict) and content.get("role") == "model":
            conversation.called += [
                get(get(p, "functionCall"), "name")
                for p in _list(content.get("parts"))
                if get(p, "functionCall") is not None
            ]
    last = contents[-1] if contents and isinstance(contents[-1], dict) else {}
    conversation.results = [
        result_text(get(get(p, "functionResponse"), "response"))
        for p in _list(last.get("parts"))
        if isinstance(get(p, "functionResponse"), dict)
    ]
    config = get(body, "generationConfig")
    schema = get(config, "responseJsonSchema") or get(config, "responseSchema")
    mime = get(config, "responseMimeType")
    if isinstance(schema, dict):
        conversation.schema = schema
    elif mime == "application/json":
        conversation.schema = True
    return conversation, mime == "text/x.enum" and isinstance(schema, dict)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
