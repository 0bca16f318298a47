"""Public model names (`models:`): one name, targets of any chat format in order; a request
fails over to the next target under the resend rules (never once a streamed answer began), and
is counted once, in the ledger and the budget, under the target that answered."""

from __future__ import annotations

import json
import socket
import textwrap

import aiohttp
import openai
import pytest

from proxy.config import ConfigError
from proxy.registry import parse_config
from tests.conftest import BEARER, DEMO_KEY
from tests.scripted_upstream import Scripted
from tests.test_metering_abuse import KEY, PRICES, agreed

SIM = "simulator: {chunk_delay_ms: 0, output_tokens: 7}"
OVERLOADED = b'{"error":{"message":"overloaded now"}}'
REFUSED_503 = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(OVERLOADED),
    OVERLOADED,
)


def closed_port() -> int:
    """A port nothing listens on: connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def config(first_url: str, extra: str = "") -> str:
    return (
        textwrap.dedent(f"""
        channels:
          - {{name: first, base_url: '{first_url}', formats: [chat], models: [none]}}
          - {{name: msg, base_url: simulator, credential: up-msg, formats: [messages], models: [none], {SIM}}}
          - {{name: gem, base_url: simulator, formats: [content], models: [none], {SIM}}}
        models:
          smart:
            - {{channel: first, model: gpt-big}}
            - {{channel: msg, model: claude-big}}
            - {{channel: gem, model: gemini-big}}
        """)
        + extra
    )


@pytest.fixture
async def refusing_gateway(start_gateway):
    return await start_gateway(config(f"http://127.0.0.1:{closed_port()}"))


async def test_a_refused_first_target_is_answered_by_the_next_in_another_format(refusing_gateway):
    gw = refusing_gateway
    async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=DEMO_KEY, max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="smart", messages=[{"role": "user", "content": "Hello"}]
        )
    completion = raw.parse()
    assert completion.model == "claude-big" and completion.usage.completion_tokens == 7
    assert raw.headers["x-upstream-format"] == "messages"
    sent = gw.last_upstream_request("msg")
    assert sent.path == "/v1/messages" and json.loads(sent.body)["model"] == "claude-big"


async def test_a_503_before_the_first_byte_moves_a_stream_to_the_next_target(start_gateway, http):
    async def overloaded(reader, writer, _):
        await upstream.read_request(reader)
        writer.write(REFUSED_503)
        await writer.drain()

    async with Scripted(overloaded) as upstream:
        gw = await start_gateway(config(upstream.url))
        body = {"model": "smart", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
        async with http.post(gw.url + "/v1/chat/completions", json=body, headers=BEARER) as answered:
            assert answered.status == 200 and answered.headers["X-Upstream-Format"] == "messages"
            text = (await answered.read()).decode()
    assert upstream.connections == 1 and text.rstrip().endswith("data: [DONE]")
    assert '"finish_reason":"stop"' in text


async def test_a_stream_that_began_is_never_sent_to_another_target(start_gateway, http):
    async def breaks_off(reader, writer, _):
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = (
            b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
        )
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
        writer.transport.abort()

    async with Scripted(breaks_off) as upstream:
        gw = await start_gateway(config(upstream.url))
        body = {"model": "smart", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
        async with http.post(gw.url + "/v1/chat/completions", json=body, headers=BEARER) as answered:
            text = (await answered.read()).decode()
    assert "Hel" in text and "closed the stream before it finished" in text
    assert not gw.sim("msg").requests and not gw.sim("gem").requests


async def test_a_public_name_is_listed_and_answers_every_chat_format(refusing_gateway, http):
    gw = refusing_gateway
    async with http.get(gw.url + "/v1/models", headers=BEARER) as listed:
        assert "smart" in [m["id"] for m in (await listed.json())["data"]]
    body = {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]}
    async with http.post(
        gw.url + "/v1beta/models/smart:generateContent", json=body, headers={"x-goog-api-key": DEMO_KEY}
    ) as answered:
        assert answered.status == 200, await answered.text()
        assert (await answered.json())["usageMetadata"]["candidatesTokenCount"] == 7


async def test_a_failed_over_request_is_counted_once_under_the_target_that_answered(
    ledger_db, redis_url, start_gateway, tmp_path
):
    keys = f"[{{name: spender, key: {KEY}, budget: {{tokens_per_day: 100000}}}}]"
    gw = await start_gateway(
        textwrap.dedent(f"""
        state: {{backend: redis, url: '{redis_url}', check_timeout_s: 5}}
        keys: {keys}
        observability: {{logging: {{access_log: false}}}}
        plugins:
          ledger: {{database_url: '{ledger_db}', flush_interval_s: 0.05, spool_dir: '{tmp_path / "spool"}'}}
        """)
        + config(f"http://127.0.0.1:{closed_port()}")
        + PRICES
    )
    async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="smart", messages=[{"role": "user", "content": "Hello"}], stream=True
        )
        chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices[0].finish_reason == "stop" and all(c.usage is None for c in chunks)
    held, [row] = await agreed(redis_url, ledger_db, 1)
    assert (row["model"], row["channel"], row["upstream_model"]) == ("smart", "msg", "claude-big")
    assert row["upstream_format"] == "messages" and row["output_tokens"] == 7 and not row["estimated"]
    assert held == row["input_tokens"] + 7


@pytest.mark.parametrize(
    ("models", "says"),
    [
        ("{smart: [{channel: nowhere, model: x}]}", "no channel is named 'nowhere'"),
        ("{smart: []}", "names no target"),
        ("{smart: [{channel: msg, model: a}, {channel: msg, model: b}]}", "'msg' is named twice"),
        ("{smart: [{channel: pics, model: a}]}", "'pics' serves no chat format"),
    ],
)
def test_a_public_name_must_name_chat_channels(models, says):
    text = (
        "channels: [{name: msg, base_url: simulator, formats: [messages]}, "
        "{name: pics, base_url: simulator, formats: [images]}]\n"
        f"models: {models}\n"
    )
    with pytest.raises(ConfigError, match=says):
        parse_config(text, {})


async def test_a_target_that_cannot_carry_the_request_passes_it_to_the_next(start_gateway, http):
    """`seed` has no place in the response or the message format: the request goes on, sent to
    neither, to the content channel, which takes it; with no such target left, the first refusal."""
    gw = await start_gateway(
        textwrap.dedent(f"""
        channels:
          - {{name: resp, base_url: simulator, formats: [responses], models: [none], {SIM}}}
          - {{name: msg, base_url: simulator, formats: [messages], models: [none], {SIM}}}
          - {{name: gem, base_url: simulator, formats: [content], models: [none], {SIM}}}
        models:
          seeded: [{{channel: resp, model: r}}, {{channel: msg, model: m}}, {{channel: gem, model: g}}]
          unseeded: [{{channel: resp, model: r}}, {{channel: msg, model: m}}]
        """)
    )
    body = {"messages": [{"role": "user", "content": "Hi"}], "seed": 7}
    async with http.post(gw.url + "/v1/chat/completions", json={**body, "model": "seeded"}, headers=BEARER) as answered:
        assert answered.status == 200 and answered.headers["X-Upstream-Format"] == "content"
    async with http.post(
        gw.url + "/v1/chat/completions", json={**body, "model": "unseeded"}, headers=BEARER
    ) as answered:
        refusal = await answered.json()
        assert answered.status == 400 and refusal["error"]["param"] == "seed"
        assert "responses format" in refusal["error"]["message"]  # the first target's refusal
    assert not gw.sim("resp").requests and not gw.sim("msg").requests


async def test_a_failure_is_the_answer_when_no_target_left_can_carry_the_request(start_gateway, http):
    """The first target answers 503; the next cannot carry `seed`: the client is told of the 503,
    not of a refusal that was never its request's fault."""

    async def overloaded(reader, writer, _):
        await upstream.read_request(reader)
        writer.write(REFUSED_503)
        await writer.drain()

    async with Scripted(overloaded) as upstream:
        gw = await start_gateway(
            textwrap.dedent(f"""
            channels:
              - {{name: first, base_url: '{upstream.url}', formats: [chat], models: [none]}}
              - {{name: msg, base_url: simulator, formats: [messages], models: [none], {SIM}}}
            models:
              seeded: [{{channel: first, model: a}}, {{channel: msg, model: b}}]
            """)
        )
        body = {"model": "seeded", "messages": [{"role": "user", "content": "Hi"}], "seed": 7}
        async with http.post(gw.url + "/v1/chat/completions", json=body, headers=BEARER) as answered:
            assert answered.status == 503 and (await answered.json())["error"]["message"] == "overloaded now"
    assert not gw.sim("msg").requests


