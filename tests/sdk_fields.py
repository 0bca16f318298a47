"""What the SDKs may send in each field the gateway checks as an enumeration, and a request
around each value: the table tests/test_sdk_types.py (the Python SDKs' types) and
tests/test_js_sdk_types.py (the JavaScript SDKs' declarations) send through the gateway.

Each field names where the Python SDKs type it (`Sdk`, or `NoSdk` and why not) and where the
JavaScript SDKs do (`Js`, or `NoJs` and why not); a value either has that a hard rule of the
interface refuses is listed in its `beyond`, with the rule.
"""

from __future__ import annotations

import collections.abc
import enum
import importlib
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import aiohttp
import typing_extensions
from pydantic import BaseModel

from tests.conftest import BEARER, DEMO_KEY, MESSAGE_HEADERS

V = object()  # where a template puts the value under test


@dataclass(frozen=True)
class Sdk:
    """The values a Python SDK's request type can put here: `kind` is `module:Type` (a TypedDict,
    a pydantic model or a Union), `path` the field within it (`[]`: a list's items). `beyond`:
    values the SDK has that a hard rule of the interface refuses, each with the rule."""

    kind: str
    path: str
    beyond: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NoSdk:
    """No Python SDK types this field as an enumeration (a free string, or an endpoint no SDK calls)."""

    why: str


@dataclass(frozen=True)
class Js:
    """The values a JavaScript SDK's declarations let its request type put here (read by
    tests/ts_declarations.py): `file` under node_modules, `kind` a type, interface, class or
    enum declared there (`Namespace.Type` inside a namespace), `path` the property within it.
    `beyond`: values it has that a hard rule of the interface refuses, each with the rule (one
    the Python SDK's `beyond` names already need not be named again)."""

    file: str
    kind: str
    path: str = ""
    beyond: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NoJs:
    """No JavaScript SDK types this field as an enumeration."""

    why: str


@dataclass(frozen=True)
class Case:
    source: Sdk | NoSdk  # the Python SDKs
    template: dict[str, Any]  # top-level fields of a request that is valid around the value (V)
    js: Js | NoJs  # the JavaScript SDKs (openai, @anthropic-ai/sdk, @google/genai)


MODEL_OF_RESPONSES = "openai.types.responses.response_create_params:ResponseCreateParamsBase"
EDIT = {"images": [{"file_id": "file-1"}]}
RESPONSES_TS = "openai/resources/responses/responses.d.ts"
RESPONSE_CREATE = "ResponseCreateParamsBase"
CHAT_CREATE_PY = "openai.types.chat.completion_create_params:CompletionCreateParamsBase"
CHAT_TS = "openai/resources/chat/completions/completions.d.ts"
CHAT_CREATE = "ChatCompletionCreateParamsBase"
MESSAGES_TS = "@anthropic-ai/sdk/resources/messages/messages.d.ts"
BETA_MESSAGES_TS = "@anthropic-ai/sdk/resources/beta/messages/messages.d.ts"
GENAI_TS = "@google/genai/dist/genai.d.ts"
IMAGES_TS = "openai/resources/images.d.ts"
VIDEOS_TS = "openai/resources/videos.d.ts"
TEXT_PART = {"text": "t", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}

NO_JS_SENDS_ENDPOINT_1 = NoJs("endpoint 1's shape is the interface's; no SDK sends it")

