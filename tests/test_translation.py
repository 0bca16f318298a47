"""Translation between the four chat formats, as pure functions: recorded real-shaped answers and
streams of each format read into every other (streams cut into reads of a few bytes, so UTF-8
characters and a tool call's arguments are split), requests translated there and back keeping
what both formats express, and what cannot be translated refused by name."""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.formats import FORMATS
from proxy.formats.translation import (
    CODECS,
    Translation,
    Untranslatable,
    chat_stream,
    content_stream,
    message_stream,
    read_ask,
    response_stream,
)
from proxy.formats.translation.ir import TOOL_USE, Ask, Counts, Delta, Finish, Part, Tool, Turn
from proxy.wire.sse import SSEParser

NAMES = ("messages", "content", "responses", "chat")
SSE = (("alt", "sse"),)  # the query a content-generation stream is asked with
PAIRS = [(a, b) for a, b in itertools.permutations(NAMES, 2)]


def _sse(*events: tuple[str | None, dict[str, Any] | str]) -> bytes:
    out = b""
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
        out += f"{head}data: {body}\n\n".encode()
    return out


# -- each format's stream of one answer: thinking, text with multi-byte characters, a tool call
#    whose arguments come in two pieces, the stop, and usage with cached and reasoning parts --

CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x"}
STREAMS = {
    "messages": _sse(
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_01",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-x",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 25,
                        "cache_read_input_tokens": 10,
                        "cache_creation_input_tokens": 0,
                        "output_tokens": 1,
                    },
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "Let me think"},
            },
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig=="}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        ),
        ("ping", {"type": "ping"}),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Héllo 😀"}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": " wörld"}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 2,
                "content_block": {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {}},
            },
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 2,
                "delta": {"type": "input_json_delta", "partial_json": '{"city": "Pa'},
            },
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": 'rís"}'}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 2}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 42},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ),
    "chat": _sse(
        (
            None,
            {**CHUNK, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        ),
        (
            None,
            {**CHUNK, "choices": [{"index": 0, "delta": {"reasoning_content": "Let me think"}, "finish_reason": None}]},
        ),
        (None, {**CHUNK, "choices": [{"index": 0, "delta": {"content": "Héllo 😀"}, "finish_reason": None}]}),
        (None, {**CHUNK, "choices": [{"index": 0, "delta": {"content": " wörld"}, "finish_reason": None}]}),
        (
            None,
            {
                **CHUNK,
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": "call_01",
                                    "type": "function",
                                    "function": {"name": "get_weather", "arguments": ""},
                                }
                            ]
                        },
                        "finish_reason": None,
                    }
                ],
            },
        ),
        (
            None,
            {
                **CHUNK,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Pa'}}]},
                        "finish_reason": None,
                    }
                ],
            },
        ),
        (
            None,
            {
                **CHUNK,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'rís"}'}}]},
                        "finish_reason": None,
                    }
                ],
            },
        ),
        (None, {**CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        (
            None,
            {
                **CHUNK,
                "choices": [],
                "usage": {
                    "prompt_tokens": 35,
                    "completion_tokens": 42,
                    "total_tokens": 77,
                    "prompt_tokens_details": {"cached_tokens": 10},
                    "completion_tokens_details": {"reasoning_tokens": 5},
                },
            },
        ),
        (None, "[DONE]"),
    ),
    "content": _sse(
        (
            None,
            {
                "candidates": [
                    {"content": {"parts": [{"text": "Let me think", "thought": True}], "role": "model"}, "index": 0}
                ],
                "usageMetadata": {"promptTokenCount": 35, "totalTokenCount": 35},
                "modelVersion": "gemini-x",
                "responseId": "r1",
            },
        ),
        (
            None,
            {
                "candidates": [{"content": {"parts": [{"text": "Héllo 😀"}], "role": "model"}, "index": 0}],
                "modelVersion": "gemini-x",
                "responseId": "r1",
            },
        ),
        (
            None,
            {
                "candidates": [{"content": {"parts": [{"text": " wörld"}], "role": "model"}, "index": 0}],
                "modelVersion": "gemini-x",
                "responseId": "r1",
            },
        ),
        (
            None,
            {
                "candidates": [
                    {
                        "content": {
                            "parts": [
                                {
                                    "functionCall": {"name": "get_weather", "args": {"city": "París"}},
                                    "thoughtSignature": "c2ln",
                                }
                            ],
                            "role": "model",
                        },
                        "finishReason": "STOP",
                        "index": 0,
                    }
                ],
                "usageMetadata": {
                    "promptTokenCount": 35,
                    "candidatesTokenCount": 37,
                    "totalTokenCount": 82,
                    "cachedContentTokenCount": 10,
                    "thoughtsTokenCount": 5,
                },
                "modelVersion": "gemini-x",
                "responseId": "r1",
            },
        ),
    ),
    "responses": _sse(
        (
            "response.created",
            {
                "type": "response.created",
                "sequence_number": 0,
                "response": {
                    "id": "resp_1",
                    "object": "response",
                    "status": "in_progress",
                    "model": "gpt-x",
                    "output": [],
                },
            },
        ),
        (
            "response.output_item.added",
            {
                "type": "response.output_item.added",
                "sequence_number": 1,
                "output_index": 0,
                "item": {"type": "reasoning", "id": "rs_1", "summary": []},
            },
        ),
        (
            "response.reasoning_summary_text.delta",
            {
                "type": "response.reasoning_summary_text.delta",
                "sequence_number": 2,
                "item_id": "rs_1",
                "output_index": 0,
                "summary_index": 0,
                "delta": "Let me think",
            },
        ),
        (
            "response.output_item.added",
            {
                "type": "response.output_item.added",
                "sequence_number": 3,
                "output_index": 1,
                "item": {"type": "message", "id": "msg_1", "status": "in_progress", "role": "assistant", "content": []},
            },
        ),
        (
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "sequence_number": 4,
                "item_id": "msg_1",
                "output_index": 1,
                "content_index": 0,
                "delta": "Héllo 😀",
            },
        ),
        (
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "sequence_number": 5,
                "item_id": "msg_1",
                "output_index": 1,
                "content_index": 0,
                "delta": " wörld",
            },
        ),
        (
            "response.output_item.added",
            {
                "type": "response.output_item.added",
                "sequence_number": 6,
                "output_index": 2,
                "item": {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "call_01",
                    "name": "get_weather",
                    "arguments": "",
                },
            },
        ),
        (
            "response.function_call_arguments.delta",
            {
                "type": "response.function_call_arguments.delta",
                "sequence_number": 7,
                "item_id": "fc_1",
                "output_index": 2,
                "delta": '{"city": "Pa',
            },
        ),
        (
            "response.function_call_arguments.delta",
            {
                "type": "response.function_call_arguments.delta",
                "sequence_number": 8,
                "item_id": "fc_1",
                "output_index": 2,
                "delta": 'rís"}',
            },
        ),
        (
            "response.completed",
            {
                "type": "response.completed",
                "sequence_number": 9,
                "response": {
                    "id": "resp_1",
                    "object": "response",
                    "status": "completed",
                    "model": "gpt-x",
                    "output": [
                        {
                            "type": "function_call",
                            "id": "fc_1",
                            "call_id": "call_01",
                            "name": "get_weather",
                            "arguments": '{"city": "París"}',
                            "status": "completed",
                        }
                    ],
                    "usage": {
                        "input_tokens": 35,
                        "input_tokens_details": {"cached_tokens": 10},
                        "output_tokens": 42,
                        "output_tokens_details": {"reasoning_tokens": 5},
                        "total_tokens": 77,
                    },
                },
            },
        ),
    ),
}


