"""Spec section 4 and 5: every endpoint reaches its channel; the upstream sees the channel's key, never the client's."""

from __future__ import annotations

import pytest

CLIENT_KEY = "client-key-should-never-leave"
UPSTREAM_KEY = "upstream-secret-key"

CONFIG = f"""
keys: [{{name: client, key: {CLIENT_KEY}}}]
channels:
  - name: upstream
    base_url: simulator
    credential: {UPSTREAM_KEY}
    simulator: {{video_queued_s: 0, video_processing_s: 0, chunk_delay_ms: 0}}
"""


def assert_key_swapped(record, placement: str) -> None:
    everything = repr(record.headers) + record.query
    assert CLIENT_KEY not in everything
    if placement == "bearer":
        assert record.header("authorization") == f"Bearer {UPSTREAM_KEY}"
        assert record.header("x-api-key") is None
    elif placement == "x-api-key":
        assert record.header("x-api-key") == UPSTREAM_KEY
        assert record.header("authorization") is None
    elif placement == "query":
        assert f"key={UPSTREAM_KEY}" in record.query
    else:
        assert UPSTREAM_KEY not in everything


@pytest.fixture
async def gw(start_gateway):
    return await start_gateway(CONFIG)


BEARER = {"Authorization": f"Bearer {CLIENT_KEY}"}


@pytest.mark.parametrize("path", ["/v1/video/generations", "/v1/videos"])
async def test_video_submission_status_and_content_reach_the_channel(gw, http, path):
    async with http.post(
        gw.url + path, headers=BEARER, json={"model": "videogen-3.0-generate-001", "prompt": "a cat"}
    ) as answer:
        assert answer.status == 200
        task = await answer.json()
    assert task["object"] == "video" and task["id"] == task.get("task_id", task["id"])
    assert_key_swapped(gw.last_upstream_request("upstream"), "bearer")
    async with http.get(f"{gw.url}{path}/{task['id']}", headers=BEARER) as answer:
        assert answer.status == 200
        status = await answer.json()
    # endpoint 2 answers 2.3's shape; endpoint 4 the video object of the response SDK
    assert (status["data"]["status"] if path == "/v1/video/generations" else status["status"]) in (
        "succeeded",
        "completed",
    )
    assert_key_swapped(gw.last_upstream_request("upstream"), "bearer")
    async with http.get(f"{gw.url}/v1/videos/{task['id']}/content", headers=BEARER) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"] == "video/mp4"
        assert (await answer.read())[4:8] == b"ftyp"
    assert_key_swapped(gw.last_upstream_request("upstream"), "bearer")


async def test_image_generations_reach_the_channel(gw, http):
    async with http.post(
        gw.url + "/v1/images/generations",
        headers=BEARER,
        json={"model": "imagegen-2", "prompt": "a fox", "size": "1024x1024"},
    ) as answer:
        assert answer.status == 200
        body = await answer.json()
    assert body["data"][0]["b64_json"]
    assert_key_swapped(gw.last_upstream_request("upstream"), "bearer")


async def test_image_edits_multipart_reach_the_channel(gw, http):
    import aiohttp

    form = aiohttp.FormData()
    form.add_field("model", "imagegen-2")
    form.add_field("prompt", "make it blue")
    form.add_field("image[]", b"\x89PNG\r\n\x1a\n" + b"\x00" * 100, filename="a.png", content_type="image/png")
    form.add_field("image[]", b"\x89PNG\r\n\x1a\n" + b"\x01" * 100, filename="b.png", content_type="image/png")
    async with http.post(gw.url + "/v1/images/edits", headers=BEARER, data=form) as answer:
        assert answer.status == 200, await answer.text()
        assert (await answer.json())["data"]
    record = gw.last_upstream_request("upstream")
    assert record.form["model"] == "imagegen-2" and record.files == 2
    assert_key_swapped(record, "bearer")


async def test_image_edits_json_variant_reaches_the_channel(gw, http):
    body = {"model": "imagegen-2", "prompt": "p", "images": [{"image_url": "data:image/png;base64,iVBORw0KGgo="}]}
    async with http.post(gw.url + "/v1/images/edits", headers=BEARER, json=body) as answer:
        assert answer.status == 200
    assert_key_swapped(gw.last_upstream_request("upstream"), "bearer")


async def test_messages_reach_the_channel_with_x_api_key(gw, http):
    headers = {"x-api-key": CLIENT_KEY, "msgapi-version": "2023-06-01", "msgapi-beta": "a,b"}
    body = {"model": "msgmodel-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(gw.url + "/v1/messages", headers=headers, json=body) as answer:
        assert answer.status == 200
        assert (await answer.json())["type"] == "message"
    record = gw.last_upstream_request("upstream")
    assert_key_swapped(record, "x-api-key")
    assert record.header("msgapi-version") == "2023-06-01" and record.header("msgapi-beta") == "a,b"


@pytest.mark.parametrize("verb", ["generateContent", "streamGenerateContent"])
async def test_content_generation_reaches_the_channel_with_query_key(gw, http, verb):
    url = f"{gw.url}/v1beta/models/genmodel-2.0-flash:{verb}?alt=sse&key={CLIENT_KEY}"
    async with http.post(url, json={"contents": [{"parts": [{"text": "hi"}]}]}) as answer:
        assert answer.status == 200
        assert b"candidates" in await answer.read()
    record = gw.last_upstream_request("upstream")
    assert_key_swapped(record, "query")
    assert "alt=sse" in record.query
    assert record.path == f"/v1beta/models/genmodel-2.0-flash:{verb}"


async def test_responses_reach_the_channel(gw, http):
    async with http.post(
        gw.url + "/v1/responses", headers=BEARER, json={"model": "respmodel-4o", "input": "hi"}
    ) as answer:
        assert answer.status == 200
        assert (await answer.json())["object"] == "response"
    assert_key_swapped(gw.last_upstream_request("upstream"), "bearer")


async def test_login_passes_cookies_and_never_caches(gw, http):
    async with http.post(gw.url + "/api/user/login/2fa", json={}) as answer:
        assert answer.status == 200
        assert len(answer.headers.getall("Set-Cookie")) == 2
        assert answer.headers["Cache-Control"] == "no-store"
    assert_key_swapped(gw.last_upstream_request("upstream"), "none")


@pytest.mark.parametrize(
    "raw",
    [
        b'{"event":"paid",  "amount": 100}\n',
        # Names the gateway reads alike elsewhere (twice, in other case, escaped) are a sender's own here.
        b'{"model":"a","model":"b","Stream":"live","data":{"stream":1},"prev":{"stream":2},"si\\u007ae":1}',
    ],
)
async def test_webhook_body_and_signature_reach_the_backend_byte_exact(gw, http, raw):
    headers = {"Content-Type": "application/json", "Stripe-Signature": "t=1,v1=abc"}
    async with http.post(gw.url + "/api/stripe/webhook", data=raw, headers=headers) as answer:
        assert answer.status == 200
        echo = await answer.json()
    record = gw.last_upstream_request("upstream")
    assert record.body == raw and echo["provider"] == "stripe"
    assert echo["signature_headers"] == {"Stripe-Signature": "t=1,v1=abc"}


async def test_health_and_readiness(gw, http):
    async with http.get(gw.url + "/healthz") as answer:
        assert answer.status == 200
    async with http.get(gw.admin + "/readyz") as answer:
        assert answer.status == 200
        assert (await answer.json())["channels"] == [{"name": "upstream", "breaker": "closed", "failures_in_a_row": 0}]