# gateway field ("route:path", member types of a tagged union in parentheses) -> where the SDKs say
# what may be sent there, and a request around the value.
MAPPING: dict[str, Case] = {
    # -- response format (openai.responses.create) --
    "responses:input[](message).role": Case(
        Sdk(MODEL_OF_RESPONSES, "input[].role"),
        {"input": [{"role": V, "content": "hi"}]},
        js=Js(RESPONSES_TS, RESPONSE_CREATE, "input[].role"),
    ),
    "responses:input[](message).content[](input_image).detail": Case(
        Sdk("openai.types.responses:ResponseInputImageParam", "detail"),
        {
            "input": [
                {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png", "detail": V}]}
            ]
        },
        js=Js(RESPONSES_TS, "ResponseInputImage", "detail"),
    ),
    "responses:input[](function_call_output).status": Case(
        Sdk("openai.types.responses.response_input_item_param:FunctionCallOutput", "status"),
        {"input": [{"type": "function_call_output", "call_id": "c", "output": "{}", "status": V}]},
        js=Js(RESPONSES_TS, "ResponseInputItem.FunctionCallOutput", "status"),
    ),
    "responses:input[](reasoning).summary[].type": Case(
        Sdk("openai.types.responses:ResponseReasoningItemParam", "summary[].type"),
        {"input": [{"type": "reasoning", "id": "r", "summary": [{"type": V, "text": "t"}]}]},
        js=Js(RESPONSES_TS, "ResponseReasoningItem", "summary[].type"),
    ),
    "responses:include[]": Case(
        Sdk(MODEL_OF_RESPONSES, "include[]"), {"include": [V]}, js=Js(RESPONSES_TS, RESPONSE_CREATE, "include[]")
    ),
    "responses:reasoning.effort": Case(
        Sdk(MODEL_OF_RESPONSES, "reasoning.effort"),
        {"reasoning": {"effort": V}},
        js=Js(RESPONSES_TS, RESPONSE_CREATE, "reasoning.effort"),
    ),
    "responses:reasoning.summary": Case(
        Sdk(MODEL_OF_RESPONSES, "reasoning.summary"),
        {"reasoning": {"summary": V}},
        js=Js(RESPONSES_TS, RESPONSE_CREATE, "reasoning.summary"),
    ),
    "responses:reasoning.generate_summary": Case(
        Sdk(MODEL_OF_RESPONSES, "reasoning.generate_summary"),
        {"reasoning": {"generate_summary": V}},
        js=Js(RESPONSES_TS, RESPONSE_CREATE, "reasoning.generate_summary"),
    ),
    "responses:service_tier": Case(
        Sdk(MODEL_OF_RESPONSES, "service_tier"),
        {"service_tier": V},
        js=Js(RESPONSES_TS, RESPONSE_CREATE, "service_tier"),
    ),
    "responses:text.format.type": Case(
        Sdk(MODEL_OF_RESPONSES, "text.format.type"),
        {"text": {"format": {"type": V, "name": "n", "schema": {}}}},
        js=Js(RESPONSES_TS, RESPONSE_CREATE, "text.format.type"),
    ),
    "responses:tool_choice": Case(
        Sdk(MODEL_OF_RESPONSES, "tool_choice"), {"tool_choice": V}, js=Js(RESPONSES_TS, RESPONSE_CREATE, "tool_choice")
    ),
    "responses:tool_choice.type": Case(
        Sdk(MODEL_OF_RESPONSES, "tool_choice.type"),
        {"tool_choice": {"type": V, "name": "f"}},
        js=Js(RESPONSES_TS, RESPONSE_CREATE, "tool_choice.type"),
    ),
    "responses:tools[](web_search_preview).search_context_size": Case(
        Sdk("openai.types.responses:WebSearchPreviewToolParam", "search_context_size"),
        {"tools": [{"type": "web_search_preview", "search_context_size": V}]},
        js=Js(RESPONSES_TS, "WebSearchPreviewTool", "search_context_size"),
    ),
    "responses:tools[](web_search_preview).user_location.type": Case(
        Sdk("openai.types.responses:WebSearchPreviewToolParam", "user_location.type"),
        {"tools": [{"type": "web_search_preview", "user_location": {"type": V}}]},
        js=Js(RESPONSES_TS, "WebSearchPreviewTool", "user_location.type"),
    ),
    "responses:truncation": Case(
        Sdk(MODEL_OF_RESPONSES, "truncation"), {"truncation": V}, js=Js(RESPONSES_TS, RESPONSE_CREATE, "truncation")
    ),
    # -- chat completions (openai.chat.completions.create) --
    "chat_completions:messages[].role": Case(
        Sdk(CHAT_CREATE_PY, "messages[].role"),
        {"messages": [{"role": V, "content": "hi"}]},
        js=Js(CHAT_TS, CHAT_CREATE, "messages[].role"),
    ),
    "chat_completions:messages[].content[](image_url).image_url.detail": Case(
        Sdk("openai.types.chat:ChatCompletionContentPartImageParam", "image_url.detail"),
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": V}}],
                }
            ]
        },
        js=Js(CHAT_TS, "ChatCompletionContentPartImage.ImageURL", "detail"),
    ),
    "chat_completions:messages[].content[](input_audio).input_audio.format": Case(
        Sdk("openai.types.chat:ChatCompletionContentPartInputAudioParam", "input_audio.format"),
        {
            "messages": [
                {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": V}}]}
            ]
        },
        js=Js(CHAT_TS, "ChatCompletionContentPartInputAudio.InputAudio", "format"),
    ),
    "chat_completions:messages[].tool_calls[].type": Case(
        Sdk("openai.types.chat:ChatCompletionAssistantMessageParam", "tool_calls[].type"),
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "type": V, "function": {"name": "f", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c", "content": "ok"},
            ]
        },
        js=Js(CHAT_TS, "ChatCompletionAssistantMessageParam", "tool_calls[].type"),
    ),
    "chat_completions:reasoning_effort": Case(
        Sdk(CHAT_CREATE_PY, "reasoning_effort"),
        {"reasoning_effort": V},
        js=Js(CHAT_TS, CHAT_CREATE, "reasoning_effort"),
    ),
    "chat_completions:response_format.type": Case(
        Sdk(CHAT_CREATE_PY, "response_format.type"),
        {"response_format": {"type": V, "json_schema": {"name": "n", "schema": {}}}},
        js=Js(CHAT_TS, CHAT_CREATE, "response_format.type"),
    ),
    "chat_completions:service_tier": Case(
        Sdk(CHAT_CREATE_PY, "service_tier"), {"service_tier": V}, js=Js(CHAT_TS, CHAT_CREATE, "service_tier")
    ),
    "chat_completions:tool_choice": Case(
        Sdk(CHAT_CREATE_PY, "tool_choice"),
        {"tool_choice": V, "tools": [{"type": "function", "function": {"name": "f"}}]},
        js=Js(CHAT_TS, CHAT_CREATE, "tool_choice"),
    ),
    "chat_completions:tool_choice.type": Case(
        Sdk(CHAT_CREATE_PY, "tool_choice.type"),
        {
            "tool_choice": {"type": V, "function": {"name": "f"}},
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        js=Js(CHAT_TS, CHAT_CREATE, "tool_choice.type"),
    ),
    # -- message format (anthropic.messages.create) --
    "messages:messages[].role": Case(
        Sdk("anthropic.types:MessageParam", "role"),
        {"messages": [{"role": V, "content": "hi"}]},
        js=Js(MESSAGES_TS, "MessageParam", "role"),
    ),
    "messages:messages[].content[](text).cache_control.type": Case(
        Sdk("anthropic.types:TextBlockParam", "cache_control.type"),
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": V}}]}]},
        js=Js(MESSAGES_TS, "TextBlockParam", "cache_control.type"),
    ),
    "messages:messages[].content[](image).source.type": Case(
        Sdk("anthropic.types:ImageBlockParam", "source.type"),
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {
                                "type": V,
                                "media_type": "image/png",
                                "data": "iVBORw0KGgo=",
                                "url": "https://x/y.png",
                                "file_id": "f",
                            },
                        }
                    ],
                }
            ]
        },
        js=Js(MESSAGES_TS, "ImageBlockParam", "source.type"),
    ),
    "messages:messages[].content[](image).source(base64).media_type": Case(
        Sdk("anthropic.types:Base64ImageSourceParam", "media_type"),
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": V, "data": "iVBORw0KGgo="}}
                    ],
                }
            ]
        },
        js=Js(MESSAGES_TS, "Base64ImageSource", "media_type"),
    ),
    "messages:messages[].content[](tool_result).content[].type": Case(
        Sdk("anthropic.types:ToolResultBlockParam", "content[].type"),
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": V, **TEXT_PART}]}],
                }
            ]
        },
        js=Js(MESSAGES_TS, "ToolResultBlockParam", "content[].type"),
    ),
    "messages:system[].type": Case(
        Sdk("anthropic.types:TextBlockParam", "type"),
        {"system": [{"type": V, "text": "be brief"}]},
        js=Js(MESSAGES_TS, "MessageCreateParamsBase", "system[].type"),
    ),
    "messages:tool_choice.type": Case(
        Sdk("anthropic.types:ToolChoiceParam", "type"),
        {"tool_choice": {"type": V, "name": "f"}},
        js=Js(MESSAGES_TS, "MessageCreateParamsBase", "tool_choice.type"),
    ),
    "messages:tools[](computer_20241022).name": Case(
        Sdk("anthropic.types.beta:BetaToolComputerUse20241022Param", "name"),
        {"tools": [{"type": "computer_20241022", "name": V, "display_width_px": 1024, "display_height_px": 768}]},
        js=Js(BETA_MESSAGES_TS, "BetaToolComputerUse20241022", "name"),
    ),
    "messages:tools[](bash_20241022).name": Case(
        Sdk("anthropic.types.beta:BetaToolBash20241022Param", "name"),
        {"tools": [{"type": "bash_20241022", "name": V}]},
        js=Js(BETA_MESSAGES_TS, "BetaToolBash20241022", "name"),
    ),
    "messages:tools[](text_editor_20241022).name": Case(
        Sdk("anthropic.types.beta:BetaToolTextEditor20241022Param", "name"),
        {"tools": [{"type": "text_editor_20241022", "name": V}]},
        js=Js(BETA_MESSAGES_TS, "BetaToolTextEditor20241022", "name"),
    ),
    # -- content generation (google-genai; its pydantic types, fields in snake_case) --
    "generate_content:contents[].role": Case(
        NoSdk("google.genai.types.Content.role is a free string"),
        {"contents": [{"role": V, "parts": [{"text": "hi"}]}]},
        js=NoJs("@google/genai's Content.role is a free string"),
    ),
    "generate_content:contents[].parts[].executableCode.language": Case(
        Sdk("google.genai.types:ExecutableCode", "language"),
        {"contents": [{"parts": [{"executableCode": {"language": V, "code": "print(1)"}}]}]},
        js=Js(GENAI_TS, "ExecutableCode", "language"),
    ),
    "generate_content:contents[].parts[].codeExecutionResult.outcome": Case(
        Sdk("google.genai.types:CodeExecutionResult", "outcome"),
        {"contents": [{"parts": [{"codeExecutionResult": {"outcome": V}}]}]},
        js=Js(GENAI_TS, "CodeExecutionResult", "outcome"),
    ),
    "generate_content:toolConfig.functionCallingConfig.mode": Case(
        Sdk("google.genai.types:ToolConfig", "function_calling_config.mode"),
        {"toolConfig": {"functionCallingConfig": {"mode": V}}},
        js=Js(GENAI_TS, "ToolConfig", "functionCallingConfig.mode"),
    ),
    "generate_content:safetySettings[].category": Case(
        Sdk("google.genai.types:SafetySetting", "category"),
        {"safetySettings": [{"category": V, "threshold": "OFF"}]},
        js=Js(GENAI_TS, "SafetySetting", "category"),
    ),
    "generate_content:safetySettings[].threshold": Case(
        Sdk("google.genai.types:SafetySetting", "threshold"),
        {"safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": V}]},
        js=Js(GENAI_TS, "SafetySetting", "threshold"),
    ),
    "generate_content:generationConfig.responseMimeType": Case(
        NoSdk("google.genai.types.GenerateContentConfig.response_mime_type is a free string"),
        {"generationConfig": {"responseMimeType": V}},
        js=NoJs("@google/genai's GenerationConfig.responseMimeType is a free string"),
    ),
    "generate_content:generationConfig.responseSchema.type": Case(
        Sdk("google.genai.types:Schema", "type"),
        {"generationConfig": {"responseSchema": {"type": V}}},
        js=Js(GENAI_TS, "Schema", "type"),
    ),
    "generate_content:generationConfig.responseModalities[]": Case(
        Sdk("google.genai.types:GenerationConfig", "response_modalities[]"),
        {"generationConfig": {"responseModalities": [V]}},
        js=Js(GENAI_TS, "GenerationConfig", "responseModalities[]"),
    ),
    "generate_content:generationConfig.speechConfig.languageCode": Case(
        NoSdk("google.genai.types.SpeechConfig.language_code is a free string"),
        {"generationConfig": {"speechConfig": {"languageCode": V}}},
        js=NoJs("@google/genai's SpeechConfig.languageCode is a free string"),
    ),
    "generate_content:generationConfig.mediaResolution": Case(
        Sdk("google.genai.types:GenerateContentConfig", "media_resolution"),
        {"generationConfig": {"mediaResolution": V}},
        js=Js(GENAI_TS, "GenerateContentConfig", "mediaResolution"),
    ),
    "generate_content:generationConfig.responseFormat.image.delivery": Case(
        NoSdk("the gateway's own URL-delivery switch (2.8); google-genai's GenerateContentConfig has no such field"),
        {"generationConfig": {"responseFormat": {"image": {"delivery": V}}}},
        js=NoJs("the gateway's own switch; @google/genai has no such field"),
    ),
    # -- images (openai.images.generate / edit) --
    "image_generations:model": Case(
        NoSdk(
            "the interface's image models: routing and prices go by them, and "
            "the SDK's ImageModel names another vendor's"
        ),
        {"model": V},
        js=NoJs("the openai SDK's ImageModel names another vendor's"),
    ),
    "image_generations:quality": Case(
        Sdk("openai.types.image_generate_params:ImageGenerateParamsBase", "quality"),
        {"model": "imagegen-2.5-sunburst", "quality": V},
        js=Js(IMAGES_TS, "ImageGenerateParamsBase", "quality"),
    ),
    "image_generations:background": Case(
        Sdk("openai.types.image_generate_params:ImageGenerateParamsBase", "background"),
        {"background": V},
        js=Js(IMAGES_TS, "ImageGenerateParamsBase", "background"),
    ),
    "image_generations:output_format": Case(
        Sdk("openai.types.image_generate_params:ImageGenerateParamsBase", "output_format"),
        {"output_format": V},
        js=Js(IMAGES_TS, "ImageGenerateParamsBase", "output_format"),
    ),
    "image_generations:moderation": Case(
        Sdk("openai.types.image_generate_params:ImageGenerateParamsBase", "moderation"),
        {"moderation": V},
        js=Js(IMAGES_TS, "ImageGenerateParamsBase", "moderation"),
    ),
    "image_generations:response_format": Case(
        Sdk("openai.types.image_generate_params:ImageGenerateParamsBase", "response_format"),
        {"response_format": V},
        js=Js(IMAGES_TS, "ImageGenerateParamsBase", "response_format"),
    ),
    "image_edits:input_fidelity": Case(
        Sdk("openai.types.image_edit_params:ImageEditParamsBase", "input_fidelity"),
        {**EDIT, "input_fidelity": V},
        js=Js(IMAGES_TS, "ImageEditParamsBase", "input_fidelity"),
    ),
    # -- video (endpoint 1 is the interface's own shape; openai.videos.create sends endpoint 3) --
    "video_generations:model": Case(
        NoSdk(
            "the interface's video models: routing and prices go by them, and the "
            "SDK's VideoModel names another vendor's"
        ),
        {"model": V},
        js=NoJs("the openai SDK's VideoModel names another vendor's"),
    ),
    "video_generations:metadata.aspectRatio": Case(
        NoSdk("endpoint 1's shape is the interface's; no SDK sends it"),
        {"metadata": {"aspectRatio": V}},
        js=NO_JS_SENDS_ENDPOINT_1,
    ),
    "video_generations:metadata.durationSeconds": Case(
        NoSdk("endpoint 1's shape is the interface's; no SDK sends it (section 8: 4, 6 or 8)"),
        {"metadata": {"durationSeconds": V}},
        js=NO_JS_SENDS_ENDPOINT_1,
    ),
    "video_generations:metadata.personGeneration": Case(
        NoSdk("endpoint 1's shape is the interface's; no SDK sends it"),
        {"metadata": {"personGeneration": V}},
        js=NO_JS_SENDS_ENDPOINT_1,
    ),
    "videos:seconds": Case(
        Sdk(
            "openai.types.video_create_params:VideoCreateParams",
            "seconds",
            beyond={"12": "section 8: a video lasts 4, 6 or 8 seconds"},
        ),
        {"seconds": V},
        js=Js(VIDEOS_TS, "VideoCreateParams", "seconds"),
    ),
}
# Enumerations checked in a validator rather than a type, which the walk cannot see: listed by hand.
CHECKED_IN_VALIDATORS: dict[str, Case] = {
    "image_generations:size": Case(
        Sdk(
            "openai.types.image_generate_params:ImageGenerateParamsBase",
            "size",
            beyond={
                "256x256": "2.6 and section 8: a custom size has 655,360 pixels at least",
                "512x512": "2.6 and section 8: a custom size has 655,360 pixels at least",
            },
        ),
        {"model": "imagegen-2", "size": V},
        js=Js(IMAGES_TS, "ImageGenerateParamsBase", "size"),
    ),
}