def _ask(client: str, stream: bool = True) -> Ask:
    return Ask(model="the-model", turns=[Turn("user", [Part("text", "Weather?")])], stream=stream)


def _read_back(client: str, events: list[Any]) -> dict[str, Any]:
    """What a client of `client`'s format reads from its stream (with that format's own reader)."""
    reader = CODECS[client].reader()
    pieces = [p for e in events for p in reader.feed(e)] + reader.end()
    text = "".join(p.text for p in pieces if isinstance(p, Delta) and p.kind == "text")
    thinking = "".join(p.text for p in pieces if isinstance(p, Delta) and p.kind == "thinking")
    calls = [p for p in pieces if isinstance(p, Delta) and p.opens]
    arguments = "".join(p.text for p in pieces if isinstance(p, Delta) and p.kind == "tool_call" and not p.opens)
    finish = [p for p in pieces if isinstance(p, Finish)]
    return {"text": text, "thinking": thinking, "calls": calls, "arguments": arguments, "finish": finish}


def _translated_stream(upstream: str, client: str, read_size: int) -> list[Any]:
    translation = Translation(FORMATS[client], FORMATS[upstream], _ask(client), "the-model").stream()
    parser = SSEParser(1 << 20)
    data = STREAMS[upstream]
    out = []
    for start in range(0, len(data), read_size):  # reads of a few bytes: characters split between them
        out += translation.feed(parser.feed(data[start : start + read_size]))
    last, _ = parser.flush()
    return out + translation.feed(last) + translation.end()


@pytest.mark.parametrize(("upstream", "client"), PAIRS)
@pytest.mark.parametrize("read_size", [3, 7, 4096])
def test_a_stream_of_each_format_reaches_a_client_of_every_other(upstream, client, read_size):
    read = _read_back(client, _translated_stream(upstream, client, read_size))
    assert read["text"] == "Héllo 😀 wörld"
    assert read["thinking"] == "Let me think"
    assert [c.name for c in read["calls"]] == ["get_weather"] and read["calls"][0].call_id
    assert json.loads(read["arguments"]) == {"city": "París"}
    [finish] = read["finish"]
    assert finish.stop == TOOL_USE
    counts = finish.counts
    assert (counts.input, counts.output, counts.cache_read) == (35, 42, 10)


@pytest.mark.parametrize(("upstream", "client"), PAIRS)
def test_the_client_sees_the_first_text_as_soon_as_the_upstream_sends_it(upstream, client):
    """No buffering: the event carrying the first text makes the client's first text event."""
    translation = Translation(FORMATS[client], FORMATS[upstream], _ask(client), "the-model").stream()
    events = SSEParser(1 << 20).feed(STREAMS[upstream])
    reader = CODECS[client].reader()
    for event in events:
        out = translation.feed([event])
        if b"H\xc3\xa9llo" in event.raw:
            pieces = [p for e in out for p in reader.feed(e)]
            assert any(isinstance(p, Delta) and p.text == "Héllo 😀" for p in pieces)
            return
        for e in out:
            reader.feed(e)
    raise AssertionError("no text event")


def test_a_stream_that_ends_without_finishing_ends_with_the_clients_error_event():
    translation = Translation(FORMATS["chat"], FORMATS["messages"], _ask("chat"), "m").stream()
    cut = STREAMS["messages"].split(b"event: message_delta")[0]
    out = translation.feed(SSEParser(1 << 20).feed(cut)) + translation.end()
    assert b'"error"' in out[-1].raw and b"before its answer finished" in out[-1].raw


# -- whole answers --

