"""`POST /v1/chat/completions` beside the interface's endpoints: the openai SDK with a base URL and a
key, JSON and streamed, tools in a two-step loop, structured output; keyed, validated, metered
and budgeted like every route, and a stream that does not ask for its usage charged all the same."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from prometheus_client import REGISTRY

from proxy.core import jsonutil
from tests.conftest import BEARER, DEMO_KEY
from tests.scripted_upstream import Scripted
from tests.test_metering_abuse import AUTH, agreed, gateway_with, post  # noqa: F401 (a fixture)
from tests.test_sdks import gw  # noqa: F401 (a fixture: the simulator as channel `sim`, six words an answer)

MODEL = "respmodel-4o"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture
async def client(gw) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=DEMO_KEY, max_retries=0) as client:
        yield client


async def test_the_openai_sdk_creates_a_completion_with_its_usage(gw, client):
    completion = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}])
    assert completion.object == "chat.completion" and completion.choices[0].finish_reason == "stop"
    assert len(completion.choices[0].message.content.split()) == 6
    assert completion.usage.completion_tokens == 6 and completion.usage.prompt_tokens == 1
    upstream = gw.last_upstream_request("sim")
    assert upstream.path == "/v1/chat/completions"
    assert upstream.header("Authorization") == "Bearer upstream" and DEMO_KEY not in repr(upstream.headers)


async def test_a_stream_that_asks_for_its_usage_gets_it_last(client):
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 6
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


async def test_a_stream_that_does_not_ask_for_its_usage_gets_none_and_the_upstream_was_asked(gw, client):
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert all(c.usage is None for c in chunks) and chunks[-1].choices[0].finish_reason == "stop"
    sent = json.loads(gw.last_upstream_request("sim").body)
    assert sent["stream_options"] == {"include_usage": True}  # the gateway's question, for its own count


async def test_tools_in_a_two_step_loop_and_structured_output(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = await client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert "city" in json.loads(call.function.arguments)
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
    ]
    second = await client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])
    assert "sunny, 21C" in second.choices[0].message.content

    streamed = await client.chat.completions.create(model=MODEL, messages=messages[:1], tools=[WEATHER], stream=True)
    arguments = "".join(
        [
            c.choices[0].delta.tool_calls[0].function.arguments or ""
            async for c in streamed
            if c.choices and c.choices[0].delta.tool_calls
        ]
    )
    assert json.loads(arguments) == json.loads(call.function.arguments)  # split across chunks, whole again

    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    shaped = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Answer in JSON"}],
        response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}},
    )
    assert isinstance(json.loads(shaped.choices[0].message.content)["answer"], str)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1},
            "max_completion_tokens",
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "service_tier": "free"}, "service_tier"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 1.5}, "n"),
    ],
)
async def test_a_request_the_interface_refuses_is_a_400_in_the_openai_shape(gw, client, body, param):
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(**body)
    assert refused.value.body["param"] == param and refused.value.body["type"] == "invalid_request_error"
    assert not gw.sim("sim").requests


async def test_values_the_interface_does_not_list_pass_to_the_upstream(gw, client):
    """Next month's client: a new role, a new reasoning effort, a field nobody knows yet."""
    await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "critic", "content": "be brief"}, {"role": "user", "content": "Hello"}],
        reasoning_effort="xhigh",
        extra_body={"verbosity": "low", "prediction": {"type": "content", "content": "x"}},
        # Rules of one upstream, not the interface's: how many stop sequences, what a tool may be called.
        stop=["a", "b", "c", "d", "e"],
        tools=[{"type": "function", "function": {"name": "server.tool", "parameters": {"type": "object"}}}],
    )
    sent = json.loads(gw.last_upstream_request("sim").body)
    assert (
        sent["reasoning_effort"] == "xhigh" and sent["verbosity"] == "low" and sent["messages"][0]["role"] == "critic"
    )


async def test_a_key_and_a_model_are_needed_and_listed_models_include_the_chat_route(gw, http, client):
    async with http.post(gw.url + "/v1/chat/completions", json={"model": MODEL, "messages": []}) as answer:
        assert answer.status == 401 and (await answer.json())["error"]["code"] == "missing_api_key"
    status, refused = await post(
        http, gw.url + "/v1/chat/completions", {"messages": []}, {"Authorization": f"Bearer {DEMO_KEY}"}
    )
    assert status == 400 and refused["error"]["param"] == "model"
    assert MODEL in [model.id async for model in client.models.list()]


