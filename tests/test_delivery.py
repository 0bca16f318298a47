"""Image URL delivery (spec 2.4-2.8, 4 rules 1-3, 7.3): stored Base64 images come back as signed URLs."""

from __future__ import annotations

import asyncio
import base64
import textwrap
from pathlib import Path

import aiohttp
import pytest

from simulator.media import png

KEY, PLAIN = "delivery-key-01", "no-delivery-key"
BEARER = {"Authorization": f"Bearer {KEY}"}
GENERATE = {"model": "imagegen-2", "prompt": "a fox", "size": "1024x1024", "n": 2}
CONTENT = {
    "contents": [{"parts": [{"text": "a fox"}]}],
    "generationConfig": {"responseFormat": {"image": {"delivery": "URI"}}},
}
SIGNING = "signing_keys: [{id: k1, secret: first-secret-0123456789}]"


def config(tmp_path: Path, delivery: str = "", keys: str = "") -> str:
    return textwrap.dedent(f"""
        channels: [{{name: simulator, base_url: simulator, accepts_response_format: false}}]
        keys:
          - {{name: images, key: {KEY}, url_delivery: true, labels: {{team: art}}}}
          - {{name: plain, key: {PLAIN}}}
          {keys}
        plugins:
          url_delivery: {{enabled: true, dir: "{tmp_path / "images"}", {SIGNING}, {delivery}}}
    """)


@pytest.fixture
async def gw(start_gateway, tmp_path):
    return await start_gateway(config(tmp_path))


async def fetch(url: str):
    async with aiohttp.ClientSession() as plain:  # no Authorization, as the spec asks
        async with plain.get(url) as answer:
            return answer.status, answer.headers.copy(), await answer.read()


async def test_url_replaces_base64_and_is_served_without_authorization(gw, http):
    async with http.post(
        gw.url + "/v1/images/generations", json={**GENERATE, "response_format": "url"}, headers=BEARER
    ) as answer:
        assert answer.status == 200
        body = await answer.json()
    assert len(body["data"]) == 2 and all(set(item) == {"url"} for item in body["data"])
    status, headers, data = await fetch(body["data"][0]["url"])
    assert status == 200 and data == png(1024, 1024)
    assert headers["Content-Type"] == "image/png" and int(headers["Content-Length"]) == len(data)
    max_age = int(headers["Cache-Control"].split("max-age=")[1].split(",")[0])
    assert 3590 <= max_age <= 3600 and headers["ETag"]
    async with http.get(body["data"][0]["url"], headers={"If-None-Match": headers["ETag"]}) as again:
        assert again.status == 304
    async with http.head(body["data"][0]["url"]) as head:  # link checkers and caches ask HEAD first
        assert head.status == 200 and head.headers["Content-Length"] == str(len(data))


async def test_native_upstream_urls_pass_through(start_gateway, http, tmp_path):
    gw = await start_gateway(config(tmp_path).replace(", accepts_response_format: false", ""))
    async with http.post(
        gw.url + "/v1/images/generations", json={**GENERATE, "response_format": "url"}, headers=BEARER
    ) as answer:
        url = (await answer.json())["data"][0]["url"]
    assert "/_sim/files/" in url  # the upstream's own URL, untouched
    import json

    assert json.loads(gw.last_upstream_request().body)["response_format"] == "url"


async def test_a_channel_without_response_format_never_receives_it(gw, http):
    async with http.post(
        gw.url + "/v1/images/generations", json={**GENERATE, "response_format": "url"}, headers=BEARER
    ) as answer:
        assert answer.status == 200
    assert b"response_format" not in gw.last_upstream_request().body


@pytest.mark.parametrize("response_format", [None, "b64_json"])
async def test_without_url_the_upstream_answer_is_untouched(gw, http, response_format):
    body = {**GENERATE, **({"response_format": response_format} if response_format else {})}
    async with http.post(gw.url + "/v1/images/generations", json=body, headers=BEARER) as answer:
        data = (await answer.json())["data"]
    assert base64.b64decode(data[0]["b64_json"]) == png(1024, 1024)