ANSWERS = {
    "messages": {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [
            {"type": "thinking", "thinking": "Let me think", "signature": "sig=="},
            {"type": "text", "text": "Héllo 😀 wörld"},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "París"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 25,
            "cache_read_input_tokens": 10,
            "cache_creation_input_tokens": 0,
            "output_tokens": 42,
        },
    },
    "chat": {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-x",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Héllo 😀 wörld",
                    "reasoning_content": "Let me think",
                    "tool_calls": [
                        {
                            "id": "call_01",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "París"}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 35,
            "completion_tokens": 42,
            "total_tokens": 77,
            "prompt_tokens_details": {"cached_tokens": 10},
            "completion_tokens_details": {"reasoning_tokens": 5},
        },
    },
    "content": {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "Let me think", "thought": True},
                        {"text": "Héllo 😀 wörld"},
                        {"functionCall": {"name": "get_weather", "args": {"city": "París"}}},
                    ],
                },
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 35,
            "candidatesTokenCount": 37,
            "thoughtsTokenCount": 5,
            "cachedContentTokenCount": 10,
            "totalTokenCount": 77,
        },
        "modelVersion": "gemini-x",
        "responseId": "r1",
    },
    "responses": {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "model": "gpt-x",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Let me think"}]},
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Héllo 😀 wörld", "annotations": []}],
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_01",
                "name": "get_weather",
                "arguments": '{"city": "París"}',
                "status": "completed",
            },
        ],
        "usage": {
            "input_tokens": 35,
            "input_tokens_details": {"cached_tokens": 10},
            "output_tokens": 42,
            "output_tokens_details": {"reasoning_tokens": 5},
            "total_tokens": 77,
        },
    },
}


@pytest.mark.parametrize(("upstream", "client"), PAIRS)
def test_an_answer_of_each_format_reaches_a_client_of_every_other(upstream, client):
    translation = Translation(FORMATS[client], FORMATS[upstream], _ask(client, stream=False), "the-model")
    status, body = translation.answer(200, json.dumps(ANSWERS[upstream]).encode())
    assert status == 200
    reply = CODECS[client].read_reply(body)
    assert "".join(p.text for p in reply.parts if p.kind == "text") == "Héllo 😀 wörld"
    assert "".join(p.text for p in reply.parts if p.kind == "thinking") == "Let me think"
    [call] = [p for p in reply.parts if p.kind == "tool_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "París"} and call.call_id
    assert reply.stop == TOOL_USE
    assert (reply.counts.input, reply.counts.output, reply.counts.cache_read) == (35, 42, 10)
    # and the format's own usage reading (what the gateway charges by) agrees
    usage = FORMATS[client].usage_from_body(body)
    assert (usage.input_tokens, usage.output_tokens) == (35, 42)


@pytest.mark.parametrize(("upstream", "client"), PAIRS)
def test_an_upstream_error_reaches_the_client_in_its_shape_and_status(upstream, client):
    errors = {
        "messages": {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
        "chat": {"error": {"message": "slow down", "type": "rate_limit_exceeded", "code": None}},
        "responses": {"error": {"message": "slow down", "type": "rate_limit_exceeded", "code": None}},
        "content": {"error": {"code": 429, "message": "slow down", "status": "RESOURCE_EXHAUSTED"}},
    }
    translation = Translation(FORMATS[client], FORMATS[upstream], _ask(client, stream=False), "m")
    status, body = translation.answer(429, json.dumps(errors[upstream]).encode())
    assert status == 429
    assert body == FORMATS[client].error_payload(429, "slow down", body_code(client, body))


def body_code(client: str, body: dict[str, Any]) -> str | None:
    """The code the client's error payload carries (each format puts it elsewhere)."""
    error = body["error"]
    if client == "content":
        details = error.get("details")
        return details[0]["reason"] if details else None
    return error.get("code")


# -- requests: there and back --

_TEXT = st.text(alphabet=st.sampled_from("abc xyzé😀ß,.!"), min_size=1, max_size=12).filter(
    lambda t: t.strip() and not t.startswith("{")
)
_NAME = st.text(alphabet=st.sampled_from("abcdefgh_"), min_size=1, max_size=8)


@st.composite
def conversations(draw: Any) -> Ask:
    """A conversation in the words all four formats share: a system prompt, turns of text,
    tool calls with JSON object arguments and their results, tools, a limit and a temperature."""
    tools = [
        Tool(name, draw(_TEXT), {"type": "object", "properties": {"x": {"type": "string"}}})
        for name in draw(st.lists(_NAME, min_size=1, max_size=3, unique=True))
    ]
    turns = [Turn("user", [Part("text", draw(_TEXT))])]
    for n in range(draw(st.integers(0, 3))):
        calls = [
            Part(
                "tool_call",
                call_id=f"call_{n}_{i}",
                name=draw(st.sampled_from([t.name for t in tools])),
                arguments=json.dumps({"x": draw(_TEXT)}),
            )
            for i in range(draw(st.integers(0, 2)))
        ]
        texts = [Part("text", draw(_TEXT))] if draw(st.booleans()) or not calls else []
        turns.append(Turn("assistant", texts + calls))
        results = [
            Part("tool_result", call_id=c.call_id, name=c.name, content=[Part("text", draw(_TEXT))]) for c in calls
        ]
        turns.append(Turn("user", results + [Part("text", draw(_TEXT))]))
    choice = draw(st.sampled_from([None, "auto", "none", "required", "named"]))
    return Ask(
        model="m",
        turns=turns,
        system=[Part("text", draw(_TEXT))],
        max_output=draw(st.integers(1, 100_000)),
        temperature=draw(st.sampled_from([None, 0.0, 0.5, 1.0])),
        tools=tools,
        tool_choice=choice,
        tool_named=tools[0].name if choice == "named" else None,
        stream=draw(st.booleans()),
    )


def _kept(ask: Ask) -> Any:
    """What every format expresses of a request: adjacent texts joined, arguments as values."""
    turns = []
    for turn in ask.turns:
        parts: list[Any] = []
        for p in turn.parts:
            if p.kind == "text" and parts and parts[-1][0] == "text":
                parts[-1] = ("text", parts[-1][1] + p.text)
            elif p.kind == "text":
                parts.append(("text", p.text))
            elif p.kind == "tool_call":
                parts.append(("call", p.call_id, p.name, json.loads(p.arguments)))
            elif p.kind == "tool_result":
                parts.append(("result", p.call_id, "".join(c.text for c in p.content or [])))
        turns.append((turn.role, parts))
    tools = [(t.name, t.description, t.parameters) for t in ask.tools]
    choice = (ask.tool_choice, ask.tool_named)
    return ("".join(p.text for p in ask.system), turns, tools, ask.max_output, ask.temperature, choice, ask.stream)


@pytest.mark.parametrize(("a", "b"), PAIRS)
@settings(max_examples=40, deadline=None)
@given(ask=conversations())
def test_a_request_translated_there_and_back_keeps_what_both_formats_express(a, b, ask):
    client = read_ask(
        FORMATS[a], json.loads(Translation(FORMATS["chat"], FORMATS[a], ask, "m").body), "m", ask.stream, SSE
    )
    there = Translation(FORMATS[a], FORMATS[b], client, "m")
    back = read_ask(FORMATS[b], json.loads(there.body), "m", ask.stream, SSE)
    again = read_ask(FORMATS[a], json.loads(Translation(FORMATS[b], FORMATS[a], back, "m").body), "m", ask.stream, SSE)
    assert _kept(again) == _kept(client) == _kept(ask)


# -- what cannot be translated is refused by name --


@pytest.mark.parametrize(
    ("client", "upstream", "body", "param"),
    [
        ("chat", "messages", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        (
            "chat",
            "messages",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True},
            "logprobs",
        ),
        ("chat", "messages", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 7}, "seed"),
        ("chat", "responses", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["x"]}, "stop"),
        (
            "chat",
            "content",
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}],
                    }
                ],
            },
            "messages[0].content[0].type",
        ),
        (
            "messages",
            "chat",
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "top_k": 5},
            "top_k",
        ),
        (
            "messages",
            "chat",
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
            },
            "messages[0].content[0].type",
        ),
        (
            "messages",
            "chat",
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "tools[0].type",
        ),
        ("responses", "chat", {"model": "m", "input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ("responses", "chat", {"model": "m", "input": "hi", "background": True}, "background"),
        ("responses", "chat", {"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            "content",
            "chat",
            {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "cachedContent": "c/1"},
            "cachedContent",
        ),
        (
            "content",
            "chat",
            {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"candidateCount": 2}},
            "generationConfig.candidateCount",
        ),
        (
            "content",
            "messages",
            {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "tools": [{"googleSearch": {}}]},
            "tools[0]",
        ),
    ],
)
def test_what_the_upstreams_format_cannot_carry_is_refused_by_name(client, upstream, body, param):
    with pytest.raises(Untranslatable) as refused:
        ask = read_ask(FORMATS[client], body, "m", False)
        Translation(FORMATS[client], FORMATS[upstream], ask, "m")
    assert refused.value.param == param


