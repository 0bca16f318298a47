"""The response format, read and written for translation.

A translated response is stored nowhere: an upstream of another format keeps no response to
read back, follow (`previous_response_id`) or run in the background, so a request asking for
those is not translated, and the answer says `store: false`. Its tools are sent `strict: false`
(the format's default is strict, which other formats' schemas need not meet). Thinking reaches a
client of this format as a reasoning item's summary text; a reasoning item a client sends back
carries the upstream's own encrypted state, which no other upstream reads, and is left out.
"""

from __future__ import annotations

from typing import Any

from proxy.formats import RESPONSES
from proxy.formats.translation.codec import (
    Codec,
    Query,
    UnknownAnswer,
    data_url,
    effort_for,
    instructions,
    number,
    text,
    text_of,
    whole,
)
from proxy.formats.translation.ir import (
    EFFORT_BUDGET,
    REFUSAL,
    Ask,
    Part,
    Reply,
    Tool,
    Turn,
    Untranslatable,
)
from proxy.formats.translation.response_stream import (
    ResponseReader,
    ResponseWriter,
    counts_of,
    output_parts,
    response_id,
    response_object,
    stop_of,
)

_REFUSED = ("previous_response_id", "conversation", "prompt", "top_logprobs", "max_tool_calls")
_DROPPED = (
    "metadata",
    "include",
    "truncation",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "stream_options",
    "prompt_cache_retention",
)
_KNOWN = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "reasoning",
        "stream",
        "store",
        "user",
        "background",
        *_REFUSED,
        *_DROPPED,
    }
)