async def test_a_request_naming_no_limit_is_held_upstream_to_the_limit_it_was_charged_for(redis_url, start_gateway):
    """The message format requires `max_tokens`: a chat request naming none is sent the limit its
    reservation assumed (the price row's `max_output_tokens`), not a default of the format's."""
    gw = await start_gateway(
        textwrap.dedent(f"""
        state: {{backend: redis, url: '{redis_url}', check_timeout_s: 5}}
        keys: [{{name: spender, key: {KEY}, budget: {{cost_per_day: 1.0}}}}]
        channels:
          - {{name: msg, base_url: simulator, formats: [messages], models: [none], {SIM}}}
        models:
          bigm: [{{channel: msg, model: msgmodel-sonnet-4-5}}]
        prices:
          - {{model: bigm, input_per_mtok: 3, output_per_mtok: 15, max_output_tokens: 50}}
        plugins:
          budget: {{}}
        """)
    )
    body = {"model": "bigm", "messages": [{"role": "user", "content": "Hi"}]}
    async with (
        aiohttp.ClientSession() as http,
        http.post(gw.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as answered,
    ):
        assert answered.status == 200, await answered.text()
    assert json.loads(gw.last_upstream_request("msg").body)["max_tokens"] == 50


async def test_counting_tokens_for_a_public_name_goes_to_a_target_of_its_own_format(refusing_gateway, http):
    gw = refusing_gateway
    headers = {"x-api-key": DEMO_KEY, "anthropic-version": "2023-06-01"}
    body = {"model": "smart", "messages": [{"role": "user", "content": "Hi"}]}
    async with http.post(gw.url + "/v1/messages/count_tokens", json=body, headers=headers) as answered:
        assert answered.status == 200
    sent = gw.last_upstream_request("msg")
    assert sent.path == "/v1/messages/count_tokens" and json.loads(sent.body)["model"] == "claude-big"
    path = "/v1beta/models/smart:countTokens"
    async with http.post(gw.url + path, json={"contents": []}, headers={"x-goog-api-key": DEMO_KEY}) as answered:
        assert answered.status == 200  # the content target
    async with http.get(gw.admin + "/metrics") as scraped:
        assert 'model="smart"' in await scraped.text()  # a public name is counted by name
