"""Validation (spec sections 2, 4, 8, 9): one negative case per rule, one positive case per endpoint.

Each refusal is a 400 in the endpoint's own shape naming the field's path; each valid
request reaches the upstream byte-identical.
"""

from __future__ import annotations

import struct
import zlib

import aiohttp
import orjson
import pytest

from tests.conftest import BEARER, DEMO_KEY

MSG = {"x-api-key": DEMO_KEY, "msgapi-version": "2023-06-01"}
IMAGE = {"model": "imagegen-2", "prompt": "a fox"}
VIDEO = {"model": "videogen-3.0-generate-001", "prompt": "waves"}
MESSAGE = {"model": "msgmodel-sonnet-4-5", "max_tokens": 2048, "messages": [{"role": "user", "content": "hi"}]}
CONTENT = {"contents": [{"parts": [{"text": "hi"}]}]}
RESPONSE = {"model": "respmodel-4o", "input": "hi"}


def png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = zlib.compress((b"\x00" + b"\x00\x00\x00\x00" * width) * height)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0))
        + chunk(b"IDAT", raw)
        + chunk(b"IEND", b"")
    )


PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
GIF_B64 = "R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7"
JPEG_B64 = "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8UHRofHh0aHBwgJC4n"


def many(n: int, item: object) -> list:
    return [item] * n