async def test_multipart_edits_get_urls_too(gw, http):
    form = aiohttp.FormData()
    for name, value in (("model", "imagegen-2"), ("prompt", "blue"), ("response_format", "url")):
        form.add_field(name, value)
    form.add_field("image", png(64, 64), filename="a.png", content_type="image/png")
    async with http.post(gw.url + "/v1/images/edits", data=form, headers=BEARER) as answer:
        assert answer.status == 200, await answer.text()
        url = (await answer.json())["data"][0]["url"]
    assert (await fetch(url))[0] == 200
    assert "response_format" not in gw.last_upstream_request().form


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        (lambda u: u.replace("sig=", "sig=0"), 403, "invalid_signature"),
        (lambda u: u.replace("kid=k1", "kid=k9"), 403, "invalid_signature"),
        (lambda u: u.split("?")[0], 403, "invalid_signature"),
        (lambda u: u.replace("exp=", "exp=9"), 403, "invalid_signature"),
    ],
)
async def test_a_tampered_url_is_a_403(gw, http, change, status, code):
    async with http.post(
        gw.url + "/v1/images/generations", json={**GENERATE, "response_format": "url"}, headers=BEARER
    ) as answer:
        url = (await answer.json())["data"][0]["url"]
    got, _, body = await fetch(change(url))
    assert got == status and code.encode() in body


async def test_an_expired_url_is_a_410(start_gateway, http, tmp_path):
    gw = await start_gateway(config(tmp_path, "ttl_s: 1"))
    async with http.post(
        gw.url + "/v1/images/generations", json={**GENERATE, "response_format": "url"}, headers=BEARER
    ) as answer:
        url = (await answer.json())["data"][0]["url"]
    await asyncio.sleep(1.2)
    status, headers, body = await fetch(url)
    assert status == 410 and headers["Content-Type"].startswith("application/json") and b"url_expired" in body


async def test_content_generation_uri_turns_inline_data_into_file_data(gw, http):
    url = f"{gw.url}/v1beta/models/genmodel-2.5-flash-image:generateContent?key={KEY}"
    async with http.post(url, json=CONTENT) as answer:
        assert answer.status == 200
        parts = (await answer.json())["candidates"][0]["content"]["parts"]
    file_data = parts[1]["fileData"]
    assert "inlineData" not in parts[1] and file_data["mimeType"] == "image/png"
    status, _, data = await fetch(file_data["fileUri"])
    assert status == 200 and data == png(256, 256)
    assert b"responseFormat" not in gw.last_upstream_request().body  # a gateway field, never forwarded


async def test_markdown_data_urls_in_text_are_replaced_too(gw, http):
    url = f"{gw.url}/v1beta/models/genmodel-2.5-flash-image:generateContent?key={KEY}"
    async with http.post(url, json=CONTENT, headers={"x-sim-image-markdown": "1"}) as answer:
        text = (await answer.json())["candidates"][0]["content"]["parts"][0]["text"]
    assert "data:image" not in text and text.startswith("Here it is: ![image](http")
    image_url = text.split("](")[1].split(")")[0]
    assert (await fetch(image_url))[2] == png(64, 64)


@pytest.mark.parametrize(
    ("path", "body", "key_place", "expected"),
    [
        (
            "/v1/images/generations",
            {**GENERATE, "response_format": "url"},
            "bearer",
            {"type": "server_error", "code": "image_url_delivery_unavailable"},
        ),
        (
            "/v1beta/models/genmodel-2.5-flash-image:generateContent",
            CONTENT,
            "query",
            {"code": 503, "status": "UNAVAILABLE"},
        ),
    ],
)
async def test_a_key_without_url_delivery_gets_503(gw, http, path, body, key_place, expected):
    headers = {"Authorization": f"Bearer {PLAIN}"} if key_place == "bearer" else {}
    url = gw.url + path + (f"?key={PLAIN}" if key_place == "query" else "")
    async with http.post(url, json=body, headers=headers) as answer:
        assert answer.status == 503
        assert expected.items() <= (await answer.json())["error"].items()
    assert len(gw.sim().requests) == 0


