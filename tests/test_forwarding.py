"""Forwarding: bodies as sent, hop-by-hop headers dropped, forwarding headers set, compression kept whole."""

from __future__ import annotations

import asyncio
import gzip
import re

import aiohttp
import pytest

from proxy.config import ConfigError
from tests.conftest import MESSAGE_HEADERS
from tests.scripted_upstream import OK, Scripted, scripted

MSG_HEADERS = {**MESSAGE_HEADERS, "Content-Type": "application/json"}


async def test_json_body_arrives_byte_identical(gateway, http):
    raw = (
        '{ "messages":[{"role":"user","content":"héllo \\ud83d\\ude00  spaced"}],\n'
        '  "max_tokens": 10,"model" : "msgmodel-haiku-4-5", "zeta": 1.50, "alpha": [1,2 ,3]}'
    ).encode()
    async with http.post(gateway.url + "/v1/messages", data=raw, headers=MSG_HEADERS) as answer:
        assert answer.status == 200
    assert gateway.last_upstream_request().body == raw


async def test_hop_by_hop_headers_stay_on_their_hop(gateway, http):
    headers = {
        **MSG_HEADERS,
        "Connection": "keep-alive, X-Private-Hop",
        "X-Private-Hop": "1",
        "Keep-Alive": "timeout=5",
        "TE": "trailers",
        "Proxy-Authorization": "Basic eA==",
        "Upgrade": "h2c",
        "X-End-To-End": "kept",
    }
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    async with http.post(gateway.url + "/v1/messages", json=body, headers=headers) as answer:
        assert answer.status == 200
    record = gateway.last_upstream_request()
    for name in ("X-Private-Hop", "Keep-Alive", "TE", "Proxy-Authorization", "Upgrade"):
        assert record.header(name) is None, name
    assert record.header("X-End-To-End") == "kept"
    assert record.header("Connection") in (None, "keep-alive")


