"""One model name, any upstream: each official SDK against channels of the other chat formats,
through real sockets (SDK -> gateway -> simulated upstream of another format), JSON and streamed,
tools in a two-step loop and structured output; charged exactly as the upstream counted."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import types as genai_types

from tests.conftest import BEARER, DEMO_KEY
from tests.scripted_upstream import Scripted

# One simulator channel per chat format, each serving its own models only.
CHANNELS = """
    channels:
      - {name: msg, base_url: simulator, credential: up-msg, formats: [messages], models: ["claude-*"],
         simulator: {chunk_delay_ms: 0, output_tokens: 6}}
      - {name: gem, base_url: simulator, credential: up-gem, formats: [content], models: ["gemini-*"],
         simulator: {chunk_delay_ms: 0, output_tokens: 6}}
      - {name: resp, base_url: simulator, credential: up-resp, formats: [responses], models: ["gpt-resp-*"],
         simulator: {chunk_delay_ms: 0, output_tokens: 6}}
      - {name: chat, base_url: simulator, credential: up-chat, formats: [chat], models: ["gpt-chat-*"],
         simulator: {chunk_delay_ms: 0, output_tokens: 6}}
"""
# A model each channel serves, and the path its upstream is asked at.
UPSTREAMS = {
    "msg": ("claude-sonnet", "/v1/messages"),
    "gem": ("gemini-flash", "/v1beta/models/gemini-flash:"),
    "resp": ("gpt-resp-mini", "/v1/responses"),
    "chat": ("gpt-chat-mini", "/v1/chat/completions"),
}
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "degrees": {"type": "integer"}},
    "required": ["city", "degrees"],
    "additionalProperties": False,
}


@pytest.fixture
async def gw(start_gateway):
    return await start_gateway(CHANNELS)


@pytest.fixture
async def oai(gw):
    async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=DEMO_KEY, max_retries=0) as client:
        yield client


def words(text: str) -> int:
    """The tokens of a simulated answer, a word each (the response simulator's opening `Turn 1:` is one)."""
    return len(text.split()) - text.startswith("Turn ")


def upstream_of(gw: Any, channel: str) -> Any:
    request = gw.last_upstream_request(channel)
    assert request.path.startswith(UPSTREAMS[channel][1]), request.path
    assert DEMO_KEY not in repr(request.headers)
    return request


@pytest.mark.parametrize("channel", ["msg", "gem", "resp"])
async def test_chat_completions_json_is_answered_by_a_channel_of_another_format(gw, oai, channel):
    model = UPSTREAMS[channel][0]
    completion = await oai.chat.completions.create(
        model=model, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    )
    assert completion.object == "chat.completion" and completion.choices[0].finish_reason == "stop"
    assert words(completion.choices[0].message.content) == 6
    assert completion.usage.completion_tokens == 6 and completion.usage.prompt_tokens > 0
    upstream_of(gw, channel)


@pytest.mark.parametrize("channel", ["msg", "gem", "resp"])
async def test_chat_completions_stream_with_usage_from_another_format(gw, oai, channel):
    stream = await oai.chat.completions.create(
        model=UPSTREAMS[channel][0],
        messages=[{"role": "user", "content": "Hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert words(text) == 6
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert upstream_of(gw, channel)


@pytest.mark.parametrize("channel", ["msg", "gem", "resp"])
async def test_chat_completions_stream_without_usage_gets_none(gw, oai, channel):
    stream = await oai.chat.completions.create(
        model=UPSTREAMS[channel][0], messages=[{"role": "user", "content": "Hello"}], stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert all(c.usage is None for c in chunks) and chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("channel", ["msg", "gem", "resp"])
async def test_chat_completions_tools_in_a_two_step_loop(gw, oai, channel):
    model = UPSTREAMS[channel][0]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    tools = [{"type": "function", "function": WEATHER}]
    first = await oai.chat.completions.create(model=model, messages=messages, tools=tools)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 degrees"},
    ]
    second = await oai.chat.completions.create(model=model, messages=messages, tools=tools)
    assert second.choices[0].finish_reason == "stop"
    assert "sunny, 21 degrees" in second.choices[0].message.content


@pytest.mark.parametrize("channel", ["msg", "gem", "resp"])
async def test_chat_completions_streamed_tool_call_from_another_format(gw, oai, channel):
    stream = await oai.chat.completions.create(
        model=UPSTREAMS[channel][0],
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[{"type": "function", "function": WEATHER}],
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    async for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            found = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            found["id"] += call.id or ""
            found["name"] += (call.function.name or "") if call.function else ""
            found["arguments"] += (call.function.arguments or "") if call.function else ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls" and calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert "city" in json.loads(calls[0]["arguments"])


@pytest.mark.parametrize("channel", ["msg", "gem", "resp"])
async def test_chat_completions_json_schema_from_another_format(gw, oai, channel):
    completion = await oai.chat.completions.create(
        model=UPSTREAMS[channel][0],
        messages=[{"role": "user", "content": "Weather in Paris as JSON"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "weather", "schema": ANSWER_SCHEMA, "strict": True},
        },
    )
    answer = json.loads(completion.choices[0].message.content)
    assert set(answer) == {"city", "degrees"} and isinstance(answer["degrees"], int)


@pytest.mark.parametrize("channel", ["gem", "resp", "chat"])
async def test_the_message_sdk_against_other_formats(gw, channel):
    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key=DEMO_KEY, max_retries=0)
    model = UPSTREAMS[channel][0]
    message = await client.messages.create(model=model, max_tokens=64, messages=[{"role": "user", "content": "Hi"}])
    assert message.type == "message" and message.stop_reason == "end_turn"
    assert words(message.content[0].text) == 6 and message.usage.output_tokens == 6
    async with client.messages.stream(
        model=model, max_tokens=64, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert words(text) == 6 and final.usage.output_tokens == 6 and final.stop_reason == "end_turn"
    sent = upstream_of(gw, channel)
    assert sent.header("anthropic-version") is None and sent.header("x-api-key") is None


async def test_the_genai_sdk_against_a_message_channel(gw):
    client = genai.Client(api_key=DEMO_KEY, http_options=genai_types.HttpOptions(base_url=gw.url))
    answer = await client.aio.models.generate_content(model="claude-sonnet", contents="Hello")
    assert len(answer.text.split()) == 6 and answer.usage_metadata.candidates_token_count == 6
    pieces = [
        chunk.text or ""
        async for chunk in await client.aio.models.generate_content_stream(model="claude-sonnet", contents="Hello")
    ]
    assert len("".join(pieces).split()) == 6
    sent = upstream_of(gw, "msg")
    assert sent.header("x-api-key") == "up-msg" and sent.header("anthropic-version") == "2023-06-01"


# -- pydantic-ai: an agent loop whose every turn is translated --


def _agent_models(url: str) -> dict[str, Any]:
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.anthropic import AnthropicProvider
    from pydantic_ai.providers.openai import OpenAIProvider

    return {
        "chat to content": OpenAIChatModel(
            "gemini-flash", provider=OpenAIProvider(base_url=url + "/v1", api_key=DEMO_KEY)
        ),
        "messages to responses": AnthropicModel(
            "gpt-resp-mini", provider=AnthropicProvider(base_url=url, api_key=DEMO_KEY)
        ),
    }


@pytest.mark.parametrize("pair", ["chat to content", "messages to responses"])
async def test_a_pydantic_ai_agent_runs_its_tool_loop_translated(gw, pair):
    from tests.test_agents import _assert_one_valid_call, _weather_agent
    from tests.test_tool_loops import QUESTION, WEATHER, Forecast

    calls: list[tuple[str, str, int]] = []
    result = await _weather_agent(_agent_models(gw.url)[pair], calls).run(QUESTION)
    _assert_one_valid_call(calls, result.all_messages())
    assert f"{WEATHER} in {calls[0][0]}" in result.output
    calls.clear()
    async with _weather_agent(_agent_models(gw.url)[pair], calls).run_stream(QUESTION) as run:
        output = await run.get_output()
    _assert_one_valid_call(calls, run.all_messages())
    assert f"{WEATHER} in {calls[0][0]}" in output
    calls.clear()
    typed = await _weather_agent(_agent_models(gw.url)[pair], calls, output_type=Forecast).run(QUESTION)
    assert isinstance(typed.output, Forecast)


async def test_a_translated_stream_passes_each_piece_on_as_it_comes(start_gateway, http):
    """No buffering: the upstream's first text reaches the client while the upstream still
    pauses before its next; a tool call's arguments split over events arrive in their pieces."""
    events = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {"id": "m1", "model": "claude-x", "usage": {"input_tokens": 3, "output_tokens": 1}},
            },
        ),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "first"}},
        ),
        0.6,
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"city": "Pa'},
            },
        ),
        0.6,
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": 'ris"}'}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]

    async def answer(reader, writer, _):
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for step in events:
            if isinstance(step, float):
                await asyncio.sleep(step)
                continue
            data = f"event: {step[0]}\ndata: {json.dumps(step[1])}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with Scripted(answer) as upstream:
        gw = await start_gateway(f"channels: [{{name: msg, base_url: '{upstream.url}', formats: [messages]}}]")
        body = {
            "model": "claude-x",
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "tools": [{"type": "function", "function": WEATHER}],
        }
        arrivals: list[tuple[float, bytes]] = []
        async with http.post(gw.url + "/v1/chat/completions", json=body, headers=BEARER) as answered:
            started = asyncio.get_running_loop().time()
            async for piece in answered.content.iter_any():
                arrivals.append((asyncio.get_running_loop().time() - started, piece))

    def when(marker: bytes) -> float:
        return next(at for at, piece in arrivals if marker in piece)

    assert when(b'"first"') < when(b'"get_weather"') - 0.4  # the text went before the upstream's pause ended
    assert when(b'{\\"city\\": \\"Pa') < when(b'ris\\"}') - 0.4  # and the arguments' first piece too
    assert b"data: [DONE]" in arrivals[-1][1]