async def test_a_stream_that_does_not_ask_for_usage_is_charged_what_it_made(gateway_with, http, redis_url, ledger_db):
    """A hostile client leaving out `include_usage` to be charged an estimate (or nothing): the
    budget and the ledger count the upstream's own closing counts."""
    gateway = await gateway_with("{tokens_per_day: 100000}")
    sim = gateway.sim()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "one two three"}], "stream": True}
    async with http.post(
        gateway.url + "/v1/chat/completions",
        data=jsonutil.dumps(body),
        headers={**AUTH, "content-type": "application/json", "x-sim-output-tokens": "40"},
    ) as answer:
        assert answer.status == 200
        streamed = await answer.read()
    assert b'"usage"' not in streamed and streamed.endswith(b"data: [DONE]\n\n")
    held, [row] = await agreed(redis_url, ledger_db, 1)
    assert not row["estimated"] and row["route"] == "chat_completions"
    assert (row["input_tokens"], row["output_tokens"]) == (sim.produced["input_tokens"], sim.produced["output_tokens"])
    assert held == row["input_tokens"] + row["output_tokens"] == 3 + 40


async def test_a_budget_reserves_for_every_choice_asked(gateway_with, http):
    """`n` choices each up to the output limit: a key with room for one is refused four."""
    gateway = await gateway_with("{tokens_per_day: 5000}")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 2000}
    status, _ = await post(http, gateway.url + "/v1/chat/completions", {**body, "n": 4}, AUTH)
    assert status == 429
    status, _ = await post(http, gateway.url + "/v1/chat/completions", body, AUTH)
    assert status == 200


# -- what a hostile tenant and an upstream of another parser send --


async def test_the_fields_a_streams_charge_goes_by_reach_the_upstream_as_the_gateway_read_them(gw, http):
    """Given twice, `stream` and `stream_options` are sent once, as parsed (an upstream reading the
    first would stream with no usage); in other letter case, they are refused."""
    message = '"messages":[{"role":"user","content":"x"}]'
    for raw in (
        '{"model":"respmodel-4o","stream":true,' + message + ',"stream":false}',
        '{"model":"respmodel-4o","stream":true,"stream_options":{"include_usage":false},'
        + message
        + ',"stream_options":{"include_usage":true}}',
        '{"model":"respmodel-4o","stream":true,"stream_options":{"include_usage":false,"include_usage":true},'
        + message
        + "}",
    ):
        async with http.post(
            gw.url + "/v1/chat/completions", data=raw, headers={**BEARER, "content-type": "application/json"}
        ) as answer:
            assert answer.status == 200, await answer.text()
            await answer.read()
        sent = gw.last_upstream_request("sim").body
        assert sent.count(b'"stream"') == 1 and sent.count(b'"stream_options"') <= 1
        assert sent.count(b'"include_usage"') <= 1
        assert sent == jsonutil.dumps(json.loads(raw))  # what the gateway parsed, the last of each
    for body, param in (
        ({"Stream": True}, "stream"),
        ({"stream": True, "stream_options": {"Include_Usage": False}}, "stream_options.include_usage"),
    ):
        full = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], **body}
        status, refused = await post(http, gw.url + "/v1/chat/completions", full, BEARER)
        assert status == 400 and refused["error"]["param"] == param, refused


async def test_a_usage_chunk_spaced_as_an_upstream_likes_is_read_and_kept_from_a_client_that_did_not_ask(
    start_gateway, http
):
    """Python's json.dumps writes `"usage": {`: the chunk is the closing counts all the same."""
    chunks = [
        {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]},
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        },
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {"prompt_tokens": 7, "completion_tokens": 300},
        },
    ]
    before = tokens()
    arrivals = await _timed_stream(start_gateway, http, _chunked_events(*chunks, b"data: [DONE]\n\n"))
    received = b"".join(piece for _, piece in arrivals)
    assert b'"usage"' not in received and received.endswith(b"data: [DONE]\n\n")
    assert [after - was for after, was in zip(tokens(), before)] == [7, 300]


def tokens() -> tuple[float, float]:
    """The tokens this process has counted for the demo key on MODEL, in and out."""
    return tuple(  # type: ignore[return-value]
        REGISTRY.get_sample_value("modelgate_tokens_total", {"model": MODEL, "key": "demo", "direction": way}) or 0.0
        for way in ("input", "output")
    )


async def test_a_channel_that_takes_no_stream_options_is_sent_the_clients_body_and_the_next_one_is_asked(
    start_gateway, http
):
    """`stream_usage: false`: that upstream is sent the stream as the client asked for it (and the
    stream is estimated); failed over, the next channel is asked for the usage again."""
    gateway = await start_gateway("""
        channels:
          - {name: plain, base_url: simulator, stream_usage: false, priority: 0, simulator: {fail_status: 503}}
          - {name: asks, base_url: simulator, priority: 1, simulator: {chunk_delay_ms: 0, output_tokens: 5}}
    """)
    before = tokens()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
    async with http.post(gateway.url + "/v1/chat/completions", json=body, headers=BEARER) as answer:
        assert answer.status == 200
        received = await answer.read()
    assert b'"usage"' not in received
    assert "stream_options" not in json.loads(gateway.last_upstream_request("plain").body)
    assert json.loads(gateway.last_upstream_request("asks").body)["stream_options"] == {"include_usage": True}
    assert [after - was for after, was in zip(tokens(), before)] == [1, 5]  # the upstream's own counts


