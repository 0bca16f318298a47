"""The content-generation format, read and written for translation.

Its fields come by their JSON (camelCase) or proto (snake_case) names; both are read. Its tool
calls may carry no id, and its results name the tool, not the call: a call without one gets an
id from its place in the conversation, and a result the id of the call it answers (the oldest
unanswered call of that tool), so the ids a client of another format sees stay the same from
turn to turn. Its stream is asked for as SSE (`alt=sse`).
"""

from __future__ import annotations

from collections import deque
from typing import Any
from urllib.parse import quote

from proxy.formats import CONTENT
from proxy.formats.translation.codec import (
    Codec,
    Query,
    UnknownAnswer,
    instructions,
    number,
    own_signature,
    sent_back,
    strings,
    to_client,
    whole,
)
from proxy.formats.translation.content_stream import (
    REASONS,
    ContentReader,
    ContentWriter,
    answer_parts,
    blocked,
    counts_of,
    get,
    stop_of,
    usage_of,
)
from proxy.formats.translation.ir import (
    EFFORT_BUDGET,
    FILTERED,
    Ask,
    Part,
    Reply,
    Tool,
    Turn,
    Untranslatable,
    json_text,
    parsed_arguments,
)

_DROPPED = ("safetySettings", "labels")
_KNOWN = frozenset({"contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "model", *_DROPPED})
# What the format's upstream takes, by its own documentation, for a call carried over from
# another model: the signature it would otherwise require of a call in the current turn.
UNSIGNED = "skip_thought_signature_validator"
# Fields an SDK sends with values that ask nothing (pydantic-ai sends responseModalities: TEXT).
_DEFAULTS = {
    "responseModalities": lambda value: isinstance(value, list) and [str(v).upper() for v in value] == ["TEXT"],
    "responseLogprobs": lambda value: value is False,
    "presencePenalty": lambda value: value in (0, 0.0),
    "frequencyPenalty": lambda value: value in (0, 0.0),
    "audioTimestamp": lambda value: value is False,
}
_CONFIG_DROPPED = frozenset({"mediaResolution"})  # how closely images are read: no other format says
_CONFIG = frozenset(
    {
        "maxOutputTokens",
        "temperature",
        "topP",
        "topK",
        "stopSequences",
        "seed",
        "candidateCount",
        "responseMimeType",
        "responseSchema",
        "responseJsonSchema",
        "thinkingConfig",
    }
)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


_MODES = {"AUTO": "auto", "NONE": "none", "ANY": "required", "VALIDATED": "auto", "MODE_UNSPECIFIED": "auto"}
_TYPES = {
    "STRING": "string",
    "NUMBER": "number",
    "INTEGER": "integer",
    "BOOLEAN": "boolean",
    "ARRAY": "array",
    "OBJECT": "object",
    "NULL": "null",
}
_SUBSCHEMAS = frozenset({"items", "anyOf", "oneOf", "allOf", "not", "additionalProperties"})


def json_schema(schema: Any) -> Any:
    """A schema in the format's own dialect (`responseSchema`, a declaration's `parameters`: an
    OpenAPI subset with `type: OBJECT`, `nullable` and `propertyOrdering`) as the JSON Schema the
    other formats take; its keywords by either spelling, its property names as they are."""
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        name = _camel(key)
        if name in ("propertyOrdering", "nullable"):
            continue
        if name == "type" and isinstance(value, str):
            out["type"] = _TYPES.get(value.upper(), value.lower())
        elif name == "properties" and isinstance(value, dict):
            out["properties"] = {prop: json_schema(sub) for prop, sub in value.items()}
        elif name in _SUBSCHEMAS:
            out[name] = json_schema(value)
        else:
            out[name] = value
    if get(schema, "nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


class ContentCodec(Codec):
    format = CONTENT
    reading = ContentReader
    writing = ContentWriter

    def read_ask(self, body: Any, path_model: str | None, streaming: bool, query: Query = ()) -> Ask:
        if streaming and ("alt", "sse") not in query:
            # Without it the format streams a JSON array, which no other format's stream becomes
            raise Untranslatable("alt", "a stream of this model is served as server-sent events only: ask ?alt=sse")
        unknown = sorted(k for k in body if _camel(k) not in _KNOWN)
        if unknown:
            raise Untranslatable(unknown[0], "not a field the gateway can carry to the upstream's format")
        ask = Ask(model=path_model or str(body.get("model")), turns=[], stream=streaming)
        ask.dropped = dict.fromkeys(name for name in _DROPPED if get(body, name) is not None)
        config = get(body, "generationConfig") or {}
        for name in sorted(config):
            field = _camel(name)
            if field in _CONFIG:
                continue
            if field in _DEFAULTS and _DEFAULTS[field](config[name]):
                continue  # what an SDK sends every time, asking nothing another format lacks
            if field in _CONFIG_DROPPED:
                ask.dropped[f"generationConfig.{field}"] = None
                continue
            raise Untranslatable(f"generationConfig.{field}", "cannot be translated to the upstream's format")
        if (whole(get(config, "candidateCount")) or 1) > 1:
            raise Untranslatable("generationConfig.candidateCount", "more than one candidate cannot be translated")
        ask.max_output = whole(get(config, "maxOutputTokens"))
        ask.temperature, ask.top_p = number(get(config, "temperature")), number(get(config, "topP"))
        ask.top_k, ask.seed = whole(get(config, "topK")), whole(get(config, "seed"))
        ask.stop = strings(get(config, "stopSequences"))
        schema = get(config, "responseJsonSchema") or json_schema(get(config, "responseSchema"))
        if isinstance(schema, dict):  # (strict only where a client asks it: a format that is strict
            ask.json_schema = {"name": "answer", "schema": schema}  # refuses schemas this one takes)
        elif get(config, "responseMimeType") == "application/json":
            ask.json_object = True
        thinking = get(config, "thinkingConfig")
        if isinstance(thinking, dict):
            budget = whole(get(thinking, "thinkingBudget"))
            level = get(thinking, "thinkingLevel")
            ask.thinking_budget = budget if budget is not None and budget >= 0 else None
            if budget == -1:  # the model decides how much to think: the others' middle level
                ask.effort = "medium"
            if isinstance(level, str):
                ask.effort = level.lower()
                ask.thinking_budget = ask.thinking_budget or EFFORT_BUDGET.get(ask.effort)
        for i, tool in enumerate(body.get("tools") or []):
            declarations = get(tool, "functionDeclarations")
            if not isinstance(declarations, list) or len(tool) != 1:
                raise Untranslatable(f"tools[{i}]", "only function declarations can be translated")
            for declaration in declarations:
                schema = get(declaration, "parametersJsonSchema") or json_schema(get(declaration, "parameters"))
                ask.tools.append(Tool(declaration.get("name"), declaration.get("description"), schema))
        calling = get(get(body, "toolConfig"), "functionCallingConfig")
        if isinstance(calling, dict):
            mode = str(calling.get("mode", "AUTO")).upper()
            if mode not in _MODES:
                raise Untranslatable("toolConfig.functionCallingConfig.mode", f"{mode!r} cannot be translated")
            ask.tool_choice = _MODES[mode]
            allowed = get(calling, "allowedFunctionNames")
            if isinstance(allowed, list) and allowed:
                if mode == "ANY" and len(allowed) == 1:  # the others' one named tool
                    ask.tool_choice, ask.tool_named = "named", allowed[0]
                else:  # the others name one tool at most: the rest are not offered
                    offered = set(allowed)
                    ask.tools = [tool for tool in ask.tools if tool.name in offered]
        system = get(body, "systemInstruction")
        if system is not None:
            parts = system.get("parts") if isinstance(system, dict) else system
            ask.system = instructions(_parts(parts, "systemInstruction", _Calls()), "systemInstruction")
        pending = _Calls()
        for i, content in enumerate(body.get("contents") or []):
            role = "assistant" if content.get("role") == "model" else "user"
            parts = _parts(content.get("parts"), f"contents[{i}].parts", pending, turn=i)
            ask.turns.append(Turn(role, parts))
        return ask

    def write_ask(self, ask: Ask) -> dict[str, Any]:
        names = {p.call_id: p.name for t in ask.turns for p in t.parts if p.kind == "tool_call"}
        body: dict[str, Any] = {"contents": []}
        for turn in ask.turns:
            parts = [p for p in (_write_part(part, names, ask) for part in turn.parts) if p is not None]
            if parts:
                body["contents"].append({"role": "model" if turn.role == "assistant" else "user", "parts": parts})
        if ask.system:
            body["systemInstruction"] = {"parts": [{"text": p.text} for p in ask.system]}
        config: dict[str, Any] = {}
        for name, value in (
            ("maxOutputTokens", ask.max_output),
            ("temperature", ask.temperature),
            ("topP", ask.top_p),
            ("topK", ask.top_k),
            ("seed", ask.seed),
        ):
            if value is not None:
                config[name] = value
        if ask.stop:
            config["stopSequences"] = ask.stop
        if ask.json_schema is not None:
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = ask.json_schema.get("schema") or {"type": "object"}
        elif ask.json_object:
            config["responseMimeType"] = "application/json"
        budget = ask.thinking_budget
        if budget is None and ask.effort is not None:
            budget = 0 if ask.effort == "none" else EFFORT_BUDGET.get(ask.effort, EFFORT_BUDGET["medium"])
        if budget is not None:
            config["thinkingConfig"] = {"thinkingBudget": budget, "includeThoughts": budget > 0}
        if config:
            body["generationConfig"] = config
        if ask.tools:
            declarations = []
            for tool in ask.tools:
                declaration: dict[str, Any] = {"name": tool.name}
                if tool.description is not None:
                    declaration["description"] = tool.description
                if tool.parameters is not None:
                    declaration["parametersJsonSchema"] = tool.parameters
                declarations.append(declaration)
            body["tools"] = [{"functionDeclarations": declarations}]
            if any(t.strict for t in ask.tools):
                ask.dropped["tools.strict"] = None  # (the format holds calls to their schemas its own way)
        if ask.tool_choice is not None and ask.tools:
            mode = {"auto": "AUTO", "none": "NONE", "required": "ANY", "named": "ANY"}[ask.tool_choice]
            calling: dict[str, Any] = {"mode": mode}
            if ask.tool_choice == "named":
                calling["allowedFunctionNames"] = [ask.tool_named]
            body["toolConfig"] = {"functionCallingConfig": calling}
        if (
            any(p.cache is not None for t in ask.turns for p in t.parts)
            or any(p.cache for p in ask.system)
            or any(t.cache for t in ask.tools)
        ):
            ask.dropped["cache_control"] = None  # the format caches by a stored content, not by hints
        if ask.parallel_tools is False:
            ask.dropped["parallel_tool_calls"] = None
        if ask.user is not None:
            ask.dropped["user"] = None
        return body

    def upstream_path(self, ask: Ask) -> tuple[str, tuple[tuple[str, str], ...]]:
        model = quote(ask.model, safe="")  # a name is the client's words: one path segment, whatever it holds
        if ask.stream:
            return f"/v1beta/models/{model}:streamGenerateContent", (("alt", "sse"),)
        return f"/v1beta/models/{model}:generateContent", ()

    def read_reply(self, body: Any) -> Reply:
        candidates = body.get("candidates") if isinstance(body, dict) else None
        if blocked(body):  # the prompt was refused: no candidate at all
            return Reply(
                str(get(body, "responseId") or ""), "", [], FILTERED, counts=counts_of(get(body, "usageMetadata"))
            )
        if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], dict):
            raise UnknownAnswer("no candidates")
        candidate = candidates[0]
        parts = [p for part in get(candidate.get("content"), "parts") or [] for p in answer_parts(part)]
        stop = stop_of(get(candidate, "finishReason"), parts)
        ident = get(body, "responseId") or ""
        return Reply(
            str(ident),
            str(get(body, "modelVersion") or ""),
            parts,
            stop,
            counts=counts_of(get(body, "usageMetadata")),
        )

    def write_reply(self, reply: Reply, ask: Ask) -> dict[str, Any]:
        parts = []
        for part in reply.parts:
            if part.kind == "tool_call":
                parts.append(
                    {"functionCall": {"id": part.call_id, "name": part.name, "args": parsed_arguments(part.arguments)}}
                )
            elif part.kind == "thinking":
                thought: dict[str, Any] = {"text": part.text, "thought": True}
                if part.signature:
                    thought["thoughtSignature"] = to_client(part.signature)
                parts.append(thought)
            else:
                parts.append({"text": part.text})
        answer: dict[str, Any] = {
            "candidates": [
                {"content": {"role": "model", "parts": parts}, "finishReason": REASONS[reply.stop], "index": 0}
            ],
            "modelVersion": reply.model or ask.model,
            "responseId": reply.id,
        }
        if reply.counts is not None:
            answer["usageMetadata"] = usage_of(reply.counts)
        return answer


class _Calls:
    """The calls of a conversation not yet answered, by tool: a result that names no id answers
    the oldest of its tool's. In time linear in the calls, however many come."""

    __slots__ = ("waiting", "answered")

    def __init__(self) -> None:
        self.waiting: dict[Any, deque[str]] = {}
        self.answered: set[str] = set()  # ids a result named itself

    def called(self, name: Any, call_id: str) -> None:
        self.waiting.setdefault(name, deque()).append(call_id)

    def answer(self, name: Any, call_id: Any) -> str:
        """The id a result answers: its own, else its tool's oldest call no result answered yet."""
        if isinstance(call_id, str) and call_id:
            self.answered.add(call_id)
            return call_id
        waiting = self.waiting.get(name)
        while waiting:
            found = waiting.popleft()
            if found not in self.answered:
                return found
        return f"call_{name}"


def _parts(parts: Any, where: str, pending: _Calls, turn: int = 0) -> list[Part]:
    """A content's parts; one part may carry more than one thing (text beside a function call)."""
    out = []
    for i, part in enumerate(parts or []):
        if not isinstance(part, dict):
            raise Untranslatable(f"{where}[{i}]", "must be an object")
        found = _part(part, f"{where}[{i}]", pending, f"call_{turn}_{i}")
        if not found and get(part, "thoughtSignature") is None:  # (a signature alone carries nothing)
            raise Untranslatable(
                f"{where}[{i}]", "only text, images, function calls and their responses can be translated"
            )
        out += found
    return out


def _part(part: dict[str, Any], where: str, pending: _Calls, fresh_id: str) -> list[Part]:
    found = []
    if isinstance(part.get("text"), str):
        if part.get("thought") is True:
            found.append(Part("thinking", part["text"], signature=sent_back("content", get(part, "thoughtSignature"))))
        else:
            found.append(Part("text", part["text"]))
    for name in ("inlineData", "fileData"):
        media = get(part, name)
        if not isinstance(media, dict):
            continue
        kind = get(media, "mimeType")
        if not isinstance(kind, str) or not kind.startswith("image/"):  # audio, video, documents: no other format's
            raise Untranslatable(f"{where}.{name}.mimeType", "only images can be translated")
        data, url = (media.get("data"), None) if name == "inlineData" else (None, get(media, "fileUri"))
        found.append(Part("image", media_type=kind, data=data, url=url))
    call = get(part, "functionCall")
    if isinstance(call, dict):
        call_id = call.get("id") or fresh_id  # unique in the request, which is all it needs
        pending.called(call.get("name"), call_id)
        arguments = json_text(call.get("args"))
        signature = sent_back("content", get(part, "thoughtSignature"))
        found.append(
            Part("tool_call", call_id=call_id, name=call.get("name"), arguments=arguments, signature=signature)
        )
    result = get(part, "functionResponse")
    if isinstance(result, dict):
        name = result.get("name")
        call_id = pending.answer(name, result.get("id"))
        response = result.get("response")
        error = isinstance(response, dict) and set(response) == {"error"}
        if isinstance(response, dict) and len(response) == 1:
            ((name, value),) = response.items()
            if name in ("result", "output", "error") and isinstance(value, str):
                response = value  # {"result": text}, as results are written: the text
        found.append(
            Part("tool_result", call_id=call_id, name=name, content=[Part("text", json_text(response))], is_error=error)
        )
    return found


def _write_part(part: Part, names: dict[str | None, str | None], ask: Ask) -> dict[str, Any] | None:
    if part.kind == "text":
        return {"text": part.text}
    if part.kind == "image":
        if part.url:
            return {"fileData": {"mimeType": part.media_type or _guess(part.url), "fileUri": part.url}}
        return {"inlineData": {"mimeType": part.media_type, "data": part.data}}
    if part.kind == "tool_call":
        # The upstream checks a call's signature in the turn that made it; a call that reached the
        # client in another format came back without one, and says so in the format's own words.
        return {
            "functionCall": {"id": part.call_id, "name": part.name, "args": parsed_arguments(part.arguments)},
            "thoughtSignature": own_signature("content", part.signature) or UNSIGNED,
        }
    if part.kind == "tool_result":
        text = "".join(p.text for p in part.content or [] if p.kind == "text")
        if any(p.kind != "text" for p in part.content or []):
            raise Untranslatable("tool result", "only text tool results can be carried to the upstream's format")
        value = parsed_arguments(text) if text.startswith("{") else {"result": text}
        if part.is_error:
            value = {"error": text}
        return {
            "functionResponse": {"id": part.call_id, "name": part.name or names.get(part.call_id), "response": value}
        }
    if part.kind == "thinking" and own_signature("content", part.signature):
        return {"text": part.text, "thought": True, "thoughtSignature": own_signature("content", part.signature)}
    if "thinking" not in ask.dropped:
        ask.dropped["thinking"] = None
    return None


def _guess(url: str) -> str:
    lowered = url.lower().split("?")[0]
    for suffix, kind in ((".png", "image/png"), (".gif", "image/gif"), (".webp", "image/webp")):
        if lowered.endswith(suffix):
            return kind
    return "image/jpeg"