def test_what_is_left_out_is_named():
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}
        ],
        "metadata": {"a": "b"},
    }
    translation = Translation(FORMATS["chat"], FORMATS["content"], read_ask(FORMATS["chat"], body, "m", False), "m")
    assert translation.response_headers()["X-Translation-Dropped"] == "metadata, cache_control"


def test_a_cache_hint_goes_where_the_upstream_has_one():
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "long", "cache_control": {"type": "ephemeral"}}]},
            {"role": "user", "content": "hi"},
        ],
    }
    sent = json.loads(
        Translation(FORMATS["chat"], FORMATS["messages"], read_ask(FORMATS["chat"], body, "m", False), "m").body
    )
    assert sent["system"] == [{"type": "text", "text": "long", "cache_control": {"type": "ephemeral"}}]


def test_tool_ids_stay_the_same_across_turns_with_a_content_upstream():
    """The content format's calls carry no id of their own: the id a client was given for a call
    comes back with its result, and the result goes upstream under the call's tool name."""
    answer = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}],
                },
                "finishReason": "STOP",
            }
        ]
    }
    translation = Translation(FORMATS["chat"], FORMATS["content"], _ask("chat", stream=False), "m")
    call = translation.answer(200, json.dumps(answer).encode())[1]["choices"][0]["message"]["tool_calls"][0]
    follow_up = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
        ],
    }
    sent = json.loads(
        Translation(FORMATS["chat"], FORMATS["content"], read_ask(FORMATS["chat"], follow_up, "m", False), "m").body
    )
    response = sent["contents"][2]["parts"][0]["functionResponse"]
    assert response == {"id": call["id"], "name": "get_weather", "response": {"result": "sunny"}}


def test_thinking_reaches_a_message_upstream_only_where_it_signed_it():
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yes", "reasoning_content": "hmm"},
            {"role": "user", "content": "go"},
        ],
    }
    translation = Translation(FORMATS["chat"], FORMATS["messages"], read_ask(FORMATS["chat"], body, "m", False), "m")
    assert json.loads(translation.body)["messages"][1]["content"] == [{"type": "text", "text": "yes"}]
    assert translation.response_headers()["X-Translation-Dropped"] == "thinking"


def test_a_thinking_budget_and_an_effort_map_both_ways():
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "reasoning_effort": "low",
        "max_completion_tokens": 4000,
    }
    sent = json.loads(
        Translation(FORMATS["chat"], FORMATS["messages"], read_ask(FORMATS["chat"], chat, "m", False), "m").body
    )
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 1024} and sent["max_tokens"] == 4000
    message = {
        "model": "m",
        "max_tokens": 9000,
        "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 8000},
    }
    sent = json.loads(
        Translation(
            FORMATS["messages"], FORMATS["responses"], read_ask(FORMATS["messages"], message, "m", False), "m"
        ).body
    )
    assert sent["reasoning"]["effort"] == "medium"