ROUTES = {  # route -> (path, headers, a valid request the templates add to)
    "responses": ("/v1/responses", BEARER, {"model": "respmodel-4o", "input": "hi"}),
    "chat_completions": (
        "/v1/chat/completions",
        BEARER,
        {"model": "respmodel-4o", "messages": [{"role": "user", "content": "hi"}]},
    ),
    "messages": (
        "/v1/messages",
        MESSAGE_HEADERS,
        {"model": "msgmodel-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "generate_content": (
        f"/v1beta/models/genmodel-2.0-flash:generateContent?key={DEMO_KEY}",
        {},
        {"contents": [{"parts": [{"text": "hi"}]}]},
    ),
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


# -- what a Python SDK's types allow --


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


def placed(template: Any, value: Any) -> Any:
    if template is V:
        return value
    if isinstance(template, dict):
        return {k: placed(v, value) for k, v in template.items()}
    if isinstance(template, list):
        return [placed(v, value) for v in template]
    return template


async def refusals(
    http: aiohttp.ClientSession, url: str, key: str, case: Case, values: Iterable[Any], beyond: Mapping[str, str]
) -> list[str]:
    """Each of `values` sent in `case`'s field to the gateway at `url`: what it got wrong, a 400
    (or a 5xx) for a value no rule refuses, or anything but a 400 for one a rule in `beyond` does."""
    path, headers, base = ROUTES[key.partition(":")[0]]
    wrong = []
    for value in values:
        async with http.post(url + path, json={**base, **placed(case.template, value)}, headers=headers) as answer:
            text = await answer.text()
        if (refused := beyond.get(value)) and answer.status != 400:
            wrong.append(f"{key}={value!r}: {refused}, yet {answer.status}")
        elif not refused and (answer.status == 400 or answer.status >= 500):
            wrong.append(f"{key}={value!r}: {answer.status} {text[:200]}")
    return wrong
