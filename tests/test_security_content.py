"""Stored content is inert, and the links the gateway hands out point where it says, not where a
client's Host header does. (docs/security.md; each numbered case is an attack that once worked,
replayed through real sockets against an upstream that records the exact request line it was sent.)"""

from __future__ import annotations

import base64
import json

import pytest

from tests.raw_http import Answerer, Received, json_answer, recording_upstream, send_raw, spec_answer
from tests.security_cases import (  # noqa: F401 (fixtures, taken by name)
    ALICE,
    PNG,
    VIDEO,
    bearer,
    config,
    get,
    gw,
    post,
    submit,
    upstream,
)


def content_answer(mime: str, data: bytes) -> Answerer:
    def answer(received: Received) -> bytes:
        return json_answer(
            200,
            {
                "candidates": [
                    {
                        "content": {
                            "parts": [{"inlineData": {"mimeType": mime, "data": base64.b64encode(data).decode()}}]
                        }
                    }
                ]
            },
        )

    return answer


DELIVERY = {
    "contents": [{"parts": [{"text": "a fox"}]}],
    "generationConfig": {"responseFormat": {"image": {"delivery": "URI"}}},
}


@pytest.mark.parametrize(
    ("mime", "data", "stored"),
    [
        ("text/html", b"<html><script>alert(document.cookie)</script></html>", None),
        ("image/svg+xml", b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>', None),
        ("image/png", b"<script>alert(1)</script>", None),  # declared an image, is not one
        ("text/html", PNG, "image/png"),  # a PNG whatever it is called
        ("image/png", PNG, "image/png"),
    ],
)
async def test_5_only_raster_images_are_stored_and_served_inert(start_gateway, tmp_path, mime, data, stored):
    server, _ = recording_upstream(content_answer(mime, data))
    async with server:
        gw = await start_gateway(config(server.url, f'plugins: {{url_delivery: {{enabled: true, dir: "{tmp_path}"}}}}'))
        answer = await send_raw(
            gw.url,
            *post(
                f"/v1beta/models/genmodel-2.5-flash-image:generateContent?key={ALICE}",
                "",
                json.dumps(DELIVERY).encode(),
            ),
        )
        assert answer.status == 200, answer.body
        part = answer.json()["candidates"][0]["content"]["parts"][0]
        if stored is None:
            assert base64.b64decode(part["inlineData"]["data"]) == data  # stays Base64, in the answer only
            assert answer.headers["x-image-delivery-fallback"] == "base64"
            return
        assert part["fileData"]["mimeType"] == stored
        url = part["fileData"]["fileUri"]
        served = await send_raw(gw.url, f"GET {url.split(gw.url.split('//')[1])[1]} HTTP/1.1".encode())
        assert served.status == 200 and served.body == data
        assert served.headers["content-type"] == stored
        assert served.headers["x-content-type-options"] == "nosniff"
        assert "default-src 'none'" in served.headers["content-security-policy"]
        assert "sandbox" in served.headers["content-security-policy"]


async def test_9_signed_urls_ignore_the_clients_host(start_gateway, upstream, tmp_path):
    server, _ = recording_upstream(content_answer("image/png", PNG))
    async with server:
        for opt_in, expected in ((False, None), (True, "http://evil.example/")):
            extra = (
                f'plugins: {{url_delivery: {{enabled: true, dir: "{tmp_path}"}}}}\n'
                f"server: {{base_url_from_host: {str(opt_in).lower()}}}"
            )
            gw = await start_gateway(config(server.url, extra))
            answer = await send_raw(
                gw.url,
                *post(
                    f"/v1beta/models/genmodel-2.5-flash-image:generateContent?key={ALICE}",
                    "Host: evil.example\r\n",
                    json.dumps(DELIVERY).encode(),
                ),
            )
            url = answer.json()["candidates"][0]["content"]["parts"][0]["fileData"]["fileUri"]
            assert url.startswith(expected or gw.url + "/images/"), url


async def test_9_video_content_urls_ignore_the_clients_host(start_gateway):
    def done(received: Received) -> bytes:
        if received.method == "GET":
            return json_answer(200, {"task_id": "task_9", "status": "completed", "url": "https://cdn.example/v.mp4"})
        return spec_answer(received)

    server, _ = recording_upstream(done)
    async with server:
        gw = await start_gateway(config(server.url))
        await submit(gw.url, ALICE, "task_9")
        answer = await send_raw(
            gw.url, f"GET /v1/video/generations/task_9 HTTP/1.1\r\n{bearer(ALICE)}Host: evil.example".encode()
        )
    assert answer.status == 200
    assert answer.json()["data"]["url"] == f"{gw.url}/v1/videos/task_9/content"


async def test_a_status_the_download_asks_for_that_cannot_be_read_is_no_500(start_gateway):
    def odd(received: Received) -> bytes:
        if received.method == "POST":
            return json_answer(200, {"task_id": "task_odd", "status": "queued"})
        if received.path.endswith("/content"):
            return b"HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: 4\r\n\r\nmp4!"
        return json_answer(
            200, {"data": {"status": "completed", "url": "x", "metadata": {"rai_media_filtered_count": "many"}}}
        )

    server, _ = recording_upstream(odd)
    async with server:
        gw = await start_gateway(config(server.url))
        await send_raw(gw.url, *post("/v1/videos", bearer(ALICE), VIDEO))
        download = await get(gw.url, "/v1/videos/task_odd/content", ALICE)
        assert download.status == 404 and download.json()["error"]["code"] == "content_filtered"
        polled = await get(gw.url, "/v1/videos/task_odd", ALICE)
        assert polled.status == 200 and polled.json()["error"]["code"] == "content_filtered"
