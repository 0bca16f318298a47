"""The chat-completions format, read and written for translation.

Thinking travels as `reasoning_content` (the field chat upstreams that think send, and the
clients of such upstreams read); a prompt-cache hint as `cache_control` on a content part (where
gateways and clients of the format put it). The format has no top_k and one answer per
choice: a request asking more than one choice (`n`) is not translated.
"""

from __future__ import annotations

import time
from typing import Any

from proxy.formats import CHAT
from proxy.formats.translation.chat_stream import FINISHES, STOPS, ChatReader, ChatWriter, counts_of, usage_of
from proxy.formats.translation.codec import (
    Codec,
    Query,
    UnknownAnswer,
    call_id,
    data_url,
    effort_for,
    number,
    strings,
    text,
    whole,
)
from proxy.formats.translation.ir import (
    EFFORT_BUDGET,
    END,
    REFUSAL,
    TOOL_USE,
    Ask,
    Part,
    Reply,
    Tool,
    Turn,
    Untranslatable,
)

# Fields that change what the answer is, which no other format can carry: refused when set to
# anything but their default; the last four whenever present (`web_search_options: {}` asks for
# the search with its defaults).
_REFUSED = frozenset({"logprobs", "top_logprobs", "logit_bias", "frequency_penalty", "presence_penalty"})
_PRESENT = frozenset({"audio", "prediction", "web_search_options", "functions"})
# Fields about the request's bookkeeping at the upstream, not its answer: left out, and named.
_DROPPED = (
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "verbosity",
    "prompt_cache_retention",
)
_KNOWN = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "seed",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "reasoning_effort",
        "stream",
        "stream_options",
        "n",
        "user",
        "modalities",
        *_REFUSED,
        *_PRESENT,
        *_DROPPED,
    }
)


_DROPPED_NAMES = frozenset(_DROPPED)
# The fields a request may name that ask nothing to refuse or leave out.
_USUAL = _KNOWN - _REFUSED - _PRESENT - _DROPPED_NAMES - {"n", "modalities"}


def _refuse_unusual(body: dict[str, Any]) -> None:
    """A request naming a field no other format can carry, unless set to what asks nothing."""
    for name in sorted(_REFUSED.intersection(body)):
        if body[name]:  # (false, 0, an empty list or object: the default, asking nothing)
            raise Untranslatable(name, "the upstream's format has no such field")
    for name in sorted(_PRESENT.intersection(body)):
        if body[name] is not None:
            raise Untranslatable(name, "the upstream's format has no such field")
    if (whole(body.get("n")) or 1) > 1:
        raise Untranslatable("n", "more than one choice cannot be asked of the upstream's format")
    if body.get("modalities") not in (None, ["text"]):
        raise Untranslatable("modalities", "only text answers can be translated")
    unknown = sorted(k for k in body if k not in _KNOWN)
    if unknown:
        raise Untranslatable(unknown[0], "not a field the gateway can carry to the upstream's format")