# (case, path, headers, body, field path in the error)
JSON_CASES = [
    # images, endpoint 6 (2.4, 2.6, 8)
    (
        "custom size needs a custom-size model",
        "/v1/images/generations",
        BEARER,
        {**IMAGE, "model": "imagegen-1", "size": "1280x720"},
        "size",
    ),
    ("custom size multiples of 16", "/v1/images/generations", BEARER, {**IMAGE, "size": "1000x1000"}, "size"),
    ("custom size ratio at most 3:1", "/v1/images/generations", BEARER, {**IMAGE, "size": "3840x1264"}, "size"),
    ("custom size edge at most 3840", "/v1/images/generations", BEARER, {**IMAGE, "size": "3856x2160"}, "size"),
    ("custom size at least 655,360 pixels", "/v1/images/generations", BEARER, {**IMAGE, "size": "512x512"}, "size"),
    ("custom size at most 8,294,400 pixels", "/v1/images/generations", BEARER, {**IMAGE, "size": "3840x2176"}, "size"),
    ("size form", "/v1/images/generations", BEARER, {**IMAGE, "size": "big"}, "size"),
    ("xhigh quality needs a 2.5 model", "/v1/images/generations", BEARER, {**IMAGE, "quality": "xhigh"}, "quality"),
    (
        "max quality needs a 2.5 model",
        "/v1/images/generations",
        BEARER,
        {**IMAGE, "model": "imagegen-1.5", "quality": "max"},
        "quality",
    ),
    ("quality values", "/v1/images/generations", BEARER, {**IMAGE, "quality": "ultra"}, "quality"),
    (
        "transparent needs png or webp",
        "/v1/images/generations",
        BEARER,
        {**IMAGE, "background": "transparent", "output_format": "jpeg"},
        "background",
    ),
    (
        "partial_images only with stream",
        "/v1/images/generations",
        BEARER,
        {**IMAGE, "partial_images": 2},
        "partial_images",
    ),
    (
        "partial_images 0-3",
        "/v1/images/generations",
        BEARER,
        {**IMAGE, "stream": True, "partial_images": 4},
        "partial_images",
    ),
    (
        "response_format lowercase",
        "/v1/images/generations",
        BEARER,
        {**IMAGE, "response_format": "URL"},
        "response_format",
    ),
    (
        "response_format url not with stream",
        "/v1/images/generations",
        BEARER,
        {**IMAGE, "response_format": "url", "stream": True},
        "response_format",
    ),
    ("n at least 1", "/v1/images/generations", BEARER, {**IMAGE, "n": 0}, "n"),
    ("n at most 10", "/v1/images/generations", BEARER, {**IMAGE, "n": 11}, "n"),
    ("n is an integer", "/v1/images/generations", BEARER, {**IMAGE, "n": "2"}, "n"),
    ("prompt at most 32000", "/v1/images/generations", BEARER, {**IMAGE, "prompt": "x" * 32001}, "prompt"),
    (
        "output_compression 0-100",
        "/v1/images/generations",
        BEARER,
        {**IMAGE, "output_compression": 101},
        "output_compression",
    ),
    ("image model", "/v1/images/generations", BEARER, {**IMAGE, "model": "imagegen-9"}, "model"),
    ("prompt required", "/v1/images/generations", BEARER, {"model": "imagegen-2"}, "prompt"),
    # images, endpoint 7 JSON variant (2.5)
    ("edit images at most 16", "/v1/images/edits", BEARER, {**IMAGE, "images": many(17, {"file_id": "f"})}, "images"),
    (
        "edit image reference has one source",
        "/v1/images/edits",
        BEARER,
        {**IMAGE, "images": [{"file_id": "f", "image_url": "https://x/y.png"}]},
        "images[0]",
    ),
    (
        "edit image data is PNG/WEBP/JPG",
        "/v1/images/edits",
        BEARER,
        {**IMAGE, "images": [{"image_url": f"data:image/gif;base64,{GIF_B64}"}]},
        "images[0].image_url",
    ),
    (
        "edit mask data is PNG",
        "/v1/images/edits",
        BEARER,
        {**IMAGE, "images": [{"file_id": "f"}], "mask": {"image_url": f"data:image/jpeg;base64,{JPEG_B64}"}},
        "mask.image_url",
    ),
    # video, endpoints 1 and 3 (2.1, 8)
    ("video model", "/v1/video/generations", BEARER, {**VIDEO, "model": "videogen-2"}, "model"),
    ("video prompt required", "/v1/videos", BEARER, {"model": VIDEO["model"]}, "prompt"),
    (
        "durationSeconds 4, 6 or 8",
        "/v1/video/generations",
        BEARER,
        {**VIDEO, "metadata": {"durationSeconds": 5}},
        "metadata.durationSeconds",
    ),
    ("sampleCount at least 1", "/v1/videos", BEARER, {**VIDEO, "metadata": {"sampleCount": 0}}, "metadata.sampleCount"),
    # message format, endpoint 8 (2.9, 4 rule 4, 8)
    ("model 1-256 characters", "/v1/messages", MSG, {**MESSAGE, "model": "m" * 257}, "model"),
    ("max_tokens at least 1", "/v1/messages", MSG, {**MESSAGE, "max_tokens": 0}, "max_tokens"),
    (
        "max_tokens required",
        "/v1/messages",
        MSG,
        {"model": "msgmodel-sonnet-4-5", "messages": MESSAGE["messages"]},
        "max_tokens",
    ),
    ("temperature 0-1", "/v1/messages", MSG, {**MESSAGE, "temperature": 1.5}, "temperature"),
    ("top_p 0-1", "/v1/messages", MSG, {**MESSAGE, "top_p": 1.2}, "top_p"),
    ("top_k above 0", "/v1/messages", MSG, {**MESSAGE, "top_k": 0}, "top_k"),
    (
        "thinking budget at least 1024",
        "/v1/messages",
        MSG,
        {**MESSAGE, "thinking": {"type": "enabled", "budget_tokens": 1000}},
        "thinking.budget_tokens",
    ),
    (
        "thinking budget below max_tokens",
        "/v1/messages",
        MSG,
        {**MESSAGE, "thinking": {"type": "enabled", "budget_tokens": 2048}},
        "thinking.budget_tokens",
    ),
    ("thinking is an object", "/v1/messages", MSG, {**MESSAGE, "thinking": "sometimes"}, "thinking"),
    (
        "text blocks are not empty",
        "/v1/messages",
        MSG,
        {**MESSAGE, "messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
        "messages[0].content[0].text",
    ),
    (
        "tool_use block shape",
        "/v1/messages",
        MSG,
        {**MESSAGE, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x"}]}]},
        "messages[0].content[0].input",
    ),
    (
        "tool results go in user messages",
        "/v1/messages",
        MSG,
        {
            **MESSAGE,
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]},
            ],
        },
        "messages[1].content[0]",
    ),
    ("messages not empty", "/v1/messages", MSG, {**MESSAGE, "messages": []}, "messages"),
    (
        "tool name 1-64",
        "/v1/messages",
        MSG,
        {**MESSAGE, "tools": [{"name": "t" * 65, "input_schema": {}}]},
        "tools[0].name",
    ),
    ("custom tool input_schema", "/v1/messages", MSG, {**MESSAGE, "tools": [{"name": "t"}]}, "tools[0].input_schema"),
    (
        "computer tool fields",
        "/v1/messages",
        MSG,
        {**MESSAGE, "tools": [{"type": "computer_20241022", "name": "computer", "display_height_px": 768}]},
        "tools[0].display_width_px",
    ),
    (
        "tool_choice tool needs a name",
        "/v1/messages",
        MSG,
        {**MESSAGE, "tool_choice": {"type": "tool"}},
        "tool_choice.name",
    ),
    (
        "metadata.user_id at most 256",
        "/v1/messages",
        MSG,
        {**MESSAGE, "metadata": {"user_id": "u" * 257}},
        "metadata.user_id",
    ),
    ("msgapi-version required", "/v1/messages", {"x-api-key": DEMO_KEY}, MESSAGE, "msgapi-version"),
    # content-generation, endpoints 9 and 10 (2.8, 2.11, 4 rule 1, 7.3, 8)
    (
        "contents required",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {"generationConfig": {}},
        "contents",
    ),
    (
        "parts required",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {"contents": [{"role": "user"}]},
        "contents[0].parts",
    ),
    (
        "inlineData needs mimeType",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {"contents": [{"parts": [{"inlineData": {"data": "AA=="}}]}]},
        "contents[0].parts[0].inlineData.mimeType",
    ),
    (
        "snake_case spellings are checked too",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "generation_config": {"temperature": 3}},
        "generation_config.temperature",
    ),
    (
        "stopSequences at most 5",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "generationConfig": {"stopSequences": list("abcdef")}},
        "generationConfig.stopSequences",
    ),
    (
        "temperature 0-2",
        "/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse",
        {},
        {**CONTENT, "generationConfig": {"temperature": 2.5}},
        "generationConfig.temperature",
    ),
    (
        "function declarations named",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "tools": [{"functionDeclarations": [{"description": "x"}]}]},
        "tools[0].functionDeclarations[0].name",
    ),
    (
        "systemInstruction is text",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "systemInstruction": {"parts": [{"inlineData": {"mimeType": "image/png", "data": "AA=="}}]}},
        "systemInstruction.parts[0]",
    ),
    (
        "cachedContent form",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "cachedContent": "abc"},
        "cachedContent",
    ),
    (
        "image delivery only uppercase URI",
        "/v1beta/models/genmodel-2.5-flash-image:generateContent",
        {},
        {**CONTENT, "generationConfig": {"responseFormat": {"image": {"delivery": "uri"}}}},
        "generationConfig.responseFormat.image.delivery",
    ),
    (
        "image delivery never with streaming",
        "/v1beta/models/genmodel-2.5-flash-image:streamGenerateContent?alt=sse",
        {},
        {**CONTENT, "generationConfig": {"responseFormat": {"image": {"delivery": "URI"}}}},
        "generationConfig.responseFormat.image.delivery",
    ),
    (
        "responseFormat is an object",
        "/v1beta/models/genmodel-2.5-flash-image:generateContent",
        {},
        {**CONTENT, "generationConfig": {"responseFormat": "URI"}},
        "generationConfig.responseFormat",
    ),
    # response format, endpoint 11 (2.13, 8)
    ("input required", "/v1/responses", BEARER, {"model": "respmodel-4o"}, "input"),
    (
        "metadata at most 16 pairs",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "metadata": {f"k{i}": "v" for i in range(17)}},
        "metadata",
    ),
    ("metadata keys at most 64", "/v1/responses", BEARER, {**RESPONSE, "metadata": {"k" * 65: "v"}}, "metadata"),
    ("metadata values at most 512", "/v1/responses", BEARER, {**RESPONSE, "metadata": {"k": "v" * 513}}, "metadata"),
    ("temperature 0-2", "/v1/responses", BEARER, {**RESPONSE, "temperature": 2.1}, "temperature"),
    (
        "json_schema name characters",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "text": {"format": {"type": "json_schema", "name": "my schema", "schema": {}}}},
        "text.format.name",
    ),
    (
        "json_schema name at most 64",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "text": {"format": {"type": "json_schema", "name": "n" * 65, "schema": {}}}},
        "text.format.name",
    ),
    (
        "file_search max_num_results 1-50",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "tools": [{"type": "file_search", "vector_store_ids": ["v"], "max_num_results": 51}]},
        "tools[0].max_num_results",
    ),
    (
        "file_search vector stores",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "tools": [{"type": "file_search"}]},
        "tools[0].vector_store_ids",
    ),
    (
        "web search country is two letters",
        "/v1/responses",
        BEARER,
        {
            **RESPONSE,
            "tools": [{"type": "web_search_preview", "user_location": {"type": "approximate", "country": "USA"}}],
        },
        "tools[0].user_location.country",
    ),
    (
        "computer_use_preview fields",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "tools": [{"type": "computer_use_preview", "display_width": 10, "environment": "browser"}]},
        "tools[0].display_height",
    ),
    (
        "function_call_output shape",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "input": [{"type": "function_call_output", "output": "{}"}]},
        "input[0].call_id",
    ),
    (
        "tool_choice function needs a name",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "tool_choice": {"type": "function"}},
        "tool_choice.name",
    ),
    # open enumerations still take strings only (a type rule), and known shapes are checked in full
    (
        "an open enumeration takes a string",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "reasoning": {"effort": 5}},
        "reasoning.effort",
    ),
    (
        "an open list takes strings",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "safetySettings": [{"category": ["HARM_CATEGORY_JAILBREAK"], "threshold": "OFF"}]},
        "safetySettings[0].category",
    ),
    (
        "an open union's type is a string",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "tool_choice": {"type": 3}},
        "tool_choice",
    ),
    (
        "an image source names its type",
        "/v1/messages",
        MSG,
        {
            **MESSAGE,
            "messages": [{"role": "user", "content": [{"type": "image", "source": {"url": "https://x/y.png"}}]}],
        },
        "messages[0].content[0].source",
    ),
    (
        "a url image source needs its url",
        "/v1/messages",
        MSG,
        {**MESSAGE, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url"}}]}]},
        "messages[0].content[0].source.url",
    ),
    (
        "a file image source needs its file_id",
        "/v1/messages",
        MSG,
        {
            **MESSAGE,
            "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": ""}}]}],
        },
        "messages[0].content[0].source.file_id",
    ),
    (
        "quality stays closed (charges read it)",
        "/v1/images/generations",
        BEARER,
        {**IMAGE, "quality": "ultra"},
        "quality",
    ),
    (
        "service_tier stays closed (the upstream bills by it)",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "service_tier": "gold"},
        "service_tier",
    ),
]