def test_a_request_naming_no_limit_gets_the_limit_it_was_charged_for_at_a_message_upstream():
    from proxy.request.charges import DEFAULT_OUTPUT_TOKENS

    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    sent = json.loads(
        Translation(FORMATS["chat"], FORMATS["messages"], read_ask(FORMATS["chat"], chat, "m", False), "m").body
    )
    assert sent["max_tokens"] == DEFAULT_OUTPUT_TOKENS


def test_counts_keep_their_cached_and_reasoning_parts():
    counts = Counts(input=100, output=50, cache_read=30, cache_write=20, reasoning=10)
    for name, module in (
        ("messages", message_stream),
        ("content", content_stream),
        ("responses", response_stream),
        ("chat", chat_stream),
    ):
        back = module.counts_of(module.usage_of(counts))
        assert (back.input, back.output) == (100, 50), name
        assert back.cache_read == 30, name
        if name in ("chat", "content", "responses"):
            assert back.reasoning == 10, name


# -- an upstream's answer is input like any other --

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.sampled_from(["", "x", "STOP", "tool_use", "message_start", "response.completed", "text_delta"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "choices",
                    "delta",
                    "candidates",
                    "content",
                    "parts",
                    "message",
                    "usage",
                    "output",
                    "item",
                    "index",
                    "tool_calls",
                    "function",
                    "functionCall",
                    "text",
                    "id",
                    "response",
                    "finish_reason",
                    "error",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@pytest.mark.parametrize(("upstream", "client"), PAIRS)
@settings(max_examples=60, deadline=None)
@given(value=_JSON)
def test_a_misshapen_upstream_answer_or_event_is_a_502_or_an_error_event_never_a_crash(upstream, client, value):
    translation = Translation(FORMATS[client], FORMATS[upstream], _ask(client), "m")
    status, body = translation.answer(200, json.dumps(value).encode())
    assert status in (200, 502) and isinstance(body, dict)
    stream = translation.stream()
    name = value.get("type") if isinstance(value, dict) and isinstance(value.get("type"), str) else None
    events = SSEParser(1 << 20).feed(_sse((name, value)))
    for event in stream.feed(events) + stream.end():
        assert event.raw.endswith(b"\n\n")


def test_a_content_stream_asked_without_alt_sse_is_refused_by_name():
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    with pytest.raises(Untranslatable) as refused:
        read_ask(FORMATS["content"], body, "m", True, ())
    assert refused.value.param == "alt"
    assert read_ask(FORMATS["content"], body, "m", True, SSE).stream


# -- what SDKs send that is no field of another format, and what the review found --


def _sent(client: str, upstream: str, body: dict[str, Any], stream: bool = False) -> tuple[dict[str, Any], Translation]:
    translation = Translation(
        FORMATS[client], FORMATS[upstream], read_ask(FORMATS[client], body, "m", stream, SSE), "m"
    )
    return json.loads(translation.body), translation


def test_what_an_sdk_sends_every_time_asks_nothing_and_passes():
    body = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "generationConfig": {"responseModalities": ["TEXT"], "topK": 5.0},
    }
    sent, _ = _sent("content", "messages", body)  # pydantic-ai's GoogleModel; google-genai's float topK
    assert sent["top_k"] == 5
    with pytest.raises(Untranslatable) as refused:
        _sent("content", "messages", {**body, "generationConfig": {"responseModalities": ["IMAGE"]}})
    assert refused.value.param == "generationConfig.responseModalities"


def test_a_schema_in_the_content_formats_dialect_reaches_the_others_as_json_schema():
    schema = {
        "type": "OBJECT",
        "properties": {
            "city": {"type": "STRING", "nullable": True},
            "days": {"type": "ARRAY", "items": {"type": "INTEGER"}},
        },
        "required": ["city"],
        "propertyOrdering": ["city", "days"],
    }
    body = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "generationConfig": {"responseMimeType": "application/json", "responseSchema": schema},
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": schema}]}],
    }
    expected = {
        "type": "object",
        "properties": {"city": {"type": ["string", "null"]}, "days": {"type": "array", "items": {"type": "integer"}}},
        "required": ["city"],
    }
    sent, _ = _sent("content", "chat", body)
    assert sent["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": expected}}
    assert sent["tools"][0]["function"]["parameters"] == expected
    sent, _ = _sent("content", "responses", body)
    assert sent["text"]["format"]["strict"] is False  # strict only where the client asked it


def test_a_function_call_goes_to_a_content_upstream_with_its_signature_or_the_formats_word_for_none():
    from proxy.formats.translation.content import UNSIGNED

    answer = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [{"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "c2ln"}],
                },
                "finishReason": "STOP",
            }
        ]
    }
    reply = CODECS["content"].read_reply(answer)
    assert reply.parts[0].signature == "content.c2ln"  # (the records name who made it)
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
    }
    sent, _ = _sent("chat", "content", body)
    assert sent["contents"][1]["parts"][0]["thoughtSignature"] == UNSIGNED


@pytest.mark.parametrize("upstream", NAMES)
def test_a_success_of_no_shape_of_its_format_is_a_502_not_an_empty_answer(upstream):
    client = "chat" if upstream != "chat" else "messages"
    status, body = Translation(FORMATS[client], FORMATS[upstream], _ask(client, stream=False), "m").answer(
        200, b'{"hello": "world"}'
    )
    assert status == 502 and body == FORMATS[client].error_payload(
        502, "the upstream's answer could not be read to be translated", body_code(client, body)
    )


def test_a_refused_prompt_is_a_filtered_answer_whole_and_streamed():
    blocked = {
        "promptFeedback": {"blockReason": "SAFETY"},
        "usageMetadata": {"promptTokenCount": 4, "totalTokenCount": 4},
    }
    translation = Translation(FORMATS["chat"], FORMATS["content"], _ask("chat", stream=False), "m")
    status, body = translation.answer(200, json.dumps(blocked).encode())
    assert status == 200 and body["choices"][0]["finish_reason"] == "content_filter"
    stream = Translation(FORMATS["messages"], FORMATS["content"], _ask("messages"), "m").stream()
    events = stream.feed(SSEParser(1 << 20).feed(_sse((None, blocked)))) + stream.end()
    assert b'"stop_reason":"refusal"' in b"".join(e.raw for e in events)