async def test_the_environment_switch_and_traffic_labels(start_gateway, http, tmp_path):
    gw = await start_gateway(config(tmp_path, "allow_labels: {team: art}").replace("enabled: true", "enabled: false"))
    async with http.post(
        gw.url + "/v1/images/generations", json={**GENERATE, "response_format": "url"}, headers=BEARER
    ) as answer:
        assert answer.status == 503
    labelled = await start_gateway(
        config(tmp_path, "allow_labels: {team: art}", keys="- {name: artist, key: artist-key-01, labels: {team: art}}")
    )
    async with http.post(
        labelled.url + "/v1/images/generations",
        json={**GENERATE, "response_format": "url"},
        headers={"Authorization": "Bearer artist-key-01"},
    ) as answer:
        assert answer.status == 200 and "url" in (await answer.json())["data"][0]


CONTENT_URL = f"/v1beta/models/genmodel-2.5-flash-image:generateContent?key={KEY}"


def images_request(gw):
    return gw.url + "/v1/images/generations", {**GENERATE, "response_format": "url"}, BEARER


def content_request(gw):
    return gw.url + CONTENT_URL, CONTENT, {}


def error_code(fmt: str, body: dict) -> str:
    return body["error"]["code"] if fmt == "images" else body["error"]["message"]


@pytest.mark.parametrize(("fmt", "build"), [("images", images_request), ("content", content_request)])
@pytest.mark.parametrize(("strict", "status"), [(False, 200), (True, 502)])
async def test_a_store_failure_falls_back_to_base64_or_fails_in_strict_mode(
    start_gateway, http, tmp_path, fmt, build, strict, status
):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the store's directory should be")
    text = config(tmp_path, f"strict: {str(strict).lower()}").replace(str(tmp_path / "images"), str(blocker / "images"))
    gw = await start_gateway(text)
    url, body, headers = build(gw)
    async with http.post(url, json=body, headers=headers) as answer:
        assert answer.status == status
        got = await answer.json()
        if strict:
            if fmt == "images":
                assert got["error"]["code"] == "image_url_delivery_failed"
            else:
                assert got["error"]["status"] == "UNAVAILABLE"
                assert got["error"]["details"][0]["reason"] == "image_url_delivery_failed"
        else:
            assert answer.headers["X-Image-Delivery-Fallback"] == "base64"
            if fmt == "images":
                assert base64.b64decode(got["data"][0]["b64_json"]) == png(1024, 1024)
            else:
                assert got["candidates"][0]["content"]["parts"][1]["inlineData"]["mimeType"] == "image/png"


@pytest.mark.parametrize(("fmt", "build"), [("images", images_request), ("content", content_request)])
async def test_a_store_without_room_is_refused_with_503(start_gateway, http, tmp_path, fmt, build):
    gw = await start_gateway(config(tmp_path, "min_free_mb: 1000000000"))
    url, body, headers = build(gw)
    async with http.post(url, json=body, headers=headers) as answer:
        assert answer.status == 503 and answer.headers["Retry-After"] == "60"
        got = await answer.json()
    reason = got["error"]["details"][0]["reason"] if fmt == "content" else got["error"]["code"]
    assert reason == "image_delivery_capacity_exhausted"
    assert len(gw.sim().requests) == 0