class ResponseCodec(Codec):
    format = RESPONSES
    reading = ResponseReader
    writing = ResponseWriter

    def read_ask(self, body: Any, path_model: str | None, streaming: bool, query: Query = ()) -> Ask:
        for name in _REFUSED:
            if body.get(name) is not None:
                raise Untranslatable(
                    name, "a response of the upstream's format is not stored, so this cannot be translated"
                )
        if body.get("background") is True:
            raise Untranslatable("background", "a background response cannot be translated")
        unknown = sorted(k for k in body if k not in _KNOWN)
        if unknown:
            raise Untranslatable(unknown[0], "not a field the gateway can carry to the upstream's format")
        ask = Ask(model=str(body.get("model")), turns=[], stream=body.get("stream") is True)
        ask.dropped = dict.fromkeys(name for name in _DROPPED if body.get(name) is not None)
        if body.get("store") is True:
            ask.dropped["store"] = None
        ask.max_output = whole(body.get("max_output_tokens"))
        ask.temperature, ask.top_p = number(body.get("temperature")), number(body.get("top_p"))
        ask.user = body.get("user") if isinstance(body.get("user"), str) else None
        reasoning = body.get("reasoning")
        if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
            ask.effort = reasoning["effort"]
            if ask.effort != "none":
                ask.thinking_budget = EFFORT_BUDGET.get(ask.effort, EFFORT_BUDGET["medium"])
        ask.parallel_tools = (
            body.get("parallel_tool_calls") if isinstance(body.get("parallel_tool_calls"), bool) else None
        )
        for i, tool in enumerate(body.get("tools") or []):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                raise Untranslatable(f"tools[{i}].type", "only function tools can be translated")
            strict = tool.get("strict") if isinstance(tool.get("strict"), bool) else None
            ask.tools.append(Tool(tool["name"], tool.get("description"), tool.get("parameters"), strict=strict))
        choice = body.get("tool_choice")
        if isinstance(choice, str):
            if choice not in ("auto", "none", "required"):
                raise Untranslatable("tool_choice", "only auto, none, required or one named function can be translated")
            ask.tool_choice = choice
        elif isinstance(choice, dict):
            if choice.get("type") != "function":
                raise Untranslatable("tool_choice", "only auto, none, required or one named function can be translated")
            ask.tool_choice, ask.tool_named = "named", choice.get("name")
        text = body.get("text")
        if isinstance(text, dict) and text.get("verbosity") is not None:
            ask.dropped["text.verbosity"] = None  # how long to answer: no other format says
        output = text.get("format") if isinstance(text, dict) else None
        if isinstance(output, dict):
            if output.get("type") == "json_schema":
                ask.json_schema = {k: output[k] for k in ("name", "schema", "strict", "description") if k in output}
            elif output.get("type") == "json_object":
                ask.json_object = True
            elif output.get("type") != "text":
                raise Untranslatable("text.format.type", f"{output.get('type')!r} cannot be translated")
        if isinstance(body.get("instructions"), str) and body["instructions"]:
            ask.system.append(Part("text", body["instructions"]))
        _read_input(body.get("input"), ask)
        return ask

    def write_ask(self, ask: Ask) -> dict[str, Any]:
        body: dict[str, Any] = {"model": ask.model, "input": _input(ask), "store": False}
        if ask.system:
            body["instructions"] = "\n\n".join(p.text for p in ask.system)
        for name, value in (
            ("max_output_tokens", ask.max_output),
            ("temperature", ask.temperature),
            ("top_p", ask.top_p),
            ("user", ask.user),
        ):
            if value is not None:
                body[name] = value
        for name, value in (("top_k", ask.top_k), ("seed", ask.seed), ("stop", ask.stop or None)):
            if value is not None:
                raise Untranslatable(name, "the upstream's format has no such field")
        if ask.tools:
            body["tools"] = [_tool(t) for t in ask.tools]
            if ask.tool_choice is not None:
                body["tool_choice"] = (
                    {"type": "function", "name": ask.tool_named} if ask.tool_choice == "named" else ask.tool_choice
                )
            if ask.parallel_tools is not None:
                body["parallel_tool_calls"] = ask.parallel_tools
        if ask.json_schema is not None:
            body["text"] = {
                "format": {
                    "type": "json_schema",
                    "name": ask.json_schema.get("name") or "answer",
                    "schema": ask.json_schema.get("schema") or {},
                    "strict": bool(ask.json_schema.get("strict")),
                }
            }
        elif ask.json_object:
            body["text"] = {"format": {"type": "json_object"}}
        effort = ask.effort or effort_for(ask.thinking_budget)
        if effort is not None:
            body["reasoning"] = {"effort": effort}
            if effort != "none":
                body["reasoning"]["summary"] = "auto"
        if (
            any(p.cache is not None for t in ask.turns for p in t.parts)
            or any(p.cache is not None for p in ask.system)
            or any(t.cache for t in ask.tools)
        ):
            ask.dropped["cache_control"] = None  # the format caches on its own, by prefix
        if ask.stream:
            body["stream"] = True
        return body

    def upstream_path(self, ask: Ask) -> tuple[str, tuple[tuple[str, str], ...]]:
        return "/v1/responses", ()

    def read_reply(self, body: Any) -> Reply:
        if not isinstance(body.get("output"), list):
            raise UnknownAnswer("no output")
        parts = output_parts(body["output"])
        return Reply(
            text(body.get("id")),
            text(body.get("model")),
            parts,
            stop_of(body, parts),
            counts=counts_of(body.get("usage")),
            created=whole(body.get("created_at")) or 0,
        )

    def write_reply(self, reply: Reply, ask: Ask) -> dict[str, Any]:
        ident = response_id(reply.id)
        return response_object(
            ident,
            reply.model or ask.model,
            reply.created,
            _output_items(reply.parts, reply.stop, ident),
            reply.stop,
            reply.counts,
            ask,
        )


def _tool(tool: Tool) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "name": tool.name}
    if tool.description is not None:
        out["description"] = tool.description
    out["parameters"] = tool.parameters or {"type": "object", "properties": {}}
    out["strict"] = bool(tool.strict)  # (the format's default is strict, which others' schemas need not meet)
    return out


