"""Channels: priority and weight decide, models match globs, renames reach the upstream, unserved models get a 4xx."""

from __future__ import annotations

from collections import Counter

import aiohttp
import pytest

from tests.conftest import MESSAGE_HEADERS

TWO_CHANNELS = """
channels:
  - {{name: a, base_url: simulator, credential: key-a, models: ["msgmodel-*"], priority: {pa}, weight: {wa}}}
  - {{name: b, base_url: simulator, credential: key-b, models: ["msgmodel-sonnet-*"], priority: {pb}, weight: {wb}}}
"""
MESSAGE = {"model": "msgmodel-sonnet-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
HEADERS = {**MESSAGE_HEADERS, "x-sim-output-tokens": "1"}


async def served_by(gw, http, count: int) -> Counter[str]:
    for _ in range(count):
        async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=HEADERS) as answer:
            assert answer.status == 200
    return Counter({name: len(gw.sim(name).requests) for name in ("a", "b")})


async def test_lower_priority_number_wins(start_gateway, http):
    gw = await start_gateway(TWO_CHANNELS.format(pa=1, wa=1, pb=0, wb=1))
    assert await served_by(gw, http, 20) == Counter({"b": 20, "a": 0})


async def test_weight_splits_traffic_within_a_priority(start_gateway, http):
    gw = await start_gateway(TWO_CHANNELS.format(pa=0, wa=3, pb=0, wb=1))
    counts = await served_by(gw, http, 400)
    # Expected 300:100; with 400 draws the share of a stays within 0.66-0.84 with overwhelming odds.
    assert 0.66 <= counts["a"] / 400 <= 0.84, counts


async def test_model_globs_choose_the_channel(start_gateway, http):
    gw = await start_gateway(TWO_CHANNELS.format(pa=1, wa=1, pb=0, wb=1))
    body = {**MESSAGE, "model": "msgmodel-opus-4-5"}  # only a's glob matches
    async with http.post(gw.url + "/v1/messages", json=body, headers=HEADERS) as answer:
        assert answer.status == 200
    assert len(gw.sim("a").requests) == 1 and len(gw.sim("b").requests) == 0


UNSERVED = [
    (
        "/v1/messages",
        MESSAGE_HEADERS,
        {**MESSAGE, "model": "nope"},
        {
            "error": {
                "type": "not_found_error",
                "message": "model 'nope' is not served by this gateway",
                "code": "model_not_found",
            }
        },
    ),
    (
        "/v1beta/models/nope:generateContent?key=sk-demo-key",
        {},
        {"contents": [{"parts": [{"text": "x"}]}]},
        {
            "error": {
                "code": 404,
                "message": "model 'nope' is not served by this gateway",
                "status": "model_not_found",
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "model_not_found",
                        "domain": "modelgate",
                    }
                ],
            }
        },
    ),
    (
        "/v1/responses",
        {"Authorization": "Bearer sk-demo-key"},
        {"model": "nope", "input": "x"},
        {
            "error": {
                "message": "model 'nope' is not served by this gateway",
                "type": "not_found_error",
                "param": None,
                "code": "model_not_found",
            }
        },
    ),
]


@pytest.mark.parametrize(("path", "headers", "body", "expected"), UNSERVED)
async def test_unserved_model_gets_a_404_in_the_endpoint_shape(start_gateway, http, path, headers, body, expected):
    gw = await start_gateway("""
        channels: [{name: only, base_url: simulator, models: ["msgmodel-*", "respmodel-9"]}]
    """)
    async with http.post(gw.url + path, json=body, headers=headers) as answer:
        assert answer.status == 404
        got = await answer.json()
    if "status" in expected["error"]:
        expected["error"]["status"] = "NOT_FOUND"
    assert got == expected
    assert len(gw.sim("only").requests) == 0


async def test_missing_model_is_a_400(gateway, http):
    async with http.post(
        gateway.url + "/v1/responses", json={"input": "x"}, headers={"Authorization": "Bearer sk-demo-key"}
    ) as answer:
        assert answer.status == 400
        assert (await answer.json())["error"]["type"] == "invalid_request_error"


