"""The message format, read and written for translation.

Its usage counts the prompt's cache reads and writes beside `input_tokens`, not among them; the
translation's counts hold the whole prompt, so both directions add or take them away. It needs
`max_tokens` on every request: one that names none gets what the gateway reserves for such a
request (proxy/request/charges.py), so the limit the upstream keeps is the one paid for.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.formats import MESSAGES
from proxy.formats.translation.codec import (
    Codec,
    Query,
    UnknownAnswer,
    call_id,
    instructions,
    made_by,
    number,
    own_signature,
    sent_back,
    strings,
    text,
    text_of,
    to_client,
    whole,
)
from proxy.formats.translation.ir import (
    EFFORT_BUDGET,
    END,
    Ask,
    Counts,
    Part,
    Reply,
    Tool,
    Turn,
    Untranslatable,
    json_text,
    parsed_arguments,
)
from proxy.formats.translation.message_stream import REASONS, STOPS, MessageReader, MessageWriter, counts_of, usage_of

_DROPPED = ("service_tier", "inference_geo")
_KNOWN = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "metadata",
        "stream",
        "output_config",
        "output_format",
        *_DROPPED,
    }
)


class MessageCodec(Codec):
    format = MESSAGES
    reading = MessageReader
    writing = MessageWriter

    def read_ask(self, body: Any, path_model: str | None, streaming: bool, query: Query = ()) -> Ask:
        unknown = sorted(k for k in body if k not in _KNOWN)
        if unknown:
            raise Untranslatable(unknown[0], "not a field the gateway can carry to the upstream's format")
        ask = Ask(model=str(body.get("model")), turns=[], stream=body.get("stream") is True)
        ask.dropped = dict.fromkeys(name for name in _DROPPED if body.get(name) is not None)
        ask.max_output = whole(body.get("max_tokens"))
        ask.temperature, ask.top_p, ask.top_k = (
            number(body.get("temperature")),
            number(body.get("top_p")),
            whole(body.get("top_k")),
        )
        ask.stop = strings(body.get("stop_sequences"))
        metadata = body.get("metadata")
        if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
            ask.user = metadata["user_id"]
        thinking = body.get("thinking")
        if isinstance(thinking, dict):
            if thinking.get("type") == "enabled":
                ask.thinking_budget = whole(thinking.get("budget_tokens")) or EFFORT_BUDGET["medium"]
            elif thinking.get("type") == "disabled":
                ask.thinking_budget = 0
            elif thinking.get("type") == "adaptive":
                ask.effort = "medium"
            else:
                raise Untranslatable("thinking.type", f"{thinking.get('type')!r} cannot be translated")
        config = body.get("output_config")
        if isinstance(config, dict) and isinstance(config.get("effort"), str):
            ask.effort = config["effort"]
        output = (config.get("format") if isinstance(config, dict) else None) or body.get("output_format")
        if isinstance(output, dict):
            if output.get("type") != "json_schema":
                raise Untranslatable("output_config.format.type", f"{output.get('type')!r} cannot be translated")
            ask.json_schema = {"name": "answer", "schema": output.get("schema")}
        for i, tool in enumerate(body.get("tools") or []):
            if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
                raise Untranslatable(f"tools[{i}].type", "only tools the client runs itself can be translated")
            ask.tools.append(
                Tool(
                    tool["name"],
                    tool.get("description"),
                    tool.get("input_schema"),
                    tool.get("cache_control"),
                    tool.get("strict") if isinstance(tool.get("strict"), bool) else None,
                )
            )
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            kind = choice.get("type")
            if kind not in ("auto", "any", "none", "tool"):
                raise Untranslatable("tool_choice.type", f"{kind!r} cannot be translated")
            ask.tool_choice = {"auto": "auto", "any": "required", "none": "none", "tool": "named"}[kind]
            ask.tool_named = choice.get("name") if kind == "tool" else None
            if choice.get("disable_parallel_tool_use") is True:
                ask.parallel_tools = False
        ask.system = instructions(_blocks(body.get("system"), "system", "user"), "system")
        for i, message in enumerate(body.get("messages") or []):
            role = message.get("role")
            ask.turns.append(Turn(role, _blocks(message.get("content"), f"messages[{i}].content", role)))
        return ask

    def write_ask(self, ask: Ask) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": ask.model,
            "max_tokens": ask.max_output or ask.assumed_output,
            "messages": [],
        }
        if ask.system:
            body["system"] = [_block(p, ask) for p in ask.system]
        for turn in ask.turns:
            blocks = [b for b in (_block(p, ask) for p in turn.parts) if b is not None]
            if blocks:
                body["messages"].append({"role": turn.role, "content": blocks})
        for name, value in (("temperature", ask.temperature), ("top_p", ask.top_p), ("top_k", ask.top_k)):
            if value is not None:
                body[name] = value
        if ask.seed is not None:
            raise Untranslatable("seed", "the upstream's format has no seed")
        if ask.stop:
            body["stop_sequences"] = ask.stop
        if ask.user is not None:
            body["metadata"] = {"user_id": ask.user}
        if ask.tools:
            body["tools"] = [_tool(t) for t in ask.tools]
        if any(t.strict for t in ask.tools):
            ask.dropped["tools.strict"] = None  # (the format's strict tools are a beta of its own)
        choice = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}.get(
            ask.tool_choice or ""
        )
        if ask.tool_choice == "named":
            choice = {"type": "tool", "name": ask.tool_named}
        if ask.parallel_tools is False and ask.tools:
            choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
        if choice is not None and ask.tools:
            body["tool_choice"] = choice
        budget = ask.thinking_budget
        if budget is None and ask.effort not in (None, "none"):
            budget = EFFORT_BUDGET.get(ask.effort or "", EFFORT_BUDGET["medium"])
        if budget:
            _think(body, budget, ask)
        if ask.json_schema is not None:
            body["output_config"] = {"format": {"type": "json_schema", "schema": ask.json_schema.get("schema")}}
        elif ask.json_object:
            raise Untranslatable("response_format", "the upstream's format has no JSON mode without a schema")
        if ask.stream:
            body["stream"] = True
        return body

    def upstream_path(self, ask: Ask) -> tuple[str, tuple[tuple[str, str], ...]]:
        return "/v1/messages", ()

    def read_reply(self, body: Any) -> Reply:
        if not isinstance(body.get("content"), list):
            raise UnknownAnswer("no content")
        parts = [_part(b) for b in body["content"] if isinstance(b, dict)]
        return Reply(
            text(body.get("id")),
            text(body.get("model")),
            [p for p in parts if p is not None],
            STOPS.get(body.get("stop_reason"), END),
            body.get("stop_sequence") if isinstance(body.get("stop_sequence"), str) else None,
            counts_of(body.get("usage")),
        )

    def write_reply(self, reply: Reply, ask: Ask) -> dict[str, Any]:
        return {
            "id": reply.id,
            "type": "message",
            "role": "assistant",
            "model": reply.model or ask.model,
            "content": [_answer_block(p) for p in reply.parts],
            "stop_reason": REASONS[reply.stop],
            "stop_sequence": reply.stop_sequence,
            "usage": usage_of(reply.counts or Counts(0, 0)),
        }


_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_-]")


def _safe_id(call_id: str | None) -> str:
    """A tool call's id as the format takes one (letters, digits, `_` and `-`): another format's
    (`functions.get:0`) made so the same way in a call and in its result."""
    return _UNSAFE_ID.sub("_", call_id or "") or "call"


def _think(body: dict[str, Any], budget: int, ask: Ask) -> None:
    """Thinking, where the format lets it be: its budget is part of `max_tokens` and at least
    1024; a forced tool call and a changed temperature or top_k are refused beside it (and top_p
    below 0.95), so those are left out for it, or, for a forced call the answer needs, it is."""
    budget = max(1024, min(budget, body["max_tokens"] - 1))
    if budget >= body["max_tokens"] or ask.tool_choice in ("required", "named"):
        ask.dropped["thinking"] = None
        return
    body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    for name in ("temperature", "top_k", "top_p"):
        value = body.get(name)
        if value is None or name == "temperature" and value == 1 or name == "top_p" and value >= 0.95:
            continue
        del body[name]
        ask.dropped[name] = None


def _blocks(content: Any, where: str, role: str) -> list[Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [Part("text", content)] if content else []
    parts = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        cache = block.get("cache_control") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(Part("text", block.get("text") or "", cache=cache))
        elif kind == "image":
            source = block.get("source") or {}
            if source.get("type") == "base64":
                parts.append(Part("image", media_type=source.get("media_type"), data=source.get("data"), cache=cache))
            elif source.get("type") == "url":
                parts.append(Part("image", url=source.get("url"), cache=cache))
            else:
                raise Untranslatable(f"{where}[{i}].source.type", "only base64 and url images can be translated")
        elif kind == "tool_use":
            parts.append(
                Part(
                    "tool_call",
                    call_id=block.get("id"),
                    name=block.get("name"),
                    arguments=json_text(block.get("input")),
                )
            )
        elif kind == "tool_result":
            inner = block.get("content")
            results = _blocks(inner, f"{where}[{i}].content", "user") if isinstance(inner, list) else None
            if results is None:
                results = [Part("text", text_of(inner, f"{where}[{i}].content"))] if inner else []
            parts.append(
                Part(
                    "tool_result",
                    call_id=block.get("tool_use_id"),
                    content=results,
                    is_error=block.get("is_error") is True,
                    cache=cache,
                )
            )
        elif kind == "thinking":
            signature = sent_back("messages", block.get("signature"))
            parts.append(Part("thinking", block.get("thinking") or "", signature=signature))
        elif kind == "redacted_thinking":
            parts.append(Part("thinking", data=block.get("data")))
        else:
            raise Untranslatable(f"{where}[{i}].type", f"{kind!r} blocks cannot be translated")
    return parts


def _block(part: Part, ask: Ask) -> dict[str, Any] | None:
    block: dict[str, Any]
    if part.kind == "text":
        if not part.text:
            return None  # the format refuses an empty text block
        block = {"type": "text", "text": part.text}
    elif part.kind == "image":
        source = (
            {"type": "url", "url": part.url}
            if part.url
            else {"type": "base64", "media_type": part.media_type, "data": part.data}
        )
        block = {"type": "image", "source": source}
    elif part.kind == "tool_call":
        block = {
            "type": "tool_use",
            "id": _safe_id(part.call_id),
            "name": part.name,
            "input": parsed_arguments(part.arguments),
        }
    elif part.kind == "tool_result":
        inner = [b for b in (_block(p, ask) for p in part.content or []) if b is not None]
        block = {"type": "tool_result", "tool_use_id": _safe_id(part.call_id), "content": inner}
        if part.is_error:
            block["is_error"] = True
    elif part.kind == "thinking" and own_signature("messages", part.signature):
        block = {"type": "thinking", "thinking": part.text, "signature": own_signature("messages", part.signature)}
    elif part.kind == "thinking" and part.data:
        block = {"type": "redacted_thinking", "data": part.data}
    else:  # thinking this upstream did not sign: it would refuse it
        if "thinking" not in ask.dropped:
            ask.dropped["thinking"] = None
        return None
    if part.cache is not None:
        block["cache_control"] = part.cache
    return block


def _tool(tool: Tool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tool.name, "input_schema": tool.parameters or {"type": "object", "properties": {}}}
    if tool.description is not None:
        out["description"] = tool.description
    if tool.cache is not None:
        out["cache_control"] = tool.cache
    return out


def _part(block: dict[str, Any]) -> Part | None:
    kind = block.get("type")
    if kind == "text":
        return Part("text", block.get("text") or "")
    if kind == "thinking":
        return Part("thinking", block.get("thinking") or "", signature=made_by("messages", block.get("signature")))
    if kind == "redacted_thinking":
        return Part("thinking", data=block.get("data"))
    if kind == "tool_use":
        return Part(
            "tool_call",
            call_id=call_id(block.get("id")),
            name=text(block.get("name")),
            arguments=json_text(block.get("input")),
        )
    return None


def _answer_block(part: Part) -> dict[str, Any]:
    if part.kind == "thinking":
        if part.data and not part.text:
            return {"type": "redacted_thinking", "data": part.data}
        return {"type": "thinking", "thinking": part.text, "signature": to_client(part.signature) or ""}
    if part.kind == "tool_call":
        return {"type": "tool_use", "id": part.call_id, "name": part.name, "input": parsed_arguments(part.arguments)}
    return {"type": "text", "text": part.text}