def test_thinking_at_a_message_upstream_leaves_out_what_the_format_refuses_beside_it():
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "reasoning_effort": "low",
        "temperature": 0.5,
        "top_p": 0.5,
        "max_completion_tokens": 4000,
    }
    sent, translation = _sent("chat", "messages", body)
    assert sent["thinking"]["budget_tokens"] == 1024 and "temperature" not in sent and "top_p" not in sent
    assert translation.response_headers()["X-Translation-Dropped"] == "temperature, top_p"
    forced = {**body, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}
    sent, translation = _sent("chat", "messages", forced)
    assert "thinking" not in sent and sent["temperature"] == 0.5 and sent["tool_choice"] == {"type": "any"}
    assert "thinking" in translation.response_headers()["X-Translation-Dropped"]
    small = {**body, "max_completion_tokens": 500}
    assert "thinking" in _sent("chat", "messages", small)[1].dropped


def test_what_a_chat_request_says_that_no_other_format_does_is_named_or_refused():
    with pytest.raises(Untranslatable) as refused:
        _sent(
            "chat",
            "messages",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "web_search_options": {}},
        )
    assert refused.value.param == "web_search_options"
    body = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "high"}}],
                "name": "ann",
            },
            {"role": "system", "content": "later"},
        ],
    }
    _, translation = _sent("chat", "messages", body)
    assert translation.dropped == [
        "messages[0].name",
        "messages[0].content[0].image_url.detail",
        "messages[1] (its place: moved first)",
    ]


def test_another_formats_tool_ids_reach_a_message_upstream_in_its_alphabet():
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "functions.f:0", "content": "ok"},
        ],
    }
    sent, _ = _sent("chat", "messages", body)
    assert (
        sent["messages"][1]["content"][0]["id"] == sent["messages"][2]["content"][0]["tool_use_id"] == "functions_f_0"
    )


def test_a_translated_response_has_one_id_whole_and_streamed():
    translation = Translation(FORMATS["responses"], FORMATS["messages"], _ask("responses", stream=False), "m")
    assert translation.answer(200, json.dumps(ANSWERS["messages"]).encode())[1]["id"] == "resp_msg_01"
    events = _translated_stream("messages", "responses", 4096)
    assert b'"id":"resp_msg_01"' in events[0].raw


def test_a_signature_goes_back_only_to_an_upstream_of_the_format_that_made_it():
    """Thinking a content upstream signed reaches a message client with a signature naming its
    format (as Base64, which every format's client takes a signature to be); sent back, it goes to a content upstream as it was made, and to a message upstream
    not at all (that upstream would refuse another's signature)."""
    answer = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [{"text": "hmm", "thought": True, "thoughtSignature": "c2ln"}, {"text": "yes"}],
                },
                "finishReason": "STOP",
            }
        ]
    }
    translation = Translation(FORMATS["messages"], FORMATS["content"], _ask("messages", stream=False), "m")
    thinking = translation.answer(200, json.dumps(answer).encode())[1]["content"][0]
    assert (
        thinking["thinking"] == "hmm" and base64.b64decode(thinking["signature"]) == b"modelgate-signature:content.c2ln"
    )
    body = {
        "model": "m",
        "max_tokens": 50,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [thinking, {"type": "text", "text": "yes"}]},
            {"role": "user", "content": "go"},
        ],
    }
    sent, _ = _sent("messages", "content", body)
    assert sent["contents"][1]["parts"][0] == {"text": "hmm", "thought": True, "thoughtSignature": "c2ln"}
    sent, translation = _sent("messages", "chat", body)
    assert "thinking" in translation.dropped
    own = {
        **body,
        "messages": [
            body["messages"][0],
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "YW50"}]},
            body["messages"][2],
        ],
    }
    sent, translation = _sent("messages", "content", own)  # the message format's own signature: not content's
    assert sent["contents"][1:] == [{"role": "user", "parts": [{"text": "go"}]}] and "thinking" in translation.dropped


# -- what the hostile review found --


def test_results_without_ids_answer_their_tools_oldest_unanswered_calls():
    calls = [
        {"functionCall": {"name": "f", "args": {}}},
        {"functionCall": {"name": "f", "id": "own", "args": {}}},
        {"functionCall": {"name": "f", "args": {}}},
    ]
    results = [
        {"functionResponse": {"name": "f", "id": "own", "response": {"result": "b"}}},
        {"functionResponse": {"name": "f", "response": {"result": "a"}}},
        {"functionResponse": {"name": "f", "response": {"result": "c"}}},
    ]
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "go"}]},
            {"role": "model", "parts": calls},
            {"role": "user", "parts": results},
        ]
    }
    ask = read_ask(FORMATS["content"], body, "m", False)
    made = [p.call_id for p in ask.turns[1].parts]
    answered = {p.content[0].text: p.call_id for p in ask.turns[2].parts}
    assert answered == {"b": "own", "a": made[0], "c": made[2]} and len(set(made)) == 3