# Values the interface's enumerations do not list, in fields open to them (proxy/schemas/enums.py):
# passed to the upstream by default, a 400 naming the field with `validation.strict_enums`.
OPEN_CASES = [
    ("output_format values", "/v1/images/generations", BEARER, {**IMAGE, "output_format": "gif"}, "output_format"),
    ("moderation values", "/v1/images/generations", BEARER, {**IMAGE, "moderation": "high"}, "moderation"),
    (
        "input_fidelity values",
        "/v1/images/edits",
        BEARER,
        {**IMAGE, "images": [{"file_id": "f"}], "input_fidelity": "exact"},
        "input_fidelity",
    ),
    (
        "aspectRatio values",
        "/v1/video/generations",
        BEARER,
        {**VIDEO, "metadata": {"aspectRatio": "4:3"}},
        "metadata.aspectRatio",
    ),
    (
        "personGeneration values",
        "/v1/videos",
        BEARER,
        {**VIDEO, "metadata": {"personGeneration": "everyone"}},
        "metadata.personGeneration",
    ),
    (
        "image media types",
        "/v1/messages",
        MSG,
        {
            **MESSAGE,
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "AA=="}}
                    ],
                },
            ],
        },
        "messages[2].content[0].source.media_type",
    ),
    (
        "tool_result content",
        "/v1/messages",
        MSG,
        {
            **MESSAGE,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "video"}]}],
                }
            ],
        },
        "messages[0].content[0].content[0]",
    ),
    (
        "roles are user or assistant",
        "/v1/messages",
        MSG,
        {**MESSAGE, "messages": [{"role": "system", "content": "a"}]},
        "messages[0].role",
    ),
    (
        "bash tool name",
        "/v1/messages",
        MSG,
        {**MESSAGE, "tools": [{"type": "bash_20241022", "name": "shell"}]},
        "tools[0].name",
    ),
    ("tool_choice forms", "/v1/messages", MSG, {**MESSAGE, "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    (
        "cache_control ephemeral",
        "/v1/messages",
        MSG,
        {
            **MESSAGE,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"type": "forever"}}]}
            ],
        },
        "messages[0].content[0].cache_control.type",
    ),
    (
        "content roles",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {"contents": [{"role": "system", "parts": [{"text": "hi"}]}]},
        "contents[0].role",
    ),
    (
        "responseMimeType values",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "generationConfig": {"responseMimeType": "text/html"}},
        "generationConfig.responseMimeType",
    ),
    (
        "responseModalities values",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "generationConfig": {"responseModalities": ["SMELL"]}},
        "generationConfig.responseModalities[0]",
    ),
    (
        "responseSchema type",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "generationConfig": {"responseSchema": {"type": "DATE"}}},
        "generationConfig.responseSchema.type",
    ),
    (
        "mediaResolution values",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "generationConfig": {"mediaResolution": "ULTRA"}},
        "generationConfig.mediaResolution",
    ),
    (
        "speech languageCode values",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "generationConfig": {"speechConfig": {"languageCode": "xx-XX"}}},
        "generationConfig.speechConfig.languageCode",
    ),
    (
        "safety categories",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "safetySettings": [{"category": "HARM_CATEGORY_RUDENESS", "threshold": "OFF"}]},
        "safetySettings[0].category",
    ),
    (
        "safety thresholds",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "SOMETIMES"}]},
        "safetySettings[0].threshold",
    ),
    (
        "function calling modes",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {**CONTENT, "toolConfig": {"functionCallingConfig": {"mode": "MAYBE"}}},
        "toolConfig.functionCallingConfig.mode",
    ),
    (
        "code execution outcome values",
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {"contents": [{"parts": [{"codeExecutionResult": {"outcome": "FINE"}}]}]},
        "contents[0].parts[0].codeExecutionResult.outcome",
    ),
    ("text format forms", "/v1/responses", BEARER, {**RESPONSE, "text": {"format": {"type": "yaml"}}}, "text.format"),
    ("include values", "/v1/responses", BEARER, {**RESPONSE, "include": ["everything"]}, "include[0]"),
    (
        "input message roles",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "input": [{"role": "robot", "content": "x"}]},
        "input[0].role",
    ),
    (
        "input_image detail values",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "input": [{"role": "user", "content": [{"type": "input_image", "detail": "max"}]}]},
        "input[0].content[0].detail",
    ),
    (
        "reasoning item summary",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "input": [{"type": "reasoning", "id": "r", "summary": [{"type": "note", "text": "x"}]}]},
        "input[0].summary[0].type",
    ),
    ("tool_choice words", "/v1/responses", BEARER, {**RESPONSE, "tool_choice": "sometimes"}, "tool_choice"),
    ("truncation values", "/v1/responses", BEARER, {**RESPONSE, "truncation": "middle"}, "truncation"),
    (
        "reasoning effort values",
        "/v1/responses",
        BEARER,
        {**RESPONSE, "reasoning": {"effort": "extreme"}},
        "reasoning.effort",
    ),
]
STRICT_ENUMS = "validation: {strict_enums: true}\n"


