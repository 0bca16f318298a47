"""The request types of the installed openai, anthropic and google-genai SDKs, read as data: every
value an SDK can put in a field the gateway checks as an enumeration goes through the gateway,
and none gets a 400 (nor a 5xx) unless a hard rule of the interface refuses it, named here.

The gateway's enumeration fields are found by walking its request schemas (Literals, open
enumerations, tagged unions), so a new one in a schema fails this test until it is mapped to the
SDK type that sends it. When an SDK adds a value, the send test says so before a user does.
"""

from __future__ import annotations

import collections.abc
import enum
import importlib
import types
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typing_extensions
from pydantic import BaseModel, Discriminator, Tag

from proxy.schemas import JSON_SCHEMAS, ImageEditForm
from proxy.schemas.common import MARK
from proxy.schemas.enums import OpenEnum, OpenKind
from tests.conftest import BEARER, DEMO_KEY, MESSAGE_HEADERS

V = object()  # where a template puts the value under test


@dataclass(frozen=True)
class Sdk:
    """The values an SDK's request type can put here: `kind` is `module:Type` (a TypedDict, a
    pydantic model or a Union), `path` the field within it (`[]`: a list's items). `beyond`:
    values the SDK has that a hard rule of the interface refuses, each with the rule."""

    kind: str
    path: str
    beyond: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NoSdk:
    """No SDK types this field as an enumeration (a free string, or an endpoint no SDK calls)."""

    why: str


@dataclass(frozen=True)
class Case:
    source: Sdk | NoSdk
    template: dict[str, Any]  # top-level fields of a request that is valid around the value (V)


MODEL_OF_RESPONSES = "openai.types.responses.response_create_params:ResponseCreateParamsBase"
MESSAGE_CREATE = "anthropic.types.message_create_params:MessageCreateParamsBase"
EDIT = {"images": [{"file_id": "file-1"}]}
TEXT_PART = {"text": "t", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}