def _read_input(value: Any, ask: Ask) -> None:
    if isinstance(value, str):
        ask.turns.append(Turn("user", [Part("text", value)]))
        return
    for i, item in enumerate(value or []):
        kind = item.get("type", "message")
        where = f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            parts = _content(item.get("content"), f"{where}.content", ask.dropped)
            if role in ("system", "developer"):
                instructions(parts, f"{where}.content")
                if ask.turns:  # the other formats hold their instructions first, apart from the turns
                    ask.dropped[f"{where} (its place: moved first)"] = None
                ask.system += parts
            else:
                _append(ask, "assistant" if role == "assistant" else "user", parts)
        elif kind == "function_call":
            _append(
                ask,
                "assistant",
                [
                    Part(
                        "tool_call",
                        call_id=item.get("call_id"),
                        name=item.get("name"),
                        arguments=item.get("arguments") or "",
                    )
                ],
            )
        elif kind == "function_call_output":
            output = item.get("output")
            content = (
                _content(output, f"{where}.output", ask.dropped)
                if isinstance(output, list)
                else [Part("text", text_of(output, f"{where}.output"))]
            )
            _append(ask, "user", [Part("tool_result", call_id=item.get("call_id"), content=content)])
        elif kind == "reasoning":
            if "thinking" not in ask.dropped:
                ask.dropped["thinking"] = None
        else:
            raise Untranslatable(f"{where}.type", f"{kind!r} items cannot be translated")


def _append(ask: Ask, role: str, parts: list[Part]) -> None:
    """Consecutive items of one side make one turn (a call's results, an answer and its calls)."""
    if ask.turns and ask.turns[-1].role == role:
        ask.turns[-1].parts += parts
    else:
        ask.turns.append(Turn(role, parts))


def _content(content: Any, where: str, dropped: dict[str, None]) -> list[Part]:
    if isinstance(content, str):
        return [Part("text", content)] if content else []
    parts = []
    for i, item in enumerate(content or []):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append(Part("text", item.get("text") or ""))
        elif kind == "refusal":
            parts.append(Part("text", item.get("refusal") or ""))
        elif kind == "input_image" and isinstance(item.get("image_url"), str):
            if item.get("detail") not in (None, "auto"):
                dropped[f"{where}[{i}].detail"] = None
            inline = data_url(item["image_url"])
            parts.append(
                Part("image", media_type=inline[0], data=inline[1]) if inline else Part("image", url=item["image_url"])
            )
        else:
            raise Untranslatable(f"{where}[{i}].type", f"{kind!r} parts cannot be translated")
    return parts


def _input(ask: Ask) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for turn in ask.turns:
        content: list[dict[str, Any]] = []
        for part in turn.parts:
            if part.kind == "text":
                content.append({"type": "output_text" if turn.role == "assistant" else "input_text", "text": part.text})
            elif part.kind == "image":
                content.append(
                    {"type": "input_image", "image_url": part.url or f"data:{part.media_type};base64,{part.data}"}
                )
            elif part.kind == "tool_call":
                items += _message(turn.role, content)
                content = []
                items.append(
                    {
                        "type": "function_call",
                        "call_id": part.call_id,
                        "name": part.name,
                        "arguments": part.arguments or "{}",
                    }
                )
            elif part.kind == "tool_result":
                if part.is_error and "is_error" not in ask.dropped:  # (an output says no more than its text)
                    ask.dropped["is_error"] = None
                items += _message(turn.role, content)
                content = []
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": part.call_id,
                        "output": "".join(p.text for p in part.content or [] if p.kind == "text"),
                    }
                )
                if any(p.kind != "text" for p in part.content or []):
                    raise Untranslatable(
                        "tool result", "only text tool results can be carried to the upstream's format"
                    )
            elif "thinking" not in ask.dropped:
                ask.dropped["thinking"] = None
        items += _message(turn.role, content)
    return items


def _message(role: str, content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "message", "role": role, "content": content}] if content else []


def _output_items(parts: list[Part], stop: str, response_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    texts = [p.text for p in parts if p.kind == "text"]
    thinking = "".join(p.text for p in parts if p.kind == "thinking")
    if thinking:
        items.append(
            {"type": "reasoning", "id": f"rs_{response_id}", "summary": [{"type": "summary_text", "text": thinking}]}
        )
    if texts:
        piece = (
            {"type": "refusal", "refusal": "".join(texts)}
            if stop == REFUSAL
            else {"type": "output_text", "text": "".join(texts), "annotations": [], "logprobs": []}
        )
        items.append(
            {
                "type": "message",
                "id": f"msg_{response_id}",
                "status": "completed",
                "role": "assistant",
                "content": [piece],
            }
        )
    for n, part in enumerate(p for p in parts if p.kind == "tool_call"):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{response_id}_{n}",
                "call_id": part.call_id,
                "name": part.name,
                "arguments": part.arguments or "{}",
                "status": "completed",
            }
        )
    return items