def query_key(path: str) -> str:
    return path + ("&" if "?" in path else "?") + f"key={DEMO_KEY}" if path.startswith("/v1beta") else path


def assert_refused(path: str, body: dict, field: str) -> None:
    if path.startswith("/v1beta"):
        error = body["error"]
        assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT"
        assert error["message"].startswith(f"{field}: "), error["message"]
    elif path == "/v1/messages":
        error = body["error"]
        assert set(error) == {"type", "message", "code"} and error["type"] == "invalid_request_error"
        assert error["message"].startswith(f"{field}: "), error["message"]
    else:
        error = body["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        assert error["param"] == field, error


@pytest.mark.parametrize(("case", "path", "headers", "body", "field"), JSON_CASES, ids=[c[0] for c in JSON_CASES])
async def test_a_broken_rule_is_a_400_naming_the_field(gateway, http, case, path, headers, body, field):
    async with http.post(gateway.url + query_key(path), json=body, headers=headers) as answer:
        got = await answer.json()
        assert answer.status == 400, (case, got)
    assert_refused(path, got, field)
    assert len(gateway.sim().requests) == 0


@pytest.mark.parametrize(("case", "path", "headers", "body", "field"), OPEN_CASES, ids=[c[0] for c in OPEN_CASES])
async def test_an_unlisted_value_of_an_open_enumeration_reaches_the_upstream_byte_identical(
    gateway, http, case, path, headers, body, field
):
    raw = orjson.dumps(body, option=orjson.OPT_INDENT_2)
    async with http.post(
        gateway.url + query_key(path), data=raw, headers={**headers, "Content-Type": "application/json"}
    ) as answer:
        assert answer.status == 200, (case, await answer.text())
        await answer.read()
    assert gateway.last_upstream_request().body == raw


@pytest.mark.parametrize(("case", "path", "headers", "body", "field"), OPEN_CASES, ids=[c[0] for c in OPEN_CASES])
async def test_strict_enums_refuse_an_unlisted_value_as_the_interface_lists_them(
    start_gateway, http, case, path, headers, body, field
):
    gw = await start_gateway(STRICT_ENUMS)
    async with http.post(gw.url + query_key(path), json=body, headers=headers) as answer:
        got = await answer.json()
        assert answer.status == 400, (case, got)
    assert_refused(path, got, field)
    assert len(gw.sim().requests) == 0


VALID = [
    (
        "/v1/video/generations",
        BEARER,
        {**VIDEO, "metadata": {"durationSeconds": 8, "aspectRatio": "16:9", "resolution": "1080p", "vendorField": 1}},
    ),
    ("/v1/videos", BEARER, VIDEO),
    (
        "/v1/images/generations",
        BEARER,
        {
            **IMAGE,
            "model": "imagegen-2.5-sunburst",
            "size": "3840x2160",
            "quality": "xhigh",
            "background": "transparent",
            "output_format": "webp",
            "n": 10,
        },
    ),
    (
        "/v1/images/generations",
        BEARER,
        {**IMAGE, "size": "3840x1280", "stream": True, "partial_images": 3, "response_format": "b64_json"},
    ),
    (
        "/v1/images/generations",
        BEARER,
        {**IMAGE, "model": "imagegen-2.5-flare-2026-09-08", "size": "1280x3840", "quality": "max"},
    ),
    (
        "/v1/images/edits",
        BEARER,
        {
            **IMAGE,
            "images": [{"image_url": f"data:image/png;base64,{PNG_B64}"}, {"file_id": "file-1"}],
            "mask": {"image_url": f"data:image/png;base64,{PNG_B64}"},
        },
    ),
    (
        "/v1/messages",
        MSG,
        {
            **MESSAGE,
            "temperature": 1.0,
            "top_p": 0.9,
            "top_k": 40,
            "system": "be brief",
            "metadata": {"user_id": "u1"},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "tools": [
                {"name": "get_weather", "input_schema": {"type": "object"}},
                {"type": "bash_20241022", "name": "bash"},
                {"type": "computer_20241022", "name": "computer", "display_width_px": 1024, "display_height_px": 768},
            ],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "s"},
                        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}]}
                    ],
                },
            ],
        },
    ),
    ("/v1/messages", MSG, {**MESSAGE, "thinking": {"type": "adaptive"}}),  # a thinking type newer than the gateway
    (
        "/v1beta/models/genmodel-2.0-flash:generateContent",
        {},
        {
            "contents": {"parts": [{"text": "hi"}]},
            "system_instruction": {"parts": [{"text": "be brief"}]},
            "generationConfig": {
                "temperature": 2.0,
                "stopSequences": list("abcde"),
                "responseMimeType": "application/json",
                "responseSchema": {"type": "OBJECT", "properties": {"a": {"type": "STRING"}}},
            },
            "safety_settings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
            "tool_config": {"function_calling_config": {"mode": "AUTO"}},
        },
    ),
    (
        "/v1beta/models/genmodel-2.5-flash-image:generateContent",
        {},
        {
            "contents": [{"parts": [{"text": "a cat"}, {"inline_data": {"mime_type": "image/png", "data": PNG_B64}}]}],
            "generationConfig": {"responseModalities": ["TEXT", "IMAGE"], "imageConfig": {"aspectRatio": "16:9"}},
        },
    ),
    (
        "/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse",
        {},
        {**CONTENT, "generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}},
    ),
    (
        "/v1/responses",
        BEARER,
        {
            **RESPONSE,
            "temperature": 2,
            "metadata": {f"k{i}": "v" * 512 for i in range(16)},
            "include": ["reasoning.encrypted_content"],
            "text": {
                "format": {"type": "json_schema", "name": "my_schema-1", "schema": {"type": "object"}, "strict": True}
            },
            "tools": [
                {"type": "file_search", "vector_store_ids": ["vs"], "max_num_results": 50},
                {"type": "function", "name": "f", "parameters": {}},
                {"type": "web_search_preview", "user_location": {"type": "approximate", "country": "US"}},
            ],
            "tool_choice": {"type": "function", "name": "f"},
            "input": [
                {"role": "developer", "content": "x"},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "hi"},
                        {"type": "input_image", "image_url": "https://x/y.png"},
                    ],
                },
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "{}"},
                {"id": "msg_1"},
            ],
        },
    ),
]