# gateway field ("route:path", member types of a tagged union in parentheses) -> where the SDKs say
# what may be sent there, and a request around the value.
MAPPING: dict[str, Case] = {
    # -- response format (openai.responses.create) --
    "responses:input[](message).role": Case(Sdk(MODEL_OF_RESPONSES, "input[].role"),
                                            {"input": [{"role": V, "content": "hi"}]}),
    "responses:input[](message).content[](input_image).detail": Case(
        Sdk("openai.types.responses:ResponseInputImageParam", "detail"),
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png", "detail": V}]}]}),
    "responses:input[](function_call_output).status": Case(
        Sdk("openai.types.responses.response_input_item_param:FunctionCallOutput", "status"),
        {"input": [{"type": "function_call_output", "call_id": "c", "output": "{}", "status": V}]}),
    "responses:input[](reasoning).summary[].type": Case(
        Sdk("openai.types.responses:ResponseReasoningItemParam", "summary[].type"),
        {"input": [{"type": "reasoning", "id": "r", "summary": [{"type": V, "text": "t"}]}]}),
    "responses:include[]": Case(Sdk(MODEL_OF_RESPONSES, "include[]"), {"include": [V]}),
    "responses:reasoning.effort": Case(Sdk(MODEL_OF_RESPONSES, "reasoning.effort"), {"reasoning": {"effort": V}}),
    "responses:reasoning.summary": Case(Sdk(MODEL_OF_RESPONSES, "reasoning.summary"), {"reasoning": {"summary": V}}),
    "responses:reasoning.generate_summary": Case(Sdk(MODEL_OF_RESPONSES, "reasoning.generate_summary"),
                                                 {"reasoning": {"generate_summary": V}}),
    "responses:service_tier": Case(Sdk(MODEL_OF_RESPONSES, "service_tier"), {"service_tier": V}),
    "responses:text.format.type": Case(Sdk(MODEL_OF_RESPONSES, "text.format.type"),
                                       {"text": {"format": {"type": V, "name": "n", "schema": {}}}}),
    "responses:tool_choice": Case(Sdk(MODEL_OF_RESPONSES, "tool_choice"), {"tool_choice": V}),
    "responses:tool_choice.type": Case(Sdk(MODEL_OF_RESPONSES, "tool_choice.type"),
                                       {"tool_choice": {"type": V, "name": "f"}}),
    "responses:tools[](web_search_preview).search_context_size": Case(
        Sdk("openai.types.responses:WebSearchPreviewToolParam", "search_context_size"),
        {"tools": [{"type": "web_search_preview", "search_context_size": V}]}),
    "responses:tools[](web_search_preview).user_location.type": Case(
        Sdk("openai.types.responses:WebSearchPreviewToolParam", "user_location.type"),
        {"tools": [{"type": "web_search_preview", "user_location": {"type": V}}]}),
    "responses:truncation": Case(Sdk(MODEL_OF_RESPONSES, "truncation"), {"truncation": V}),
    # -- message format (anthropic.messages.create) --
    "messages:messages[].role": Case(Sdk("anthropic.types:MessageParam", "role"),
                                     {"messages": [{"role": V, "content": "hi"}]}),
    "messages:messages[].content[](text).cache_control.type": Case(
        Sdk("anthropic.types:TextBlockParam", "cache_control.type"),
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": V}}]}]}),
    "messages:messages[].content[](image).source.type": Case(
        Sdk("anthropic.types:ImageBlockParam", "source.type"),
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {
            "type": V, "media_type": "image/png", "data": "iVBORw0KGgo=", "url": "https://x/y.png", "file_id": "f"}}]}]}),
    "messages:messages[].content[](image).source(base64).media_type": Case(
        Sdk("anthropic.types:Base64ImageSourceParam", "media_type"),
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": V, "data": "iVBORw0KGgo="}}]}]}),
    "messages:messages[].content[](tool_result).content[].type": Case(
        Sdk("anthropic.types:ToolResultBlockParam", "content[].type"),
        {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                    "content": [{"type": V, **TEXT_PART}]}]}]}),
    "messages:system[].type": Case(Sdk("anthropic.types:TextBlockParam", "type"),
                                   {"system": [{"type": V, "text": "be brief"}]}),
    "messages:tool_choice.type": Case(Sdk("anthropic.types:ToolChoiceParam", "type"),
                                      {"tool_choice": {"type": V, "name": "f"}}),
    "messages:tools[](computer_20241022).name": Case(
        Sdk("anthropic.types.beta:BetaToolComputerUse20241022Param", "name"),
        {"tools": [{"type": "computer_20241022", "name": V, "display_width_px": 1024, "display_height_px": 768}]}),
    "messages:tools[](bash_20241022).name": Case(Sdk("anthropic.types.beta:BetaToolBash20241022Param", "name"),
                                                 {"tools": [{"type": "bash_20241022", "name": V}]}),
    "messages:tools[](text_editor_20241022).name": Case(
        Sdk("anthropic.types.beta:BetaToolTextEditor20241022Param", "name"),
        {"tools": [{"type": "text_editor_20241022", "name": V}]}),
    # -- content generation (google-genai; its pydantic types, fields in snake_case) --
    "generate_content:contents[].role": Case(NoSdk("google.genai.types.Content.role is a free string"),
                                             {"contents": [{"role": V, "parts": [{"text": "hi"}]}]}),
    "generate_content:contents[].parts[].executableCode.language": Case(
        Sdk("google.genai.types:ExecutableCode", "language"),
        {"contents": [{"parts": [{"executableCode": {"language": V, "code": "print(1)"}}]}]}),
    "generate_content:contents[].parts[].codeExecutionResult.outcome": Case(
        Sdk("google.genai.types:CodeExecutionResult", "outcome"),
        {"contents": [{"parts": [{"codeExecutionResult": {"outcome": V}}]}]}),
    "generate_content:toolConfig.functionCallingConfig.mode": Case(
        Sdk("google.genai.types:ToolConfig", "function_calling_config.mode"),
        {"toolConfig": {"functionCallingConfig": {"mode": V}}}),
    "generate_content:safetySettings[].category": Case(Sdk("google.genai.types:SafetySetting", "category"),
                                                       {"safetySettings": [{"category": V, "threshold": "OFF"}]}),
    "generate_content:safetySettings[].threshold": Case(
        Sdk("google.genai.types:SafetySetting", "threshold"),
        {"safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": V}]}),
    "generate_content:generationConfig.responseMimeType": Case(
        NoSdk("google.genai.types.GenerateContentConfig.response_mime_type is a free string"),
        {"generationConfig": {"responseMimeType": V}}),
    "generate_content:generationConfig.responseSchema.type": Case(
        Sdk("google.genai.types:Schema", "type"), {"generationConfig": {"responseSchema": {"type": V}}}),
    "generate_content:generationConfig.responseModalities[]": Case(
        Sdk("google.genai.types:GenerationConfig", "response_modalities[]"),
        {"generationConfig": {"responseModalities": [V]}}),
    "generate_content:generationConfig.speechConfig.languageCode": Case(
        NoSdk("google.genai.types.SpeechConfig.language_code is a free string"),
        {"generationConfig": {"speechConfig": {"languageCode": V}}}),
    "generate_content:generationConfig.mediaResolution": Case(
        Sdk("google.genai.types:GenerateContentConfig", "media_resolution"),
        {"generationConfig": {"mediaResolution": V}}),
    "generate_content:generationConfig.responseFormat.image.delivery": Case(
        NoSdk("the gateway's own URL-delivery switch (2.8); google-genai's GenerateContentConfig has no such field"),
        {"generationConfig": {"responseFormat": {"image": {"delivery": V}}}}),
    # -- images (openai.images.generate / edit) --
    "image_generations:model": Case(NoSdk("the interface's image models: routing and prices go by them, and "
                                          "the SDK's ImageModel names another vendor's"), {"model": V}),
    "image_generations:quality": Case(Sdk("openai.types.image_generate_params:ImageGenerateParamsBase", "quality"),
                                      {"model": "imagegen-2.5-sunburst", "quality": V}),
    "image_generations:background": Case(
        Sdk("openai.types.image_generate_params:ImageGenerateParamsBase", "background"), {"background": V}),
    "image_generations:output_format": Case(
        Sdk("openai.types.image_generate_params:ImageGenerateParamsBase", "output_format"), {"output_format": V}),
    "image_generations:moderation": Case(
        Sdk("openai.types.image_generate_params:ImageGenerateParamsBase", "moderation"), {"moderation": V}),
    "image_generations:response_format": Case(
        Sdk("openai.types.image_generate_params:ImageGenerateParamsBase", "response_format"), {"response_format": V}),
    "image_edits:input_fidelity": Case(Sdk("openai.types.image_edit_params:ImageEditParamsBase", "input_fidelity"),
                                       {**EDIT, "input_fidelity": V}),
    # -- video (endpoint 1 is the interface's own shape; openai.videos.create sends endpoint 3) --
    "video_generations:model": Case(NoSdk("the interface's video models: routing and prices go by them, and the "
                                          "SDK's VideoModel names another vendor's"), {"model": V}),
    "video_generations:metadata.aspectRatio": Case(NoSdk("endpoint 1's shape is the interface's; no SDK sends it"),
                                                   {"metadata": {"aspectRatio": V}}),
    "video_generations:metadata.durationSeconds": Case(NoSdk("endpoint 1's shape is the interface's; no SDK sends "
                                                             "it (section 8: 4, 6 or 8)"), {"metadata": {"durationSeconds": V}}),
    "video_generations:metadata.personGeneration": Case(NoSdk("endpoint 1's shape is the interface's; no SDK sends it"),
                                                        {"metadata": {"personGeneration": V}}),
    "videos:seconds": Case(Sdk("openai.types.video_create_params:VideoCreateParams", "seconds",
                               beyond={"12": "section 8: a video lasts 4, 6 or 8 seconds"}), {"seconds": V}),
}
# Enumerations checked in a validator rather than a type, which the walk cannot see: listed by hand.
CHECKED_IN_VALIDATORS: dict[str, Case] = {
    "image_generations:size": Case(Sdk("openai.types.image_generate_params:ImageGenerateParamsBase", "size", beyond={
        "256x256": "2.6 and section 8: a custom size has 655,360 pixels at least",
        "512x512": "2.6 and section 8: a custom size has 655,360 pixels at least"}), {"model": "imagegen-2", "size": V}),
}