# -- against a recording upstream: each format's real-shaped answer and stream, replayed byte for byte --


def _recording(fmt: str) -> Scripted:
    """An upstream that answers every request with the recorded answer of its format (its stream
    when the request asks for one) and keeps what it was sent."""
    from tests.test_translation import ANSWERS, STREAMS

    async def answer(reader, writer, _):
        while True:
            request = await recording.read_request(reader)
            head, _, body = request.partition(b"\r\n\r\n")
            if b'"stream":true' in body or b":streamGenerateContent" in head:
                data = STREAMS[fmt]
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                for start in range(0, len(data), 5):  # reads of five bytes: characters split between them
                    writer.write(b"%x\r\n%s\r\n" % (len(data[start : start + 5]), data[start : start + 5]))
                writer.write(b"0\r\n\r\n")
            else:
                data = json.dumps(ANSWERS[fmt]).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(data), data)
                )
            await writer.drain()

    recording = Scripted(answer)
    return recording


@pytest.mark.parametrize("fmt", ["messages", "content", "responses", "chat"])
async def test_the_openai_sdk_reads_each_formats_recorded_answer_and_stream(start_gateway, fmt):
    async with _recording(fmt) as upstream:
        gw = await start_gateway(
            f"channels: [{{name: rec, base_url: '{upstream.url}', credential: up-rec, formats: [{fmt}]}}]"
        )
        async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=DEMO_KEY, max_retries=0) as client:
            ask = {
                "model": "recorded",
                "messages": [{"role": "user", "content": "Weather?"}],
                "tools": [{"type": "function", "function": WEATHER}],
            }
            whole = await client.chat.completions.create(**ask)
            stream = await client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
            chunks = [chunk async for chunk in stream]
    message = whole.choices[0].message
    assert message.content == "Héllo 😀 wörld" and whole.choices[0].finish_reason == "tool_calls"
    [call] = message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "París"}
    usage = whole.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens_details.cached_tokens) == (35, 42, 10)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    arguments = "".join(
        t.function.arguments or "" for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []
    )
    assert text == "Héllo 😀 wörld" and json.loads(arguments) == {"city": "París"}
    assert chunks[-1].usage.completion_tokens == 42 and chunks[-1].usage.prompt_tokens == 35
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert len(upstream.requests) == 2 and all(DEMO_KEY.encode() not in sent for sent in upstream.requests)
    assert all(b"up-rec" in sent for sent in upstream.requests)  # the channel's credential, in its format's place