class ChatCodec(Codec):
    format = CHAT
    reading = ChatReader
    writing = ChatWriter

    # -- requests --

    def read_ask(self, body: Any, path_model: str | None, streaming: bool, query: Query = ()) -> Ask:
        if not _USUAL.issuperset(body):  # (most requests name none of the fields below: one test)
            _refuse_unusual(body)
        ask = Ask(model=str(body.get("model")), turns=[], stream=body.get("stream") is True)
        if not _DROPPED_NAMES.isdisjoint(body):
            ask.dropped = dict.fromkeys(name for name in _DROPPED if body.get(name) is not None)
        options = body.get("stream_options")
        ask.stream_usage = isinstance(options, dict) and options.get("include_usage") is True
        ask.max_output = whole(body.get("max_completion_tokens")) or whole(body.get("max_tokens"))
        ask.temperature, ask.top_p, ask.seed = (
            number(body.get("temperature")),
            number(body.get("top_p")),
            whole(body.get("seed")),
        )
        ask.stop = strings(body.get("stop"))
        ask.user = body.get("user") if isinstance(body.get("user"), str) else None
        ask.effort = body.get("reasoning_effort") if isinstance(body.get("reasoning_effort"), str) else None
        if ask.effort is not None and ask.effort != "none":
            ask.thinking_budget = EFFORT_BUDGET.get(ask.effort, EFFORT_BUDGET["medium"])
        ask.parallel_tools = (
            body.get("parallel_tool_calls") if isinstance(body.get("parallel_tool_calls"), bool) else None
        )
        for i, tool in enumerate(body.get("tools") or []):
            function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
            if not isinstance(function, dict):
                raise Untranslatable(f"tools[{i}]", "only function tools can be translated")
            ask.tools.append(
                Tool(
                    function["name"],
                    function.get("description"),
                    function.get("parameters"),
                    tool.get("cache_control"),
                    function.get("strict") if isinstance(function.get("strict"), bool) else None,
                )
            )
        _read_tool_choice(body.get("tool_choice"), ask)
        _read_response_format(body.get("response_format"), ask)
        _read_messages(body.get("messages") or [], ask)
        return ask

    def write_ask(self, ask: Ask) -> dict[str, Any]:
        body: dict[str, Any] = {"model": ask.model, "messages": _messages(ask)}
        if ask.max_output is not None:
            body["max_completion_tokens"] = ask.max_output
        for name, value in (
            ("temperature", ask.temperature),
            ("top_p", ask.top_p),
            ("seed", ask.seed),
            ("user", ask.user),
        ):
            if value is not None:
                body[name] = value
        if ask.top_k is not None:
            raise Untranslatable("top_k", "the upstream's format has no top_k")
        if ask.stop:
            body["stop"] = ask.stop
        if ask.tools:
            body["tools"] = [_tool(tool) for tool in ask.tools]
        if ask.tool_choice is not None:
            body["tool_choice"] = (
                {"type": "function", "function": {"name": ask.tool_named}}
                if ask.tool_choice == "named"
                else ask.tool_choice
            )
        if ask.parallel_tools is not None and ask.tools:
            body["parallel_tool_calls"] = ask.parallel_tools
        if ask.json_schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": ask.json_schema}
        elif ask.json_object:
            body["response_format"] = {"type": "json_object"}
        effort = ask.effort or effort_for(ask.thinking_budget)
        if effort is not None:
            body["reasoning_effort"] = effort
        if ask.stream:
            body["stream"] = True
            if ask.stream_usage:
                body["stream_options"] = {"include_usage": True}
        return body

    def upstream_path(self, ask: Ask) -> tuple[str, tuple[tuple[str, str], ...]]:
        return "/v1/chat/completions", ()

    # -- answers --

    def read_reply(self, body: Any) -> Reply:
        choices = body.get("choices") if isinstance(body, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise UnknownAnswer("no choices")
        choice = choices[0]
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        parts = []
        for field in ("reasoning_content", "reasoning"):
            if isinstance(message.get(field), str) and message[field]:
                parts.append(Part("thinking", message[field]))
                break
        if isinstance(message.get("content"), str) and message["content"]:
            parts.append(Part("text", message["content"]))
        if isinstance(message.get("refusal"), str) and message["refusal"]:
            parts.append(Part("text", message["refusal"]))
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                parts.append(
                    Part(
                        "tool_call",
                        call_id=call_id(call.get("id")),
                        name=text(function.get("name")),
                        arguments=function.get("arguments") or "",
                    )
                )
        stop = STOPS.get(choice.get("finish_reason"), END)
        if stop == END and any(p.kind == "tool_call" for p in parts):
            stop = TOOL_USE  # a forced function's answer says "stop" (as vLLM's named tool choice does)
        if message.get("refusal"):
            stop = REFUSAL
        return Reply(
            text(body.get("id")),
            text(body.get("model")),
            parts,
            stop,
            counts=counts_of(body.get("usage")),
            created=whole(body.get("created")) or 0,
        )

    def write_reply(self, reply: Reply, ask: Ask) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": None}
        texts = [p.text for p in reply.parts if p.kind == "text"]
        if texts:
            message["content"] = "".join(texts)
        thinking = [p.text for p in reply.parts if p.kind == "thinking" and p.text]
        if thinking:
            message["reasoning_content"] = "".join(thinking)
        calls = [p for p in reply.parts if p.kind == "tool_call"]
        if calls:
            message["tool_calls"] = [_call(p) for p in calls]
        if reply.stop == REFUSAL:
            message["refusal"], message["content"] = message["content"], None
        answer = {
            "id": reply.id,
            "object": "chat.completion",
            "created": reply.created or int(time.time()),
            "model": reply.model or ask.model,
            "choices": [{"index": 0, "message": message, "finish_reason": FINISHES[reply.stop], "logprobs": None}],
        }
        if reply.counts is not None:
            answer["usage"] = usage_of(reply.counts)
        return answer


def _read_tool_choice(choice: Any, ask: Ask) -> None:
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise Untranslatable("tool_choice", "only auto, none, required or one named function can be translated")
        ask.tool_choice = choice
    elif isinstance(choice, dict):
        function = choice.get("function")
        if choice.get("type") == "function" and isinstance(function, dict):
            ask.tool_choice, ask.tool_named = "named", function.get("name")
        else:
            raise Untranslatable("tool_choice", "only auto, none, required or one named function can be translated")


def _read_response_format(value: Any, ask: Ask) -> None:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_schema":
        schema = value.get("json_schema") or {}
        ask.json_schema = {k: schema[k] for k in ("name", "schema", "strict", "description") if k in schema}
    elif kind == "json_object":
        ask.json_object = True
    elif kind not in (None, "text"):
        raise Untranslatable("response_format.type", f"{kind!r} cannot be translated")


def _read_messages(messages: list[Any], ask: Ask) -> None:
    names: dict[str, str] = {}  # a tool call's id -> its tool, which a content upstream's results name
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        where = f"messages[{i}]"
        if message.get("name") is not None:  # who spoke, among several of one role: no other format says
            ask.dropped[f"{where}.name"] = None
        if role in ("system", "developer"):
            if ask.turns:  # the other formats hold their instructions first, apart from the turns
                ask.dropped[f"{where} (its place: moved first)"] = None
            ask.system += _parts(content, f"{where}.content", ask.dropped, user=False)
        elif role == "user":
            _append(ask, "user", _parts(content, f"{where}.content", ask.dropped, user=True))
        elif role == "assistant":
            parts = []
            for field in ("reasoning_content", "reasoning"):
                if isinstance(message.get(field), str) and message[field]:
                    parts.append(Part("thinking", message[field]))
                    break
            parts += _parts(content, f"{where}.content", ask.dropped, user=False)
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                names[call.get("id")] = function.get("name")
                parts.append(
                    Part(
                        "tool_call",
                        call_id=call.get("id"),
                        name=function.get("name"),
                        arguments=function.get("arguments") or "",
                    )
                )
            _append(ask, "assistant", parts)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            result = Part(
                "tool_result",
                call_id=call_id,
                name=names.get(call_id),
                content=_parts(content, f"{where}.content", ask.dropped, user=False),
            )
            _append(ask, "user", [result])
        else:
            raise Untranslatable(f"{where}.role", f"{role!r} messages cannot be translated")


def _append(ask: Ask, role: str, parts: list[Part]) -> None:
    """Tool results join the user turn they belong to: one turn answers every call of the last."""
    if ask.turns and ask.turns[-1].role == role and role == "user":
        ask.turns[-1].parts += parts
    else:
        ask.turns.append(Turn(role, parts))


def _parts(content: Any, where: str, dropped: dict[str, None], user: bool) -> list[Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [Part("text", content)] if content else []
    if not isinstance(content, list):
        raise Untranslatable(where, "must be text or a list of parts")
    parts = []
    for i, item in enumerate(content):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "text":
            parts.append(Part("text", item.get("text") or "", cache=item.get("cache_control")))
        elif kind == "refusal":
            parts.append(Part("text", item.get("refusal") or ""))
        elif kind == "image_url" and user:
            url = (item.get("image_url") or {}).get("url") or ""
            if (item.get("image_url") or {}).get("detail") not in (None, "auto"):
                dropped[f"{where}[{i}].image_url.detail"] = None
            inline = data_url(url)
            parts.append(Part("image", media_type=inline[0], data=inline[1]) if inline else Part("image", url=url))
        else:
            raise Untranslatable(f"{where}[{i}].type", f"{kind!r} parts cannot be translated")
    return parts


def _messages(ask: Ask) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if ask.system:
        out.append({"role": "system", "content": _content(ask.system, "system")})
    for turn in ask.turns:
        if turn.role == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": None}
            texts = [p for p in turn.parts if p.kind == "text"]
            if texts:
                message["content"] = _content(texts, "assistant")
            calls = [p for p in turn.parts if p.kind == "tool_call"]
            if calls:
                message["tool_calls"] = [_call(p) for p in calls]
            if any(p.kind == "thinking" for p in turn.parts) and "thinking" not in ask.dropped:
                ask.dropped["thinking"] = None
            out.append(message)
            continue
        rest = []
        for part in turn.parts:  # a tool's result is a message of its own, right after the calls
            if part.kind == "tool_result":
                if part.is_error and "is_error" not in ask.dropped:  # (a tool message says no more than its text)
                    ask.dropped["is_error"] = None
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": part.call_id,
                        "content": _content(part.content or [], "tool result"),
                    }
                )
            else:
                rest.append(part)
        if rest:
            out.append({"role": "user", "content": _content(rest, "user")})
    return out


def _content(parts: list[Part], where: str) -> str | list[dict[str, Any]]:
    if all(p.kind == "text" and p.cache is None for p in parts):
        return "".join(p.text for p in parts)
    out = []
    for part in parts:
        if part.kind == "text":
            item: dict[str, Any] = {"type": "text", "text": part.text}
            if part.cache is not None:
                item["cache_control"] = part.cache
            out.append(item)
        elif part.kind == "image" and where == "user":
            url = part.url or f"data:{part.media_type};base64,{part.data}"
            out.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise Untranslatable(where, f"{part.kind} cannot be carried in a chat-completions {where} message")
    return out


def _tool(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = tool.parameters if tool.parameters is not None else {"type": "object", "properties": {}}
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _call(part: Part) -> dict[str, Any]:
    return {
        "id": part.call_id,
        "type": "function",
        "function": {"name": part.name, "arguments": part.arguments or "{}"},
    }