@pytest.mark.parametrize(("path", "headers", "body"), VALID, ids=[f"{i}:{v[0]}" for i, v in enumerate(VALID)])
async def test_a_valid_request_reaches_the_upstream_byte_identical(gateway, http, path, headers, body):
    raw = orjson.dumps(body, option=orjson.OPT_INDENT_2)  # formatting the gateway must not change
    async with http.post(
        gateway.url + query_key(path), data=raw, headers={**headers, "Content-Type": "application/json"}
    ) as answer:
        assert answer.status == 200, await answer.text()
        await answer.read()
    assert gateway.last_upstream_request().body == raw


def form(*parts: tuple[str, bytes | str, str | None]) -> aiohttp.FormData:
    data = aiohttp.FormData(default_to_multipart=True)
    for name, value, filename in parts:
        if filename:
            data.add_field(name, value, filename=filename, content_type="application/octet-stream")
        else:
            data.add_field(name, value)
    return data


FIELDS = (("model", "imagegen-2", None), ("prompt", "edit", None))
SMALL = png(64, 64)
MULTIPART_CASES = [
    ("at most 16 images", [*FIELDS, *[("image[]", SMALL, f"{i}.png") for i in range(17)]], "image[]"),
    ("images are PNG/WEBP/JPG", [*FIELDS, ("image", b"GIF89a" + b"\x00" * 64, "a.gif")], "image"),
    ("each image under 25 MB", [*FIELDS, ("image", SMALL + b"\x00" * (25 * 1024 * 1024), "big.png")], "image"),
    (
        "mask is PNG",
        [*FIELDS, ("image", SMALL, "a.png"), ("mask", b"\xff\xd8\xff\xe0" + b"\x00" * 64, "m.jpg")],
        "mask",
    ),
    (
        "mask under 4 MB",
        [*FIELDS, ("image", SMALL, "a.png"), ("mask", png(64, 64) + b"\x00" * (4 * 1024 * 1024), "m.png")],
        "mask",
    ),
    ("mask has the image's size", [*FIELDS, ("image", SMALL, "a.png"), ("mask", png(32, 64), "m.png")], "mask"),
    ("an image is required", [*FIELDS], "image"),
    ("form fields follow the rules", [*FIELDS, ("n", "11", None), ("image", SMALL, "a.png")], "n"),
    (
        "a count in plain digits (the budget read 1_0 as one image, the upstream made ten)",
        [*FIELDS, ("n", "1_0", None), ("image", SMALL, "a.png")],
        "n",
    ),
    ("a count in ASCII digits", [*FIELDS, ("n", "\u0661\u0660", None), ("image", SMALL, "a.png")], "n"),
    (
        "a number in plain digits",
        [*FIELDS, ("output_compression", "5e1", None), ("image", SMALL, "a.png")],
        "output_compression",
    ),
    (
        "fields after the files too",
        [("model", "imagegen-2", None), ("image", SMALL, "a.png"), ("prompt", "p", None), ("quality", "xhigh", None)],
        "quality",
    ),
]