@pytest.mark.parametrize("options", [None, {"include_usage": False, "include_obfuscation": False}])
async def test_a_stream_to_a_channel_that_takes_no_stream_options_goes_as_sent(start_gateway, http, options):
    """As the client sent it (and so charged an estimate: tests/test_metering_abuse.py), under the
    channel's name for the model."""
    gateway = await start_gateway("""
        channels:
          - {name: plain, base_url: simulator, stream_usage: false, rename: {respmodel-4o: upstream-4o},
             simulator: {chunk_delay_ms: 0}}
    """)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
    if options is not None:
        body["stream_options"] = options
    async with http.post(gateway.url + "/v1/chat/completions", json=body, headers=BEARER) as answer:
        assert answer.status == 200
        assert (await answer.read()).endswith(b"data: [DONE]\n\n")
    assert json.loads(gateway.last_upstream_request("plain").body) == {**body, "model": "upstream-4o"}


async def test_a_chat_streams_finish_comes_with_its_usage_so_the_answer_is_never_whole_before_its_counts(
    start_gateway, http
):
    """A client that leaves once it sees `finish_reason` (the usage chunk comes after it) would be
    charged an estimate: the finish is held until the counts are in, and both go at the end; the
    content that came with it in one read goes at once."""
    opening = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]}
    finish = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    }
    usage = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 3, "completion_tokens": 9},
    }
    before = tokens()
    script = [b"".join(_chunked_events(opening, finish)), 1.0, *_chunked_events(usage, b"data: [DONE]\n\n")]
    arrivals = await _timed_stream(start_gateway, http, script)
    received = b"".join(piece for _, piece in arrivals)
    # the content at once; its finish only once the counts came (late)
    assert _when(arrivals, b'"content": "hi"') < 0.5 <= _when(arrivals, b"finish_reason")
    assert b'"usage"' not in received and received.endswith(b"data: [DONE]\n\n")
    assert [after - was for after, was in zip(tokens(), before)] == [3, 9]


def _chunked_events(*pieces: dict[str, Any] | bytes) -> list[bytes]:
    """Each chunk (or raw event) as one HTTP chunk of an SSE answer."""
    framed = []
    for piece in pieces:
        data = piece if isinstance(piece, bytes) else b"data: " + json.dumps(piece).encode() + b"\n\n"
        framed.append(b"%x\r\n%b\r\n" % (len(data), data))
    return framed


async def _timed_stream(
    start_gateway, http, script: list[bytes | float], channel: str = ""
) -> list[tuple[float, bytes]]:
    """What the client got, and when, from an upstream that writes `script` (bytes, or a pause in seconds)."""

    async def answer(reader, writer, _):
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for step in script:
            if isinstance(step, float):
                await asyncio.sleep(step)
            else:
                writer.write(step)
                await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with Scripted(answer) as upstream:
        gateway = await start_gateway(
            f"channels: [{{name: scripted, base_url: '{upstream.url}', formats: [chat]{channel}}}]"
        )
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
        arrivals: list[tuple[float, bytes]] = []
        async with http.post(gateway.url + "/v1/chat/completions", json=body, headers=BEARER) as answered:
            started = asyncio.get_running_loop().time()
            async for piece in answered.content.iter_any():
                arrivals.append((asyncio.get_running_loop().time() - started, piece))
    return arrivals


def _when(arrivals: list[tuple[float, bytes]], marker: bytes) -> float:
    return next(at for at, piece in arrivals if marker in piece)


async def test_an_empty_finish_reason_on_every_chunk_is_no_finish_and_the_stream_flows(start_gateway, http):
    """sglang and Ollama send `"finish_reason": ""` (KoboldCpp "null") with every content chunk."""

    def content(word: str, reason: str | None) -> dict[str, Any]:
        return {"id": "c", "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": reason}]}

    script = [
        *_chunked_events(content("one", "")),
        0.4,
        *_chunked_events(content("two", "null")),
        0.4,
        *_chunked_events(
            {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"id": "c", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}},
            b"data: [DONE]\n\n",
        ),
    ]
    arrivals = await _timed_stream(start_gateway, http, script)
    assert _when(arrivals, b'"one"') < 0.3 and 0.3 < _when(arrivals, b'"two"') < 0.7  # each as it came


async def test_a_finish_with_no_counts_to_wait_for_is_not_held(start_gateway, http):
    """A channel that is not asked for the usage (`stream_usage: false`): the finish goes at once."""
    script = [
        *_chunked_events({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        1.0,
        *_chunked_events(b"data: [DONE]\n\n"),
    ]
    arrivals = await _timed_stream(start_gateway, http, script, ", stream_usage: false")
    assert _when(arrivals, b"finish_reason") < 0.5 and _when(arrivals, b"[DONE]") >= 1.0