async def test_forwarding_headers_and_request_id(gateway, http):
    body = {"model": "respmodel-4o", "input": "x"}
    headers = {"Authorization": "Bearer sk-demo-key", "X-Forwarded-For": "203.0.113.7"}
    async with http.post(gateway.url + "/v1/responses", json=body, headers=headers) as answer:
        generated = answer.headers["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    record = gateway.last_upstream_request()
    assert record.header("X-Forwarded-For") == "203.0.113.7, 127.0.0.1"
    assert record.header("X-Forwarded-Proto") == "http"
    assert record.header("X-Forwarded-Host") == gateway.url.removeprefix("http://")
    assert record.header("X-Request-Id") == generated
    async with http.post(
        gateway.url + "/v1/responses", json=body, headers={**headers, "X-Request-Id": "caller-chosen-42"}
    ) as answer:
        assert answer.headers["X-Request-Id"] == "caller-chosen-42"
    assert gateway.last_upstream_request().header("X-Request-Id") == "caller-chosen-42"


async def test_query_string_is_kept_minus_the_client_key(gateway, http):
    url = gateway.url + "/v1beta/models/genmodel-2.0-flash:generateContent?alt=json&key=sk-demo-key&note=a%20b"
    async with http.post(url, json={"contents": [{"parts": [{"text": "x"}]}]}) as answer:
        assert answer.status == 200
    assert gateway.last_upstream_request().query == "alt=json&note=a%20b&key=sim-upstream-key"


async def test_compressed_answer_is_returned_once_encoded_with_a_matching_length(gateway):
    body = {"model": "respmodel-4o", "input": "x"}
    async with aiohttp.ClientSession(auto_decompress=False) as raw_http:
        async with raw_http.post(
            gateway.url + "/v1/responses",
            json=body,
            headers={"Authorization": "Bearer sk-demo-key", "Accept-Encoding": "gzip"},
        ) as answer:
            data = await answer.read()
            assert answer.headers["Content-Encoding"] == "gzip"
            assert int(answer.headers["Content-Length"]) == len(data)
        assert b'"object":"response"' in gzip.decompress(data)
        async with raw_http.post(
            gateway.url + "/v1/responses",
            json=body,
            headers={"Authorization": "Bearer sk-demo-key", "Accept-Encoding": "identity"},
        ) as answer:
            assert "Content-Encoding" not in answer.headers
            assert b'"object":"response"' in await answer.read()


async def test_every_answer_carries_the_gateway_overhead(gateway, http):
    async with http.post(
        gateway.url + "/v1/responses",
        json={"model": "respmodel-4o", "input": "x"},
        headers={"Authorization": "Bearer sk-demo-key"},
    ) as answer:
        timing = answer.headers["Server-Timing"]
    match = re.match(r'gateway;dur=([\d.]+);desc="gateway overhead", upstream;dur=([\d.]+)$', timing)
    assert match and float(match[1]) > 0 and float(match[2]) > 0  # both parts measured, neither left at zero


async def test_upstream_error_status_and_body_pass_through(gateway, http):
    async with http.post(
        gateway.url + "/v1/responses",
        json={"model": "respmodel-4o", "input": "x"},
        headers={"Authorization": "Bearer sk-demo-key", "x-sim-fault": "status=503"},
    ) as answer:
        assert answer.status == 503
        assert (await answer.json())["error"]["message"] == "simulated upstream fault 503"


async def test_unreachable_upstream_is_a_502_in_the_format_shape(start_gateway, http):
    gw = await start_gateway("channels: [{name: down, base_url: 'http://127.0.0.1:1'}]")
    async with http.post(
        gw.url + "/v1beta/models/genmodel-2.0-flash:generateContent?key=sk-demo-key",
        json={"contents": [{"parts": [{"text": "x"}]}]},
    ) as answer:
        assert answer.status == 502
        assert (await answer.json())["error"]["status"] == "UNAVAILABLE"


async def test_slow_first_byte_is_a_504(start_gateway, http):
    gw = await start_gateway("channels: [{name: slow, base_url: simulator, timeouts: {first_byte_s: 0.2}}]")
    async with http.post(
        gw.url + "/v1/messages",
        headers={**MSG_HEADERS, "x-sim-latency-ms": "2000"},
        json={"model": "msgmodel-haiku-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    ) as answer:
        assert answer.status == 504
        assert (await answer.json())["error"]["type"] == "server_error"


STREAM_FAULTS = [
    ("stall-after=2", "upstream stream stalled"),
    ("drop-after=2", "upstream closed the stream"),
]


@pytest.mark.parametrize(("fault", "message"), STREAM_FAULTS)
async def test_a_broken_stream_ends_with_the_formats_error_event(start_gateway, http, fault, message):
    gw = await start_gateway("channels: [{name: s, base_url: simulator, timeouts: {idle_s: 0.3}}]")
    body = {
        "model": "msgmodel-haiku-4-5",
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    async with http.post(gw.url + "/v1/messages", json=body, headers={**MSG_HEADERS, "x-sim-fault": fault}) as answer:
        text = (await answer.read()).decode()
    events = [e for e in text.split("\n\n") if e.strip()]
    assert events[0].startswith("event: message_start")
    assert events[-1].startswith("event: error\ndata: ")
    assert '"type":"error"' in events[-1] and message in events[-1]


async def test_unknown_path_and_wrong_method_are_json_errors_naming_the_request_id(gateway, http):
    async with http.get(gateway.url + "/v2/unknown", headers={"X-Request-Id": "my-404"}) as answer:
        assert answer.status == 404 and "error" in await answer.json()
        assert answer.headers["X-Request-Id"] == "my-404"
    async with http.get(gateway.url + "/v1/messages", headers={"X-Request-Id": "bad id\u00e9"}) as answer:
        assert answer.status == 405 and answer.headers["Allow"] == "POST"
        assert (await answer.json())["error"]["type"] == "invalid_request_error"
        assert answer.headers["X-Request-Id"] not in ("", "bad id\u00e9")  # not a safe one: the gateway's own


@pytest.mark.parametrize(
    ("path", "shape", "served"),
    [
        ("/v1/completions", "generic", ["POST /v1/messages", "POST /v1/chat/completions"]),
        ("/v1beta/models/genmodel-2.0-flash:embedContent", "content", ["POST /v1beta/models/{model}:generateContent"]),
        ("/v1/models/genmodel-2.0-flash:embedContent", "content", ["POST /v1/models/{model}:generateContent"]),
        ("/v1/messages/batches", "messages", ["POST /v1/messages", "POST /v1/messages/count_tokens"]),
        ("/v1/responses/input_tokens", "generic", ["POST /v1/responses", "GET /v1/responses/{response_id}"]),
    ],
)
async def test_a_404_is_in_the_shape_of_the_paths_format_and_names_what_is_served(
    gateway,
    http,
    path,
    shape,
    served,
):
    """What is served near the path (all of it for a path near none): an SDK's exception quotes
    the message whole, and every route made it 1.5 KB."""
    async with http.post(gateway.url + path, json={}) as answer:
        assert answer.status == 404
        error = (await answer.json())["error"]
    if shape == "content":
        assert error["code"] == 404 and error["status"] == "NOT_FOUND"
    elif shape == "messages":
        assert error["type"] == "not_found_error"
    else:
        assert error["type"] == "not_found_error" and error["code"] == "not_found"
    assert all(route in error["message"] for route in served), error["message"]
    assert len(error["message"]) < 400 or shape == "generic" and path == "/v1/completions"


@pytest.mark.parametrize("version", ["v1", "v1beta"])
async def test_content_generation_is_served_under_v1_as_under_v1beta(start_gateway, http, version):
    gw = await start_gateway("channels: [{name: sim, base_url: simulator, credential: up}]")
    body = {"contents": [{"parts": [{"text": "hi"}]}]}
    async with http.post(
        f"{gw.url}/{version}/models/genmodel-2.0-flash:generateContent",
        json=body,
        headers={"x-goog-api-key": "sk-demo-key"},
    ) as answer:
        assert answer.status == 200
        assert (await answer.json())["candidates"][0]["content"]["parts"][0]["text"]
    async with http.post(
        f"{gw.url}/{version}/models/genmodel-2.0-flash:streamGenerateContent?alt=sse",
        json=body,
        headers={"x-goog-api-key": "sk-demo-key"},
    ) as answer:
        assert answer.status == 200 and answer.content_type == "text/event-stream"
        await answer.read()
    assert gw.last_upstream_request("sim").path == f"/{version}/models/genmodel-2.0-flash:streamGenerateContent"


async def test_a_channel_may_name_the_content_api_version_it_is_sent(start_gateway, http):
    gw = await start_gateway("channels: [{name: sim, base_url: simulator, content_api_version: v1beta}]")
    async with http.post(
        f"{gw.url}/v1/models/genmodel-2.0-flash:generateContent?key=sk-demo-key",
        json={"contents": [{"parts": [{"text": "hi"}]}]},
    ) as answer:
        assert answer.status == 200
    assert gw.last_upstream_request("sim").path == "/v1beta/models/genmodel-2.0-flash:generateContent"


MESSAGE = {"model": "msgmodel-haiku-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


async def test_an_idle_connection_the_upstream_dropped_costs_the_client_nothing(start_gateway, http):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        await upstream.read_request(reader)
        writer.write(OK)
        await writer.drain()
        if number > 1:
            while True:
                await upstream.read_request(reader)
                writer.write(OK)
                await writer.drain()
        # the first connection is closed while the gateway keeps it idle

    async with Scripted(handler) as upstream:
        gw = await start_gateway(
            f"channels: [{{name: one, base_url: '{upstream.url}'}}]\nresilience: {{max_attempts: 1}}"
        )
        for _ in range(2):
            async with http.post(gw.url + "/v1/messages", headers=MSG_HEADERS, json=MESSAGE) as answer:
                assert answer.status == 200
                assert await answer.json() == {"ok": True}
            await asyncio.sleep(0.05)
        assert upstream.connections == 2 and len(upstream.requests) == 2  # checked before reuse: never written to


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
        b"SMTP ready\r\n\r\n",
    ],
)
async def test_a_malformed_upstream_answer_is_a_502_in_the_format_shape(start_gateway, http, wire):
    async with scripted([wire]) as upstream:
        gw = await start_gateway(f"channels: [{{name: odd, base_url: '{upstream.url}'}}]")
        async with http.post(gw.url + "/v1/messages", headers=MSG_HEADERS, json=MESSAGE) as answer:
            assert answer.status == 502
            body = await answer.json()
        assert body["error"]["type"] == "server_error" and body["error"]["code"] == "upstream_bad_answer"


async def test_a_credential_that_would_inject_a_header_is_refused_at_load(start_gateway):
    """A credential with a line break would write a header of its own upstream: the config is
    refused (at start, and at a reload, which keeps the running config), never sent."""
    async with scripted([OK]) as upstream:
        with pytest.raises(ConfigError, match=r"channels\[0\]\.credential: holds a line break"):
            await start_gateway(
                f"channels: [{{name: one, base_url: '{upstream.url}', credential: \"key\\r\\nX-Injected: 1\"}}]"
            )
        assert upstream.requests == []


@pytest.mark.parametrize(
    "usage",
    [
        b'{"input_tokens": -5}',
        b'{"input_tokens": 1e400, "output_tokens": 99999999999999999999999}',
        b'{"input_tokens": true}',
        b"[]",
    ],
)
async def test_odd_usage_from_an_upstream_is_no_usage_never_a_500(start_gateway, http, usage):
    body = b'{"id":"msg_1","usage":' + usage + b"}"
    wire = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    async with scripted([wire]) as upstream:
        gw = await start_gateway(f"channels: [{{name: odd, base_url: '{upstream.url}'}}]")
        async with http.post(gw.url + "/v1/messages", headers=MSG_HEADERS, json=MESSAGE) as answer:
            assert answer.status == 200
            assert await answer.read() == body


@pytest.mark.parametrize(
    ("headers", "query", "shape"),
    [
        ({"Authorization": "Bearer sk-demo-key"}, "", "response"),
        ({"x-api-key": "sk-demo-key", "anthropic-version": "2023-06-01"}, "", "messages"),
        ({"x-goog-api-key": "sk-demo-key"}, "", "content"),
        ({}, "?key=sk-demo-key", "content"),
    ],
)
async def test_v1_models_answers_in_the_shape_of_the_sdk_asking(gateway, http, headers, query, shape):
    async with http.get(f"{gateway.url}/v1/models{query}", headers=headers) as answer:
        listed = await answer.json()
    async with http.get(f"{gateway.url}/v1/models/msgmodel-haiku-4-5{query}", headers=headers) as answer:
        one = await answer.json()
    wrong = {name: value.replace("sk-demo-key", "wrong") for name, value in headers.items()}
    async with http.get(f"{gateway.url}/v1/models{query.replace('sk-demo-key', 'wrong')}", headers=wrong) as answer:
        refused = await answer.json()
    if shape == "response":
        assert listed["object"] == "list" and "respmodel-4o" in [m["id"] for m in listed["data"]]
        assert one == {"id": "msgmodel-haiku-4-5", "object": "model", "created": 0, "owned_by": "modelgate"}
    elif shape == "messages":
        assert {m["id"][:9] for m in listed["data"]} == {"msgmodel-"} and one["type"] == "model"
        assert refused["error"]["type"] == "authentication_error"  # its errors in its shape too
    else:
        assert "models/genmodel-2.0-flash" in [m["name"] for m in listed["models"]]
    if shape == "content":
        assert one["error"]["status"] == "NOT_FOUND"  # a message model is not a content-generation one
        assert refused["error"]["status"] == "UNAUTHENTICATED"


async def test_a_model_the_key_may_not_use_is_neither_listed_nor_found(start_gateway, http):
    gw = await start_gateway(
        "keys: [{name: narrow, key: narrow-key-01, models: ['msgmodel-haiku-*']}]\n"
        "channels: [{name: sim, base_url: simulator}]\n"
    )
    bearer = {"Authorization": "Bearer narrow-key-01"}
    async with http.get(gw.url + "/v1/models", headers=bearer) as answer:
        assert [m["id"] for m in (await answer.json())["data"]] == ["msgmodel-haiku-4-5"]
    async with http.get(gw.url + "/v1/models/msgmodel-opus-4-5", headers=bearer) as answer:
        assert answer.status == 404


@pytest.mark.parametrize(
    "headers",
    [
        {"x-api-key": "sk-demo-key", "x-goog-api-key": "another-key"},
        {"Authorization": "Bearer another-key", "x-goog-api-key": "sk-demo-key"},
    ],
)
async def test_v1_models_compares_keys_in_every_place_it_reads(gateway, http, headers):
    async with http.get(gateway.url + "/v1/models", headers=headers) as answer:
        assert answer.status == 401
        assert "two different API keys" in (await answer.json())["error"]["message"]