async def test_a_model_served_only_in_another_format_is_listed_for_every_chat_sdk(start_gateway):
    gw = await start_gateway("channels: [{name: gem, base_url: simulator, formats: [content], models: [gemini-pro]}]")
    async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=DEMO_KEY, max_retries=0) as client:
        assert (await client.models.retrieve("gemini-pro")).id == "gemini-pro"
    listed = await anthropic.AsyncAnthropic(base_url=gw.url, api_key=DEMO_KEY, max_retries=0).models.list()
    assert "gemini-pro" in [m.id for m in listed.data]


def _answering(body: bytes) -> Scripted:
    async def answer(reader, writer, _):
        while True:
            await upstream.read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()

    upstream = Scripted(answer)
    return upstream


async def test_a_translated_answer_that_counted_nothing_is_charged_an_estimate_not_zero(
    ledger_db, start_gateway, tmp_path
):
    from tests.test_ledger import rows

    completion = b'{"id":"c1","object":"chat.completion","model":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}'
    async with _answering(completion) as upstream:
        gw = await start_gateway(
            f"channels: [{{name: cc, base_url: '{upstream.url}', formats: [chat]}}]\n"
            f"plugins: {{ledger: {{database_url: '{ledger_db}', flush_interval_s: 0.05, spool_dir: '{tmp_path / 'spool'}'}}}}\n"
        )
        client = anthropic.AsyncAnthropic(base_url=gw.url, api_key=DEMO_KEY, max_retries=0)
        message = await client.messages.create(
            model="llama", max_tokens=20, messages=[{"role": "user", "content": "x" * 4000}]
        )
        assert message.content[0].text == "hi"  # (its usage says 0: the format has no empty count)
        for _ in range(100):
            found = await rows(ledger_db)
            if found:
                break
            await asyncio.sleep(0.05)
    [row] = found
    assert row["estimated"] and row["input_tokens"] >= 1000 and row["upstream_format"] == "chat"


async def test_an_answer_the_gateway_cannot_encode_again_is_a_502(start_gateway, http):
    answer = json.dumps(
        {
            "id": "m",
            "type": "message",
            "content": [{"type": "text", "text": "hi"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 2**70, "output_tokens": 1},
        }
    ).encode()
    async with _answering(answer) as upstream:
        gw = await start_gateway(f"channels: [{{name: msg, base_url: '{upstream.url}', formats: [messages]}}]")
        body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
        async with http.post(gw.url + "/v1/chat/completions", json=body, headers=BEARER) as answered:
            assert answered.status == 502 and (await answered.json())["error"]["code"] == "upstream_bad_answer"