async def test_a_failing_store_is_refused_with_503_before_the_upstream_is_paid(start_gateway, http, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the store's directory should be")
    gw = await start_gateway(config(tmp_path).replace(str(tmp_path / "images"), str(blocker / "images")))
    statuses = []
    for _ in range(4):
        async with http.post(
            gw.url + "/v1/images/generations", json={**GENERATE, "response_format": "url"}, headers=BEARER
        ) as answer:
            statuses.append(answer.status)
            body = await answer.json()
    assert statuses == [200, 200, 200, 503]  # three fall back, then the store counts as down
    assert body["error"]["code"] == "image_delivery_store_unavailable"
    assert len(gw.sim().requests) == 3


@pytest.mark.parametrize(("fmt", "build"), [("images", images_request), ("content", content_request)])
async def test_an_answer_over_the_processing_limit_is_a_502(start_gateway, http, tmp_path, fmt, build):
    gw = await start_gateway(config(tmp_path, "max_response_mb: 0.0001"))
    url, body, headers = build(gw)
    async with http.post(url, json=body, headers=headers) as answer:
        assert answer.status == 502
        got = await answer.json()
    reason = got["error"]["details"][0]["reason"] if fmt == "content" else got["error"]["code"]
    assert reason == "image_response_too_large"


async def test_signing_keys_rotate_old_urls_live_until_their_key_is_dropped(start_gateway, http, tmp_path):
    gw = await start_gateway(config(tmp_path))
    async with http.post(
        gw.url + "/v1/images/generations", json={**GENERATE, "response_format": "url"}, headers=BEARER
    ) as answer:
        old_url = (await answer.json())["data"][0]["url"]
    config_path = Path(gw.owner.config_path)
    rotated = config(tmp_path).replace(
        SIGNING, "signing_keys: [{id: k2, secret: second-secret-0123456789}, {id: k1, secret: first-secret-0123456789}]"
    )
    config_path.write_text(rotated)
    assert await gw.owner.reload()
    assert (await fetch(old_url))[0] == 200
    async with http.post(
        gw.url + "/v1/images/generations", json={**GENERATE, "response_format": "url"}, headers=BEARER
    ) as answer:
        assert "kid=k2" in (await answer.json())["data"][0]["url"]
    config_path.write_text(
        config(tmp_path).replace(SIGNING, "signing_keys: [{id: k2, secret: second-secret-0123456789}]")
    )
    assert await gw.owner.reload()
    assert (await fetch(old_url))[0] == 403


async def test_a_url_minted_by_one_instance_is_served_by_another_over_redis(spawn, shared_redis, tmp_path):
    text = f"""
server: {{listen: "127.0.0.1:{{PORT}}", public_base_url: "http://placeholder"}}
state: {{backend: redis, url: "{shared_redis}"}}
keys: [{{name: images, key: {KEY}, url_delivery: true}}]
channels: [{{name: simulator, base_url: simulator, accepts_response_format: false}}]
plugins: {{url_delivery: {{enabled: true, store: redis, {SIGNING}}}}}
"""
    a, b = spawn("gateway", config=text), spawn("gateway", config=text)
    async with aiohttp.ClientSession() as http:
        async with http.post(
            a.url + "/v1/images/generations", json={**GENERATE, "response_format": "url"}, headers=BEARER
        ) as answer:
            url = (await answer.json())["data"][0]["url"]
    assert url.startswith("http://placeholder/images/")
    status, _, data = await fetch(url.replace("http://placeholder", b.url))
    assert status == 200 and data == png(1024, 1024)


def test_the_janitor_deletes_expired_blobs(tmp_path):
    import time

    from plugins.url_delivery.stores import Blob, LocalStore

    store = LocalStore(str(tmp_path))
    store.directory.mkdir(exist_ok=True)
    store._write("old", Blob(b"x", "image/png"), time.time() - 1)
    store._write("new", Blob(b"y", "image/png"), time.time() + 60)
    assert store.sweep() == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.bin", "new.json"]


@pytest.fixture
def s3_server():
    """An S3-compatible server (moto's server mode) on a loopback port, with a bucket."""
    import boto3
    from moto.server import ThreadedMotoServer

    from tests.conftest import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
    ).create_bucket(Bucket="images")
    yield endpoint
    server.stop()


S3_SETTINGS = (
    "store: s3, s3: {{bucket: images, endpoint_url: '{endpoint}', access_key_id: test, secret_access_key: test}}"
)