def test_a_stream_or_answer_that_says_no_counts_books_none_for_an_estimate():
    translation = Translation(FORMATS["messages"], FORMATS["chat"], _ask("messages"), "m")
    stream = translation.stream()
    events = (
        stream.feed(
            SSEParser(1 << 20).feed(
                _sse(
                    (None, {**CHUNK, "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}),
                    (None, "[DONE]"),
                )
            )
        )
        + stream.end()
    )
    assert b'"message_stop"' in events[-1].raw  # the client's format has numbers where none were said
    usage = stream.usage()
    assert (usage.input_tokens, usage.output_tokens, usage.final) == (None, None, False)
    whole = Translation(FORMATS["messages"], FORMATS["chat"], _ask("messages", stream=False), "m")
    whole.answer(
        200,
        json.dumps(
            {"id": "c", "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}]}
        ).encode(),
    )
    assert not whole.usage().final and whole.usage().input_tokens is None
    assert _translation_counts("chat", ANSWERS["chat"]) == (35, 42, True)


def _translation_counts(upstream: str, answer: dict[str, Any]) -> tuple[Any, Any, bool]:
    client = "messages" if upstream != "messages" else "chat"
    translation = Translation(FORMATS[client], FORMATS[upstream], _ask(client, stream=False), "m")
    translation.answer(200, json.dumps(answer).encode())
    usage = translation.usage()
    return usage.input_tokens, usage.output_tokens, usage.final


def test_a_chat_channel_that_takes_no_stream_options_is_not_sent_them():
    ask = _ask("messages")
    assert "stream_options" in json.loads(Translation(FORMATS["messages"], FORMATS["chat"], ask, "m").body)
    assert "stream_options" not in json.loads(
        Translation(FORMATS["messages"], FORMATS["chat"], ask, "m", stream_usage=False).body
    )


@pytest.mark.parametrize(("upstream", "client"), PAIRS)
def test_the_channels_credential_is_taken_out_of_a_translated_stream_error(upstream, client):
    errors = {
        "messages": (
            "error",
            {"type": "error", "error": {"type": "overloaded_error", "message": "key sk-up-secret overloaded"}},
        ),
        "chat": (None, {"error": {"message": "key sk-up-secret overloaded", "type": "server_error"}}),
        "responses": ("error", {"type": "error", "code": "server_error", "message": "key sk-up-secret overloaded"}),
        "content": (None, {"error": {"code": 503, "message": "key sk-up-secret overloaded", "status": "UNAVAILABLE"}}),
    }
    redact = lambda text: text.replace("sk-up-secret", "[redacted]")  # noqa: E731
    stream = Translation(FORMATS[client], FORMATS[upstream], _ask(client), "m", redact=redact).stream()
    out = b"".join(e.raw for e in stream.feed(SSEParser(1 << 20).feed(_sse(errors[upstream]))))
    assert b"sk-up-secret" not in out and b"[redacted] overloaded" in out and stream.fault is not None


def test_an_upstreams_delta_of_another_kind_than_its_block_opens_a_block_of_that_kind():
    opening = [
        ("message_start", {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 1}}}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a"}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "b"}},
        ),
    ]
    closing = [
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    orphan = (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
    )
    for client in ("responses", "chat", "content"):
        stream = Translation(FORMATS[client], FORMATS["messages"], _ask(client), "m").stream()
        out = stream.feed(SSEParser(1 << 20).feed(_sse(*opening, *closing))) + stream.end()
        assert stream.fault is None and out, client
        # A call's arguments with no call open (interleaved with another's, or never opened) make
        # no whole call in any format: the stream ends with the client's error event.
        stream = Translation(FORMATS[client], FORMATS["messages"], _ask(client), "m").stream()
        out = stream.feed(SSEParser(1 << 20).feed(_sse(*opening, orphan, *closing))) + stream.end()
        assert stream.fault is not None and stream.fault.code == "upstream_bad_answer", client
        assert b"could not be read" in out[-1].raw, client


@pytest.mark.parametrize(
    ("client", "upstream", "body", "param"),
    [
        (
            "content",
            "chat",
            {"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "audio/wav", "data": "AA"}}]}]},
            "contents[0].parts[0].inlineData.mimeType",
        ),
        (
            "content",
            "chat",
            {
                "contents": [
                    {
                        "role": "user",
                        "parts": [{"fileData": {"mimeType": "application/pdf", "fileUri": "https://x/a.pdf"}}],
                    }
                ]
            },
            "contents[0].parts[0].fileData.mimeType",
        ),
        (
            "responses",
            "content",
            {
                "model": "m",
                "input": [
                    {"role": "developer", "content": [{"type": "input_image", "image_url": "https://x/a.png"}]},
                    {"role": "user", "content": "hi"},
                ],
            },
            "input[0].content",
        ),
        (
            "chat",
            "messages",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "any"},
            "tool_choice",
        ),
        (
            "messages",
            "chat",
            {
                "model": "m",
                "max_tokens": 9,
                "messages": [{"role": "user", "content": "hi"}],
                "tool_choice": {"type": "zzz"},
            },
            "tool_choice.type",
        ),
        (
            "messages",
            "chat",
            {
                "model": "m",
                "max_tokens": 9,
                "messages": [{"role": "user", "content": "hi"}],
                "thinking": {"type": "zzz"},
            },
            "thinking.type",
        ),
    ],
)
def test_what_would_change_the_request_unsaid_is_refused_by_name(client, upstream, body, param):
    with pytest.raises(Untranslatable) as refused:
        _sent(client, upstream, body)
    assert refused.value.param == param


def test_allowed_function_names_narrow_the_tools_offered():
    tools = [{"functionDeclarations": [{"name": n, "parameters": {"type": "OBJECT"}} for n in ("f", "g", "h")]}]
    body = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "tools": tools,
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f", "g"]}},
    }
    sent, _ = _sent("content", "messages", body)
    assert [t["name"] for t in sent["tools"]] == ["f", "g"] and sent["tool_choice"] == {"type": "any"}


def test_text_beside_a_function_call_in_one_part_keeps_both():
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"text": "calling", "functionCall": {"name": "f", "id": "c", "args": {}}}]},
        ]
    }
    sent, _ = _sent("content", "chat", body)
    assert sent["messages"][1]["content"] == "calling" and sent["messages"][1]["tool_calls"][0]["id"] == "c"
    answer = {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": "calling", "functionCall": {"name": "f", "args": {}}}]},
                "finishReason": "STOP",
            }
        ]
    }
    assert [p.kind for p in CODECS["content"].read_reply(answer).parts] == ["text", "tool_call"]