async def test_invalid_json_is_a_400_in_the_format_shape(gateway, http):
    async with http.post(
        gateway.url + "/v1beta/models/genmodel-2.0-flash:generateContent?key=sk-demo-key", data=b"{nope"
    ) as answer:
        assert answer.status == 400
        assert (await answer.json())["error"]["status"] == "INVALID_ARGUMENT"


async def test_endpoints_restrict_a_channel_to_some_routes(start_gateway, http):
    """A channel with `endpoints` is sent requests of those routes only: an images request finds
    no channel; a chat request of another format reaches it in its route's format, translated
    (docs/translation.md)."""
    gw = await start_gateway("""
        channels:
          - {name: chat, base_url: simulator, endpoints: [messages]}
    """)
    bearer = {"Authorization": "Bearer sk-demo-key"}
    async with http.post(
        gw.url + "/v1/images/generations", json={"model": "imagegen-2", "prompt": "x"}, headers=bearer
    ) as answer:
        assert answer.status == 404
    async with http.post(
        gw.url + "/v1/responses", json={"model": "respmodel-4o", "input": "x"}, headers=bearer
    ) as answer:
        assert answer.status == 200 and answer.headers["X-Upstream-Format"] == "messages"
    async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=HEADERS) as answer:
        assert answer.status == 200 and "X-Upstream-Format" not in answer.headers
    assert {r.path for r in gw.sim("chat").requests} == {"/v1/messages"}


RENAMING = """
channels:
  - name: up
    base_url: simulator
    rename: {msgmodel-sonnet-4-5: upstream-sonnet, genmodel-2.0-flash: upstream-flash, imagegen-2: upstream-image}
"""


async def test_rename_reaches_the_upstream_in_a_json_body(start_gateway, http):
    gw = await start_gateway(RENAMING)
    async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=HEADERS) as answer:
        assert answer.status == 200
    record = gw.last_upstream_request("up")
    assert b'"model":"upstream-sonnet"' in record.body


async def test_rename_reaches_the_upstream_in_the_path(start_gateway, http):
    gw = await start_gateway(RENAMING)
    async with http.post(
        gw.url + "/v1beta/models/genmodel-2.0-flash:generateContent?key=sk-demo-key",
        json={"contents": [{"parts": [{"text": "x"}]}]},
    ) as answer:
        assert answer.status == 200
    assert gw.last_upstream_request("up").path == "/v1beta/models/upstream-flash:generateContent"


async def test_rename_reaches_the_upstream_in_a_multipart_form(start_gateway, http):
    gw = await start_gateway(RENAMING)
    form = aiohttp.FormData()
    form.add_field("model", "imagegen-2")
    form.add_field("prompt", "p")
    form.add_field("image", b"\x89PNG\r\n\x1a\nrest", filename="a.png", content_type="image/png")
    async with http.post(
        gw.url + "/v1/images/edits", data=form, headers={"Authorization": "Bearer sk-demo-key"}
    ) as answer:
        assert answer.status == 200, await answer.text()
    assert gw.last_upstream_request("up").form["model"] == "upstream-image"


async def test_a_channel_whose_endpoints_name_only_part_of_a_format_takes_no_translated_request(start_gateway, http):
    """`endpoints: [generate_content]` serves whole answers of content generation only: a stream of
    that format, or a chat request (which may stream), is never sent there."""
    gw = await start_gateway("channels: [{name: part, base_url: simulator, endpoints: [generate_content]}]")
    key = {"x-goog-api-key": "sk-demo-key"}
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    async with http.post(
        gw.url + "/v1beta/models/genmodel-2.0-flash:generateContent", json=body, headers=key
    ) as answer:
        assert answer.status == 200
    path = "/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse"
    async with http.post(gw.url + path, json=body, headers=key) as answer:
        assert answer.status == 404
    chat = {"model": "genmodel-2.0-flash", "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(
        gw.url + "/v1/chat/completions", json=chat, headers={"Authorization": "Bearer sk-demo-key"}
    ) as answer:
        assert answer.status == 404
    assert [r.path for r in gw.sim("part").requests] == ["/v1beta/models/genmodel-2.0-flash:generateContent"]