@pytest.mark.parametrize(("case", "parts", "field"), MULTIPART_CASES, ids=[c[0] for c in MULTIPART_CASES])
async def test_multipart_edit_rules(gateway, http, case, parts, field):
    async with http.post(gateway.url + "/v1/images/edits", data=form(*parts), headers=BEARER) as answer:
        got = await answer.json()
        assert answer.status == 400, (case, got)
    assert got["error"]["param"] == field, got
    # Refused before forwarding, or cut off before the body was whole: the upstream never
    # finished reading it (it records a digest only for a body it read to the end).
    assert all(not record.body_sha256 for record in gateway.sim().requests)


async def test_a_valid_multipart_edit_with_mask_passes(gateway, http):
    parts = [
        *FIELDS,
        ("image[]", png(64, 64), "a.png"),
        ("image[]", png(64, 64), "b.png"),
        ("mask", png(64, 64), "m.png"),
        ("input_fidelity", "high", None),
    ]
    async with http.post(gateway.url + "/v1/images/edits", data=form(*parts), headers=BEARER) as answer:
        assert answer.status == 200, await answer.text()
    assert gateway.last_upstream_request().files == 3


@pytest.mark.parametrize(
    ("path", "headers", "expected"),
    [
        ("/v1/messages", MSG, {"type": "invalid_request_error"}),
        (f"/v1beta/models/genmodel-2.0-flash:generateContent?key={DEMO_KEY}", {}, {"status": "INVALID_ARGUMENT"}),
        ("/v1/responses", BEARER, {"type": "invalid_request_error", "param": "Content-Type"}),
    ],
)
async def test_a_wrong_content_type_is_a_400(gateway, http, path, headers, expected):
    async with http.post(
        gateway.url + path, data=b"model=x", headers={**headers, "Content-Type": "application/x-www-form-urlencoded"}
    ) as answer:
        assert answer.status == 400
        error = (await answer.json())["error"]
    assert expected.items() <= error.items()