def test_a_cache_hint_on_instructions_is_named_where_the_target_has_none():
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "long", "cache_control": {"type": "ephemeral"}}]},
            {"role": "user", "content": "hi"},
        ],
    }
    assert "cache_control" in _sent("chat", "responses", body)[1].dropped


def test_an_answers_ids_of_the_wrong_type_are_none_of_the_clients():
    answer = {
        "id": 5,
        "type": "message",
        "model": {"a": 1},
        "content": [{"type": "tool_use", "id": 6, "name": 7, "input": {}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    translation = Translation(FORMATS["chat"], FORMATS["messages"], _ask("chat", stream=False), "m")
    status, body = translation.answer(200, json.dumps(answer).encode())
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert status == 200 and body["model"] == "m" and isinstance(call["id"], str) and call["id"].startswith("call_")


def test_the_header_naming_what_was_left_out_stays_short():
    messages = [{"role": "user", "content": "hi", "name": f"n{i}"} for i in range(500)]
    _, translation = _sent("chat", "messages", {"model": "m", "messages": messages})
    said = translation.response_headers()["X-Translation-Dropped"]
    assert said.endswith(", and 480 more") and len(said) < 600


def test_a_streams_opening_counts_are_a_placeholder_never_its_last_word():
    """A message stream opens with `output_tokens: 1`: cut there, the gateway estimates the output."""
    stream = Translation(FORMATS["chat"], FORMATS["messages"], _ask("chat"), "m").stream()
    stream.feed(SSEParser(1 << 20).feed(STREAMS["messages"].split(b"event: content_block_stop")[0]))
    usage = stream.usage()
    assert not usage.final and usage.input_tokens == 35
    stream.feed(
        SSEParser(1 << 20).feed(
            b"event: content_block_stop" + STREAMS["messages"].split(b"event: content_block_stop", 1)[1]
        )
    )
    assert stream.usage().final and stream.usage().output_tokens == 42


def test_a_chat_upstreams_stop_beside_tool_calls_is_a_tool_use():
    answer = {
        "id": "c",
        "choices": [
            {
                "index": 0,
                "message": {
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
                },
                "finish_reason": "stop",
            }
        ],
    }
    assert CODECS["chat"].read_reply(answer).stop == TOOL_USE
    chunks = _sse(
        (
            None,
            {
                **CHUNK,
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}]
                        },
                    }
                ],
            },
        ),
        (None, {**CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        (None, "[DONE]"),
    )
    stream = Translation(FORMATS["messages"], FORMATS["chat"], _ask("messages"), "m").stream()
    out = b"".join(e.raw for e in stream.feed(SSEParser(1 << 20).feed(chunks)) + stream.end())
    assert b'"stop_reason":"tool_use"' in out


def test_a_schema_too_deep_to_translate_is_refused_not_a_crash():
    deep: dict[str, Any] = {"type": "STRING"}
    for _ in range(2000):
        deep = {"type": "ARRAY", "items": deep}
    body = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": deep}]}],
    }
    with pytest.raises(Untranslatable):
        _sent("content", "chat", body)


def test_strict_tools_stay_strict_or_are_named():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    sent, _ = _sent("chat", "responses", body)
    assert sent["tools"][0]["strict"] is True
    assert "tools.strict" in _sent("chat", "messages", body)[1].dropped
    assert "tools.strict" in _sent("chat", "content", body)[1].dropped


def test_a_results_one_field_keeps_its_name_unless_it_is_the_result():
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "f", "id": "c", "args": {}}}]},
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "f", "id": "c", "response": {"temperature_celsius": "-5"}}}],
            },
        ]
    }
    sent, _ = _sent("content", "chat", body)
    assert json.loads(sent["messages"][2]["content"]) == {"temperature_celsius": "-5"}


def test_an_event_the_gateway_cannot_read_ends_the_stream_not_skipped():
    events = STREAMS["messages"].replace(b'"text": "H', b'"text": H', 1)  # (its JSON broken)
    stream = Translation(FORMATS["chat"], FORMATS["messages"], _ask("chat"), "m").stream()
    out = stream.feed(SSEParser(1 << 20).feed(events)) + stream.end()
    assert stream.fault is not None and b"could not be read" in out[-1].raw and b"[DONE]" not in out[-1].raw


def test_a_stream_errors_code_is_redacted_too():
    error = ("error", {"type": "error", "error": {"type": "invalid_key_sk-up-secret", "message": "no"}})
    redact = lambda text: text.replace("sk-up-secret", "[redacted]")  # noqa: E731
    stream = Translation(FORMATS["chat"], FORMATS["messages"], _ask("chat"), "m", redact=redact).stream()
    out = b"".join(e.raw for e in stream.feed(SSEParser(1 << 20).feed(_sse(error))))
    assert b"sk-up-secret" not in out and b"invalid_key_[redacted]" in out


def test_a_responses_image_detail_is_named_when_left_out():
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/a.png", "detail": "low"}]}
        ],
    }
    assert "input[0].content[0].detail" in _sent("responses", "chat", body)[1].dropped


def test_what_a_writer_holds_until_a_part_ends_is_bounded():
    """A response client's output is held for its closing event; past the limit the stream ends
    with the client's error event, not with the gateway holding all an upstream sends."""
    events = _sse(
        ("message_start", {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 1}}}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        *[
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x" * 100}},
            )
        ]
        * 20,
    )
    stream = Translation(FORMATS["responses"], FORMATS["messages"], _ask("responses"), "m").stream(limit=1000)
    out = stream.feed(SSEParser(1 << 20).feed(events))
    assert stream.fault is not None and stream.fault.code == "upstream_answer_too_large"
    assert b"too large to translate" in out[-1].raw and len(out) < 20