ROUTES = {  # route -> (path, headers, a valid request the templates add to)
    "responses": ("/v1/responses", BEARER, {"model": "respmodel-4o", "input": "hi"}),
    "messages": ("/v1/messages", MESSAGE_HEADERS,
                 {"model": "msgmodel-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}),
    "generate_content": (f"/v1beta/models/genmodel-2.0-flash:generateContent?key={DEMO_KEY}", {},
                         {"contents": [{"parts": [{"text": "hi"}]}]}),
    "image_generations": ("/v1/images/generations", BEARER, {"model": "imagegen-2", "prompt": "a fox"}),
    "image_edits": ("/v1/images/edits", BEARER, {"model": "imagegen-2", "prompt": "a fox"}),
    "video_generations": ("/v1/video/generations", BEARER, {"model": "videogen-3.0-generate-001", "prompt": "waves"}),
    "videos": ("/v1/videos", BEARER, {"model": "videogen-3.0-generate-001", "prompt": "waves"}),
}
# URL delivery on, so `response_format: url` is served (not the spec's 503 for an environment without it).
CONFIG = """
keys: [{name: demo, key: sk-demo-key, url_delivery: true}]
plugins: {url_delivery: {enabled: true, dir: "%s"}}
channels:
  - {name: simulator, base_url: simulator, accepts_response_format: false,
     simulator: {chunk_delay_ms: 0, output_tokens: 2, video_queued_s: 0, video_processing_s: 0}}
"""
MADE_UP = "a-value-of-tomorrow"


# -- the gateway's enumeration fields, from its schemas --

@dataclass(frozen=True)
class Enumeration:
    values: tuple[Any, ...]
    label: str | None  # an open enumeration's label; None: closed


def gateway_enumerations() -> dict[str, Enumeration]:
    """Every field the request schemas check against a list of values, as "route:path"; a field
    of a model used in several places once, where the walk meets it first."""
    roots: dict[type[BaseModel], str] = {}
    for route, schema in JSON_SCHEMAS.items():
        roots.setdefault(schema, route)
    roots.setdefault(ImageEditForm, "image_edits")
    found: dict[str, Enumeration] = {}
    owners: set[tuple[Any, ...]] = set()
    for schema, route in roots.items():
        _model(schema, f"{route}:", (), False, found, owners)
    return found


def _model(model: type[BaseModel], path: str, ancestors: tuple[type, ...], member: bool,
           found: dict[str, Enumeration], owners: set[tuple[Any, ...]]) -> None:
    if model in ancestors:
        return  # a recursive schema (responseSchema.items ...): its fields were walked already
    for name, info in model.model_fields.items():
        if member and name == "type":
            continue  # a tagged union's tag: the union is the enumeration
        owner = next(c for c in model.__mro__ if name in c.__dict__.get("__annotations__", {}))
        kind = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        place = f"{path}{'' if path.endswith(':') else '.'}{info.alias or name}"
        _walk(kind, place, (*ancestors, model), (owner, name), found, owners)


def _walk(kind: Any, path: str, ancestors: tuple[type, ...], origin: tuple[Any, ...],
          found: dict[str, Enumeration], owners: set[tuple[Any, ...]]) -> None:
    def record(where: str, values: tuple[Any, ...], label: str | None, why: tuple[Any, ...]) -> None:
        if why not in owners:
            owners.add(why)
            found[where] = Enumeration(values, label)

    origin_type = get_origin(kind)
    if origin_type is Annotated:
        inner, *marks = get_args(kind)
        if (mark := next((m for m in marks if isinstance(m, OpenEnum)), None)) is not None:
            record(path, mark.values, mark.field, origin)
        elif any(isinstance(m, Discriminator) for m in marks):
            _tagged(inner, path, ancestors, origin, found, owners, record)
        else:
            _walk(inner, path, ancestors, origin, found, owners)
    elif origin_type in (Union, types.UnionType):
        for arg in get_args(kind):
            _walk(arg, path, ancestors, origin, found, owners)
    elif origin_type is list:
        _walk(get_args(kind)[0], path + "[]", ancestors, origin, found, owners)
    elif origin_type is dict:
        _walk(get_args(kind)[1], path + "{}", ancestors, origin, found, owners)
    elif origin_type is Literal:
        record(path, get_args(kind), None, origin)
    elif isinstance(kind, type) and issubclass(kind, enum.Enum):
        record(path, tuple(m.value for m in kind), None, origin)
    elif isinstance(kind, type) and issubclass(kind, BaseModel):
        _model(kind, path, ancestors, False, found, owners)


def _tagged(union: Any, path: str, ancestors: tuple[type, ...], origin: tuple[Any, ...],
            found: dict[str, Enumeration], owners: set[tuple[Any, ...]], record: Any) -> None:
    members: dict[str, Any] = {}
    for arg in get_args(union):
        inner, *marks = get_args(arg)  # nested Annotated flattens: the member's own marks are here too
        tag = next(m.tag for m in marks if isinstance(m, Tag))
        own = [m for m in marks if not isinstance(m, Tag)]
        members.setdefault(tag.removeprefix(MARK), Annotated[(inner, *own)] if own else inner)
    if set(members) == {"str", "other"}:  # proxy.schemas.common.text_or: a string or something else
        for inner in members.values():
            _walk(inner, path, ancestors, origin, found, owners)
        return
    other = members.pop("other", None)
    if other is None or issubclass(other, OpenKind):  # closed, or open and noted: an enumeration
        record(path + ".type", tuple(members), other.open_field if other else None, (*origin, "type"))
    for tag, member in members.items():
        if isinstance(member, type) and issubclass(member, BaseModel):
            _model(member, f"{path}({tag})", ancestors, True, found, owners)


# -- what an SDK's types allow --

def sdk_values(source: Sdk) -> set[Any]:
    module, _, name = source.kind.partition(":")
    kind = getattr(importlib.import_module(module), name)
    return _values(kind, [s for s in source.path.replace("[]", ".[]").split(".") if s])


_WRAPPERS = (Annotated, typing_extensions.Required, typing_extensions.NotRequired, typing_extensions.ReadOnly)
_SEQUENCES = (list, collections.abc.Iterable, collections.abc.Sequence)


def _values(kind: Any, path: list[str]) -> set[Any]:
    origin = get_origin(kind)
    if origin in _WRAPPERS:
        return _values(get_args(kind)[0], path)
    if origin in (Union, types.UnionType):
        return set().union(*(_values(arg, path) for arg in get_args(kind)))
    if not path:
        if origin is Literal:
            return {v for v in get_args(kind) if isinstance(v, str)}
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            return {m.value for m in kind}
        return set()
    head, rest = path[0], path[1:]
    if head == "[]":
        return _values(get_args(kind)[0], rest) if origin in _SEQUENCES and get_args(kind) else set()
    if typing_extensions.is_typeddict(kind):
        hints = typing_extensions.get_type_hints(kind, include_extras=True)
        return _values(hints[head], rest) if head in hints else set()
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        fields = kind.model_fields
        return _values(fields[head].annotation, rest) if head in fields else set()
    return set()


def _placed(template: Any, value: Any) -> Any:
    if template is V:
        return value
    if isinstance(template, dict):
        return {k: _placed(v, value) for k, v in template.items()}
    if isinstance(template, list):
        return [_placed(v, value) for v in template]
    return template


# -- the tests --

def test_every_enumeration_the_gateway_checks_is_mapped_to_the_sdk_types_that_send_it():
    walked = gateway_enumerations()
    assert sorted(set(walked) - set(MAPPING)) == [], "map each new enumeration field to its SDK type"
    assert sorted(set(MAPPING) - set(walked)) == [], "a mapped field the schemas no longer check"
    for key, case in {**MAPPING, **CHECKED_IN_VALIDATORS}.items():
        if isinstance(case.source, Sdk):
            values = sdk_values(case.source)
            assert values, f"{key}: {case.source.kind} has no enumeration at {case.source.path}"
            assert set(case.source.beyond) <= values, f"{key}: a refused value the SDK no longer has"
        elif walked.get(key) and walked[key].label is None:
            assert case.source.why, key  # a closed list no SDK sends says why it is closed


def test_the_walk_sees_open_closed_and_tagged_enumerations():
    walked = gateway_enumerations()
    assert walked["responses:reasoning.effort"] == Enumeration(("low", "medium", "high"), "reasoning.effort")
    assert walked["image_generations:response_format"] == Enumeration(("url", "b64_json"), None)
    assert walked["messages:tool_choice.type"].values == ("auto", "any", "tool", "none")
    assert "messages:messages[].content[].type" not in walked  # open to any block type, noted nowhere


async def test_every_value_the_sdks_can_send_passes_the_gateway(start_gateway, http, tmp_path):  # noqa: ANN001
    gw = await start_gateway(CONFIG % (tmp_path / "images"))
    walked = gateway_enumerations()
    wrong: list[str] = []
    sent = 0
    for key, case in {**MAPPING, **CHECKED_IN_VALIDATORS}.items():
        route = key.partition(":")[0]
        path, headers, base = ROUTES[route]
        if isinstance(case.source, Sdk):
            values = sorted(sdk_values(case.source))
        elif walked[key].label is not None:
            values = [MADE_UP]  # open, with no SDK list: anything passes
        else:
            continue  # closed, and no SDK sends it: the reason is in the mapping
        for value in values:
            body = {**base, **_placed(case.template, value)}
            async with http.post(gw.url + path, json=body, headers=headers) as answer:
                text = await answer.text()
            sent += 1
            refused = case.source.beyond.get(value) if isinstance(case.source, Sdk) else None
            if refused and answer.status != 400:
                wrong.append(f"{key}={value!r}: {refused}, yet {answer.status}")
            elif not refused and (answer.status == 400 or answer.status >= 500):
                wrong.append(f"{key}={value!r}: {answer.status} {text[:200]}")
    assert wrong == []
    assert sent > 150  # every SDK's lists, not a few