@pytest.mark.parametrize(
    ("path", "headers", "expected"),
    [
        ("/v1/messages", MSG, {"type": "invalid_request_error"}),
        (f"/v1beta/models/genmodel-2.0-flash:generateContent?key={DEMO_KEY}", {}, {"status": "INVALID_ARGUMENT"}),
        ("/v1/images/generations", BEARER, {"type": "invalid_request_error"}),
    ],
)
async def test_malformed_json_is_a_400(gateway, http, path, headers, expected):
    async with http.post(
        gateway.url + path, data=b'{"model": ', headers={**headers, "Content-Type": "application/json"}
    ) as answer:
        assert answer.status == 400
        assert expected.items() <= (await answer.json())["error"].items()


async def test_an_oversized_body_is_a_413_in_the_format_shape(start_gateway, http):
    gw = await start_gateway("server: {max_json_body_mb: 0.01}")
    big = {**CONTENT, "padding": "x" * 20000}
    async with http.post(
        f"{gw.url}/v1beta/models/genmodel-2.0-flash:generateContent?key={DEMO_KEY}", json=big
    ) as answer:
        assert answer.status == 413
        assert (await answer.json())["error"]["status"] == "PAYLOAD_TOO_LARGE"
    async with http.post(gw.url + "/v1/messages", json={**MESSAGE, "padding": "x" * 20000}, headers=MSG) as answer:
        assert answer.status == 413
        assert (await answer.json())["error"]["type"] == "request_too_large"