async def test_the_s3_store_hands_out_presigned_urls(start_gateway, http, tmp_path, s3_server):
    gw = await start_gateway(config(tmp_path, S3_SETTINGS.format(endpoint=s3_server)))
    async with http.post(
        gw.url + "/v1/images/generations", json={**GENERATE, "response_format": "url"}, headers=BEARER
    ) as answer:
        assert answer.status == 200
        url = (await answer.json())["data"][0]["url"]
    assert url.startswith(s3_server + "/images/modelgate/images/") and "X-Amz-Signature=" in url
    status, headers, data = await fetch(url)
    assert status == 200 and data == png(1024, 1024) and headers["Content-Type"] == "image/png"
    assert "X-Amz-Expires=3600" in url  # it expires with the delivery TTL (the bucket checks the signature)


async def test_a_url_minted_through_one_gateway_process_is_fetched_from_shared_s3(spawn, tmp_path, s3_server):
    text = f"""
server: {{listen: "127.0.0.1:{{PORT}}"}}
keys: [{{name: images, key: {KEY}, url_delivery: true}}]
channels: [{{name: simulator, base_url: simulator, accepts_response_format: false}}]
plugins: {{url_delivery: {{enabled: true, {S3_SETTINGS.format(endpoint=s3_server)}}}}}
"""
    a = spawn("gateway", config=text)
    async with aiohttp.ClientSession() as http:
        async with http.post(
            a.url + "/v1/images/generations", json={**GENERATE, "response_format": "url"}, headers=BEARER
        ) as answer:
            url = (await answer.json())["data"][1]["url"]
    a.proc.terminate()  # the minting process is gone; the object store still serves the URL
    a.proc.wait(timeout=10)
    status, _, data = await fetch(url)
    assert status == 200 and data == png(1024, 1024)


def test_the_s3_janitor_deletes_expired_objects(s3_server):
    import asyncio as aio
    import time

    from plugins.url_delivery.stores import Blob, S3Store

    store = S3Store("images", "janitor/", s3_server, "us-east-1", "test", "test")
    aio.run(store.put("short", Blob(b"x", "image/png"), 1))
    aio.run(store.put("long", Blob(b"y", "image/png"), 3600))
    assert store.sweep(now=time.time() + 5) == 1
    assert aio.run(store.get("short")) is None and aio.run(store.get("long")) is not None


async def test_a_reload_keeps_one_janitor_for_the_local_store(start_gateway, tmp_path):
    from plugins.url_delivery.stores import LocalStore

    gw = await start_gateway(config(tmp_path))
    store = next(r for r in gw.owner.resources.values() if isinstance(r, LocalStore))
    janitor = store._janitor.task
    assert await gw.owner.reload() and await gw.owner.reload()
    assert store._janitor.task is janitor and not janitor.done()


@pytest.mark.parametrize(
    "route, body, answer",
    [
        ("/v1/images/generations", GENERATE, b'{"data":5}'),
        ("/v1/images/generations", GENERATE, b'{"data":[5,"x",null,{"b64_json":7}]}'),
        ("/v1beta/models/genmodel-2.5-flash-image:generateContent", CONTENT, b'{"candidates":5}'),
        (
            "/v1beta/models/genmodel-2.5-flash-image:generateContent",
            CONTENT,
            b'{"candidates":[{"content":{"parts":5}}]}',
        ),
        ("/v1beta/models/genmodel-2.5-flash-image:generateContent", CONTENT, b'{"candidates":[{"content":5},7]}'),
    ],
)
async def test_an_upstream_answer_of_another_shape_passes_through_untouched(
    start_gateway,
    http,
    tmp_path,
    route,
    body,
    answer,
):
    from tests.scripted_upstream import scripted

    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(answer)
    async with scripted([head + answer]) as upstream:
        gw = await start_gateway(config(tmp_path).replace("base_url: simulator", f"base_url: '{upstream.url}'"))
        headers = {**BEARER, "x-goog-api-key": KEY} if "generateContent" in route else BEARER
        payload = {**body, "response_format": "url"} if "images" in route else body
        async with http.post(gw.url + route, json=payload, headers=headers) as sent:
            assert sent.status == 200 and await sent.read() == answer  # the upstream's, never a 500
