"""A trustworthy edge (docs/security.md): the upstream request is built, not copied; tenants are
isolated; no key leaks. Each numbered case is an attack that once worked, replayed through real
sockets against an upstream that records the exact request line it was sent."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import re
from urllib.parse import quote, unquote

import pytest

from proxy.request.target import PARAM_GRAMMAR
from proxy.wire.routes import ROUTES
from tests.raw_http import Answerer, Received, json_answer, recording_upstream, send_raw, spec_answer

ALICE, ALICE_TOO, BOB, GEN_ONLY = "sk-alice-0000001", "sk-alice-0000002", "sk-bob-00000001", "sk-gen-00000001"
SECRET = "upstream-secret-9f8e7d"  # the channel's credential
LIMITED, CHEAP = "sk-limited-000001", "sk-cheap-0000001"


TENANTS = f"""
  - {{name: alice, key: {ALICE}, labels: {{tenant: team-a}}, url_delivery: true}}
  - {{name: alice-too, key: {ALICE_TOO}, labels: {{tenant: team-a}}}}
  - {{name: bob, key: {BOB}, url_delivery: true}}
  - {{name: gen-only, key: {GEN_ONLY}, models: ["genmodel-*"]}}
  - {{name: cheap, key: {CHEAP}, models: ["imagegen-1"]}}"""


def config(upstream_url: str, extra: str = "", keys: str = TENANTS) -> str:
    return f"""
keys: {keys}
channels: [{{name: up, base_url: "{upstream_url}", credential: {SECRET}}}]
observability: {{logging: {{access_log: false}}}}
{extra}
"""


@pytest.fixture
async def upstream():
    server, received = recording_upstream()
    async with server:
        yield server, received


@pytest.fixture
async def gw(start_gateway, upstream):
    return await start_gateway(config(upstream[0].url))


def bearer(key: str) -> str:
    return f"Authorization: Bearer {key}\r\n"


VIDEO = b'{"model":"videogen-3.0-generate-001","prompt":"waves"}'
CONTENT = b'{"contents":[{"parts":[{"text":"hi"}]}]}'


def post(target: str, headers: str, body: bytes) -> tuple[bytes, bytes]:
    head = f"POST {target} HTTP/1.1\r\n{headers}Content-Type: application/json\r\nContent-Length: {len(body)}"
    return head.encode("latin-1"), body


# 1. Absolute-form, asterisk-form and fragments never reach the upstream.


@pytest.mark.parametrize(
    "target",
    [
        f"http://admin.internal/v1beta/models/genmodel-2.0-flash:generateContent?key={ALICE}",
        f"https://admin.internal:8443/v1beta/models/genmodel-2.0-flash:generateContent?key={ALICE}",
        f"/v1beta/models/genmodel-2.0-flash:generateContent?key={ALICE}#fragment",
        f"/v1beta/models/genmodel-2.0-flash:generateContent#x?key={ALICE}",
    ],
)
async def test_1_only_origin_form_targets_are_forwarded(gw, upstream, target):
    answer = await send_raw(gw.url, *post(target, "", CONTENT))
    assert answer.status == 400
    assert answer.json()["error"]["status"] == "INVALID_ARGUMENT"  # the content-generation shape
    assert upstream[1] == []


async def test_1_asterisk_form_is_refused_before_any_endpoint(gw, upstream):
    answer = await send_raw(gw.url, b"OPTIONS * HTTP/1.1")
    assert answer.status == 400 and upstream[1] == []
    assert answer.json()["error"]["code"] == "invalid_request_target"


# 2. Encoded path traversal, and a model check made on a decoded string.


@pytest.mark.parametrize(
    "target",
    [
        "/v1beta/models/genmodel-x%2F..%2F..%2Finternal%2Fusers:generateContent",
        "/v1beta/models/genmodel-x%2f..%2finternal:generateContent",
        "/v1beta/models/%2e%2e:generateContent",
        "/v1beta/models/genmodel-x%3Fadmin=1:generateContent",
        "/v1beta/models/genmodel-x%23frag:generateContent",
        "/v1beta/models/genmodel-x%0D%0AX-Injected:%201:generateContent",
        "/v1beta/models/genmodel-x%252F..:generateContent",
        "/v1beta/models/genmodel-x%C0%AF..:generateContent",
    ],
)
async def test_2_encoded_traversal_in_the_model_is_a_400(gw, upstream, target):
    answer = await send_raw(gw.url, *post(f"{target}?key={GEN_ONLY}", "", CONTENT))
    assert answer.status == 400, answer.body
    assert answer.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert upstream[1] == []


@pytest.mark.parametrize(
    "target",
    ["/api/..%2Finternal%2Fpay/webhook", "/api/%2e%2e/webhook", "/api/stripe%3F/webhook", "/api/str%00ipe/webhook"],
)
async def test_2_encoded_traversal_in_the_provider_is_a_400(gw, upstream, target):
    answer = await send_raw(gw.url, *post(target, "", b"{}"))
    assert answer.status == 400, answer.body
    assert upstream[1] == []


@pytest.mark.parametrize("task", ["..%2F..%2Fadmin", "%2e%2e", "t%3Fx=1", "t%23x", "t%0Ax", "t%25", "t%2F"])
async def test_2_encoded_traversal_in_a_task_id_is_a_400(gw, upstream, task):
    for path in (f"/v1/video/generations/{task}", f"/v1/videos/{task}", f"/v1/videos/{task}/content"):
        answer = await send_raw(gw.url, f"GET {path} HTTP/1.1\r\n{bearer(ALICE)}".encode().rstrip(b"\r\n"))
        assert answer.status == 400, (path, answer.body)
    assert upstream[1] == []


async def test_2_the_model_sent_is_exactly_the_model_checked(gw, upstream):
    body = b'{"model":" msgmodel-haiku-4-5","max_tokens":5,"messages":[{"role":"user","content":"x"}]}'
    headers = f"x-api-key: {ALICE}\r\nmsgapi-version: 2023-06-01\r\n"
    assert (await send_raw(gw.url, *post("/v1/messages", headers, body))).status == 400
    answer = await send_raw(
        gw.url, *post(f"/v1beta/models/genmodel-2.0-flash:generateContent?key={GEN_ONLY}", "", CONTENT)
    )
    assert answer.status == 200
    assert upstream[1][-1].path == "/v1beta/models/genmodel-2.0-flash:generateContent"


# 3. A key parameter's name, encoded, is still a key parameter: it never travels upstream.


@pytest.mark.parametrize("name", ["key", "%6Bey", "ke%79", "%6B%65%79", "KEY", "Key"])
async def test_3_encoded_key_names_are_stripped(gw, upstream, name):
    target = f"/v1beta/models/genmodel-2.0-flash:generateContent?alt=json&{name}={ALICE}&note=a%20b"
    if name not in ("key", "%6Bey", "ke%79", "%6B%65%79"):
        alone = await send_raw(gw.url, *post(target, "", CONTENT))
        assert alone.status == 401 and upstream[1] == []  # only the name `key` carries a key
        # ... and with the key where the SDK sends it, the other pair is still never forwarded
    answer = await send_raw(gw.url, *post(target, f"x-goog-api-key: {ALICE}\r\napi-key: {ALICE}\r\n", CONTENT))
    assert answer.status == 200, answer.body
    sent = upstream[1][-1]
    assert sent.query == f"alt=json&note=a%20b&key={SECRET}"
    assert ALICE not in sent.head.decode("latin-1")


async def test_3_account_routes_keep_their_own_credentials_but_never_a_gateway_key(gw, upstream):
    headers = "Authorization: Bearer session-token-1\r\nCookie: sid=abc\r\nStripe-Signature: t=1,v1=x\r\n"
    answer = await send_raw(gw.url, *post("/api/stripe/webhook?key=backend-token&x=1", headers, b"{}"))
    assert answer.status == 200
    sent = upstream[1][-1].head.decode("latin-1")
    assert "Bearer session-token-1" in sent and "sid=abc" in sent and "t=1,v1=x" in sent
    assert upstream[1][-1].query == "x=1&key=backend-token"
    headers = f"Authorization: Bearer {ALICE}\r\nx-api-key: {BOB}\r\n"
    answer = await send_raw(gw.url, *post(f"/api/user/login/2fa?key={ALICE}&%6Bey={BOB}", headers, b"{}"))
    assert answer.status == 200
    sent = upstream[1][-1].head.decode("latin-1")
    assert ALICE not in sent and BOB not in sent and SECRET not in sent


# 4. Tenants: what one key made, no other tenant can reach.


async def submit(url: str, key: str, task: str, path: str = "/v1/video/generations") -> None:
    answer = await send_raw(url, *post(path, f"{bearer(key)}X-Test-Task: {task}\r\n", VIDEO))
    assert answer.status == 200, answer.body


async def get(url: str, path: str, key: str):
    return await send_raw(url, f"GET {path} HTTP/1.1\r\n{bearer(key)}".encode().rstrip(b"\r\n"))


async def test_4_a_video_task_is_its_tenants_alone(gw, upstream):
    await submit(gw.url, ALICE, "task_alice_1")
    paths = ("/v1/video/generations/{}", "/v1/videos/{}", "/v1/videos/{}/content")
    never = {p: await get(gw.url, p.format("task_never_made"), BOB) for p in paths}
    asked = len(upstream[1])
    for path, unknown in never.items():
        stolen = await get(gw.url, path.format("task_alice_1"), BOB)
        assert stolen.status == unknown.status == 404
        assert stolen.json() == unknown.json()  # as if the id did not exist
    assert len(upstream[1]) == asked  # nothing of bob's reached the channel
    for path in paths:  # the same tenant reaches it: a status, or a download not ready yet
        assert (await get(gw.url, path.format("task_alice_1"), ALICE_TOO)).status in (200, 409)
        assert (await get(gw.url, path.format("task_alice_1"), ALICE)).status in (200, 409)
    assert len(upstream[1]) > asked  # and the owners' polls did reach it


@pytest.fixture(params=["memory", "redis"])
async def gw_state(request, start_gateway, upstream):
    """The gateway with state in memory, or in Redis (where lookups are tasks that share round trips)."""
    if request.param == "memory":
        return await start_gateway(config(upstream[0].url))
    url = await _redis_url()
    return await start_gateway(config(upstream[0].url, f'state: {{backend: redis, url: "{url}"}}'))


async def _redis_url() -> str:
    from tests.conftest import _emptied_test_database

    return await _emptied_test_database()


async def test_4_a_status_its_owner_polled_is_not_shown_to_another_tenant(gw_state, upstream):
    """The cached status is read with the task's record, before the owner is known; it is used only
    after the core has said the task is the caller's."""
    gw = gw_state
    await submit(gw.url, ALICE, "task_alice_cached")
    for path in ("/v1/video/generations/{}", "/v1/videos/{}"):
        assert (await get(gw.url, path.format("task_alice_cached"), ALICE)).status == 200  # now cached
    asked = len(upstream[1])
    for path in ("/v1/video/generations/{}", "/v1/videos/{}", "/v1/videos/{}/content"):
        stolen = await get(gw.url, path.format("task_alice_cached"), BOB)
        unknown = await get(gw.url, path.format("task_never_made"), BOB)
        assert stolen.status == unknown.status == 404 and stolen.json() == unknown.json()
        assert b"task_alice_cached" not in stolen.body
    assert len(upstream[1]) == asked


async def test_4_an_upstream_id_made_twice_keeps_its_first_tenants_record(gw_state, upstream):
    """A task's record is written with its pin, and only if the pin is the request's: the second
    tenant to be handed the same upstream id gets an alias, and the first one's record stands."""
    gw = gw_state
    mine = await send_raw(
        gw.url,
        *post(
            "/v1/videos",
            f"{bearer(ALICE)}X-Test-Task: task_twice\r\n",
            b'{"model":"videogen-3.0-generate-001","prompt":"alice-prompt"}',
        ),
    )
    theirs = await send_raw(
        gw.url,
        *post(
            "/v1/videos",
            f"{bearer(BOB)}X-Test-Task: task_twice\r\n",
            b'{"model":"videogen-3.0-generate-001","prompt":"bob-secret"}',
        ),
    )
    assert mine.status == theirs.status == 200, (mine.body, theirs.body)
    assert mine.json()["id"] == "task_twice" and theirs.json()["id"].startswith("task_mg_")
    seen = await get(gw.url, "/v1/videos/task_twice", ALICE)
    assert seen.status == 200 and seen.json()["prompt"] == "alice-prompt", seen.body
    listed = await get(gw.url, "/v1/videos", ALICE)
    assert [v["id"] for v in listed.json()["data"]] == ["task_twice"] and b"bob-secret" not in listed.body
    bobs = await get(gw.url, "/v1/videos", BOB)
    assert [(v["id"], v["prompt"]) for v in bobs.json()["data"]] == [(theirs.json()["id"], "bob-secret")]


async def test_4_an_id_handed_to_another_tenant_after_its_pin_lapsed_leaves_the_first_ones_list(
    start_gateway, upstream
):
    """The list is the tenant's own, but an id on it may be handed to another tenant once its pin
    has lapsed and the upstream gives the id again: the record names its owner, and the list
    shows only the caller's."""
    import redis.asyncio as aioredis

    url = await _redis_url()
    gw = await start_gateway(config(upstream[0].url, f'state: {{backend: redis, url: "{url}"}}'))
    first = await send_raw(
        gw.url,
        *post(
            "/v1/videos",
            f"{bearer(ALICE)}X-Test-Task: task_again\r\n",
            b'{"model":"videogen-3.0-generate-001","prompt":"alice-prompt"}',
        ),
    )
    assert first.status == 200 and first.json()["id"] == "task_again"
    client = aioredis.Redis.from_url(url)
    try:
        assert await client.delete("modelgate:pin:video:task_again") == 1  # its week is over
    finally:
        await client.aclose()
    again = await send_raw(
        gw.url,
        *post(
            "/v1/videos",
            f"{bearer(BOB)}X-Test-Task: task_again\r\n",
            b'{"model":"videogen-3.0-generate-001","prompt":"bob-secret"}',
        ),
    )
    assert again.status == 200 and again.json()["id"] == "task_again"  # free again: handed out as it is
    alices = await get(gw.url, "/v1/videos", ALICE)
    assert alices.status == 200 and alices.json()["data"] == [] and b"bob-secret" not in alices.body
    bobs = await get(gw.url, "/v1/videos", BOB)
    assert [(v["id"], v["prompt"]) for v in bobs.json()["data"]] == [("task_again", "bob-secret")]


async def test_4_a_bad_key_following_an_id_hears_of_its_key_first(gw_state, upstream):
    gw = gw_state
    await submit(gw.url, ALICE, "task_alice_2")
    for key in ("mg-not-a-key", ""):
        answer = (
            await get(gw.url, "/v1/video/generations/task_alice_2", key)
            if key
            else await send_raw(gw.url, b"GET /v1/video/generations/task_alice_2 HTTP/1.1")
        )
        assert answer.status == 401, answer.body


async def test_4_a_plugin_sees_another_tenants_id_only_if_it_says_it_reads_nothing_of_it(start_gateway, upstream):
    """A third-party plugin, written for "runs after auth", runs after the owner check too: only
    auth, validation and the limits run before it (they declare `before_owner_check`)."""
    from tests.recording_plugin import Recorder

    recorder = "tests.recording_plugin:Recorder"
    gw = await start_gateway(
        config(
            upstream[0].url,
            f"""routes:
  video_generation_status: {{plugins: [auth, validation, ratelimit, {recorder}, video]}}
  responses: {{plugins: [auth, validation, ratelimit, {recorder}]}}
""",
        )
    )
    await submit(gw.url, ALICE, "task_alice_seen")
    made = await send_raw(gw.url, *post("/v1/responses", bearer(ALICE), b'{"model":"respmodel-4o","input":"x"}'))
    follow = json.dumps({"model": "respmodel-4o", "input": "and?", "previous_response_id": made.json()["id"]}).encode()
    Recorder.requested.clear()
    assert (await get(gw.url, "/v1/video/generations/task_alice_seen", BOB)).status == 404
    assert (await send_raw(gw.url, *post("/v1/responses", bearer(BOB), follow))).status == 404
    assert Recorder.requested == []
    assert (await get(gw.url, "/v1/video/generations/task_alice_seen", ALICE_TOO)).status == 200
    assert Recorder.requested == [("alice-too", "task_alice_seen")]


def test_4_a_plugin_that_may_read_a_followed_id_cannot_run_before_the_caller_is_known() -> None:
    from proxy.registry import order_problems
    from proxy.wire.routes import ROUTES

    route = next(r for r in ROUTES if r.name == "responses")
    problems = order_problems(route, ["tests.recording_plugin:Recorder", "auth"], "routes.responses.plugins")
    assert problems and "must come after auth" in problems[0]
    assert order_problems(route, ["auth", "tests.recording_plugin:Recorder"], "routes.responses.plugins") == []
    assert order_problems(route, ["validation", "auth"], "routes.responses.plugins") == []  # reads nothing of the id


async def test_4_a_previous_response_is_its_tenants_alone(gw, upstream):
    made = await send_raw(gw.url, *post("/v1/responses", bearer(ALICE), b'{"model":"respmodel-4o","input":"secret"}'))
    response_id = made.json()["id"]
    follow = json.dumps({"model": "respmodel-4o", "input": "and?", "previous_response_id": response_id}).encode()
    never = json.dumps({"model": "respmodel-4o", "input": "and?", "previous_response_id": "resp_never"}).encode()
    asked = len(upstream[1])
    stolen = await send_raw(gw.url, *post("/v1/responses", bearer(BOB), follow))
    unknown = await send_raw(gw.url, *post("/v1/responses", bearer(BOB), never))
    assert stolen.status == unknown.status == 404 and stolen.json() == unknown.json()
    assert stolen.json()["error"]["code"] == "previous_response_not_found"
    assert len(upstream[1]) == asked
    assert (await send_raw(gw.url, *post("/v1/responses", bearer(ALICE_TOO), follow))).status == 200


# 5. Stored content: only raster images, never served in a way a browser would run.


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


PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
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


# 7. Bytes that are not text, where a key or a signature belongs: a 401 or a 403, never a 500.


@pytest.mark.parametrize(
    ("target", "header"),
    [
        ("/v1/responses", b"Authorization: Bearer \xff\xfe"),
        ("/v1/responses", b"Authorization: Bearer sk-\xc3\x28abc"),
        ("/v1/messages", b"x-api-key: \xff\xfe\r\nmsgapi-version: 2023-06-01"),
        ("/v1beta/models/genmodel-2.0-flash:generateContent?key=%ff%fe", b"X-Nothing: 1"),
    ],
)
async def test_7_an_undecodable_key_is_a_401(gw, upstream, target, header):
    body = b'{"model":"respmodel-4o","input":"x"}'
    head = f"POST {target} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
    answer = await send_raw(gw.url, head + header, body)
    assert answer.status == 401, answer.body
    assert upstream[1] == []


@pytest.mark.parametrize(
    "query",
    [
        "exp=1&kid=k&sig=%C3%A9",
        "exp=%D9%A1&kid=k&sig=" + "0" * 64,
        "exp=1&kid=%ff&sig=x",
        "exp=99999999999999999999999&kid=k&sig=" + "a" * 64,
        "exp=1&kid=k&sig=" + "%C3%A9" * 32,
    ],
)
async def test_7_a_malformed_signature_is_a_403(start_gateway, upstream, tmp_path, query):
    gw = await start_gateway(
        config(upstream[0].url, f'plugins: {{url_delivery: {{enabled: true, dir: "{tmp_path}"}}}}')
    )
    for blob in ("abc", "..%2F..%2Fetc", "%ff"):
        answer = await send_raw(gw.url, f"GET /images/{blob}?{query} HTTP/1.1".encode())
        assert answer.status == 403, (blob, answer.body)
        assert answer.json()["error"]["code"] == "invalid_signature"


# 8. What the upstream says of its credential stays in the gateway.


def echoing(received: Received) -> bytes:
    if received.path.endswith(":generateContent"):  # the credential went in the query: echo the request line
        return json_answer(400, {"error": {"message": f"bad request {received.target}", "status": "INVALID_ARGUMENT"}})
    if received.path == "/v1/responses":
        body = gzip.compress(json.dumps({"error": {"message": f"key {SECRET} is over quota"}}).encode())
        return (
            b"HTTP/1.1 429 X\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        ) + body
    if received.path == "/v1/messages":  # an error body too large to hold, the secret cut across reads
        filler = b"x" * 70_000
        body = filler + f"Bearer {SECRET}".encode() + filler
        return b"HTTP/1.1 500 X\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    return (
        f"HTTP/1.1 302 Found\r\nLocation: https://elsewhere.example/x?key={SECRET}&y=1\r\n"
        f"X-Debug: auth=Bearer%20{SECRET.replace('-', '%2D')}\r\nContent-Length: 0\r\n\r\n"
    ).encode()


async def test_8_the_channel_credential_is_scrubbed_from_what_the_upstream_echoes(start_gateway):
    server, _ = recording_upstream(echoing)
    async with server:
        gw = await start_gateway(config(server.url, "server: {max_json_body_mb: 0.05}"))
        answers = [
            await send_raw(
                gw.url, *post(f"/v1beta/models/genmodel-2.0-flash:generateContent?key={ALICE}", "", CONTENT)
            ),
            await send_raw(
                gw.url,
                *post(
                    "/v1/responses",
                    bearer(ALICE) + "Accept-Encoding: gzip\r\n",
                    b'{"model":"respmodel-4o","input":"x"}',
                ),
            ),
            await send_raw(
                gw.url,
                *post(
                    "/v1/messages",
                    f"x-api-key: {ALICE}\r\nmsgapi-version: 2023-06-01\r\n",
                    b'{"model":"msgmodel-haiku-4-5","max_tokens":5,"messages":[{"role":"user","content":"x"}]}',
                ),
            ),
            await send_raw(
                gw.url, *post("/v1/images/generations", bearer(ALICE), b'{"model":"imagegen-2","prompt":"x"}')
            ),
        ]
    assert [a.status for a in answers] == [400, 429, 500, 302]
    for answer in answers:
        everything = repr(answer.headers) + answer.body.decode("latin-1")
        assert SECRET not in everything and SECRET.replace("-", "%2D") not in everything
    assert "[redacted]" in answers[0].body.decode() and "[redacted]" in answers[1].body.decode()
    assert answers[2].body.count(b"[redacted]") == 1 and len(answers[2].body) > 140_000
    assert answers[3].headers["location"] == "https://elsewhere.example/x?key=[redacted]&y=1"


# 9. Links the gateway hands out never point where a client's Host header says.


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


# 10. Accounting goes by the gateway's id, whatever X-Request-Id a caller repeats.


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_10_a_repeated_request_id_does_not_escape_the_rate_limit(start_gateway, upstream, redis_url, backend):
    gw = await start_gateway(
        config(
            upstream[0].url,
            f'state: {{backend: {backend}, url: "{redis_url}"}}',
            keys=f"[{{name: limited, key: {ALICE}, limits: {{rpm: 20}}}}]",
        )
    )
    statuses = []
    for _ in range(30):
        answer = await send_raw(
            gw.url,
            *post(
                "/v1/responses",
                bearer(ALICE) + "X-Request-Id: same-id-every-time\r\n",
                b'{"model":"respmodel-4o","input":"x"}',
            ),
        )
        statuses.append(answer.status)
        assert answer.headers["x-request-id"] == "same-id-every-time"  # still echoed, for correlation
    assert statuses.count(200) == 20 and statuses.count(429) == 10


# 11. A body trickled a byte at a time cannot hold a request open.


async def test_11_a_trickled_body_meets_the_routes_body_deadline(start_gateway, upstream):
    gw = await start_gateway(
        config(upstream[0].url, "routes: {messages: {body_timeout_s: 1.0}}\nserver: {client_idle_s: 5}")
    )
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {ALICE}\r\nmsgapi-version: 2023-06-01\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n".encode()
    )
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def trickle() -> None:
        for _ in range(40):  # a byte every 0.25 s: never idle for client_idle_s, never done
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.25)

    trickling = asyncio.ensure_future(trickle())
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 8)
    finally:
        trickling.cancel()
        writer.close()
    assert head.startswith(b"HTTP/1.1 408")
    assert loop.time() - started < 4
    assert upstream[1] == []


# The sweep: hostile bytes in every path parameter of all 13 endpoints and the calls around them.

HOSTILE = [
    "%00",
    "%01",
    "%09",
    "%0A",
    "%0D",
    "%0D%0A",
    "%1F",
    "%7F",
    "%20",
    "%2F",
    "%2f",
    "%5C",
    "%2E%2E",
    "%2e",
    "%3F",
    "%23",
    "%25",
    "%252F",
    "%C0%AF",
    "%FF",
    "%E2%80%AE",
    "%3B",
    "%26",
    "%3D%3D",
    "..",
    ".",
    ";x=1",
    "%40",
    "%3A",
    "%2B",
    "%7E",
    "%22",
    "%27",
    "%3C",
    "%3E",
    "%60",
    "%7B%7D",
    "%5B%5D",
]
BODIES = {
    "video_generations": VIDEO,
    "videos": VIDEO,
    "image_generations": b'{"model":"imagegen-2","prompt":"x"}',
    "image_edits": b'{"model":"imagegen-2","prompt":"x","images":[{"image_url":"data:image/png;base64,'
    + base64.b64encode(PNG)
    + b'"}]}',
    "messages": b'{"model":"msgmodel-haiku-4-5","max_tokens":5,"messages":[{"role":"user","content":"x"}]}',
    "generate_content": CONTENT,
    "stream_generate_content": CONTENT,
    "responses": b'{"model":"respmodel-4o","input":"x"}',
    "login_2fa": b"{}",
    "payment_webhook": b"{}",
    "count_tokens": b'{"model":"msgmodel-haiku-4-5","messages":[{"role":"user","content":"x"}]}',
    "count_content_tokens": CONTENT,
    "response_delete": b"",
    "response_cancel": b"",
}
SAMPLE = {"model": "genmodel-2.0-flash", "task_id": "task_sweep", "provider": "stripe", "response_id": "resp_sweep"}


def clean_path(template: str) -> re.Pattern[str]:
    """The only upstream paths a route may produce: its template, one clean segment per parameter."""
    parts = re.split(r"(\{[^}]+\})", template)
    return re.compile(
        "".join(f"(?:{PARAM_GRAMMAR[p[1:-1]][0].pattern})" if p.startswith("{") else re.escape(p) for p in parts)
    )


def variants(template: str) -> list[tuple[str, dict[str, str]]]:
    """Paths with one hostile value in one parameter (or after a path that has none), with the
    parameters' raw values."""
    names = re.findall(r"\{([^}]+)\}", template)
    found = []
    for name in names or [None]:
        for hostile in HOSTILE:
            for place in ("{}x", "x{}", "x{}y"):
                values = {n: SAMPLE[n] for n in names}
                if name is None:
                    found.append((template + place.format(hostile).replace("x", "/x", 1), values))
                    continue
                values[name] = ("genmodel-" if name == "model" else "") + place.format(hostile)
                found.append((template.format(**values), values))
    return found


async def test_sweep_nothing_but_the_template_reaches_the_upstream(gw, upstream):
    tried, expected = 0, set()
    for route in ROUTES:
        for path, values in variants(route.path):
            task = unquote(values.get("task_id", ""))
            if task and PARAM_GRAMMAR["task_id"][0].fullmatch(task):
                await submit(gw.url, ALICE, task)  # a clean id of this tenant's: it must go through, exactly
                if route.name == "video_generation_status":  # later routes may answer from the status cache
                    expected.add(route.path.format(task_id=quote(task, safe="@+=:~")))
            sep = "&" if "?" in path else "?"
            target = f"{path}{sep}key={ALICE}" if route.format.name == "content" else path
            headers = f"{bearer(ALICE)}x-api-key: {ALICE}\r\nmsgapi-version: 2023-06-01\r\n"
            if route.method in ("GET", "DELETE"):
                head = f"{route.method} {target} HTTP/1.1\r\n{headers}".encode("latin-1").rstrip(b"\r\n")
                answer = await send_raw(gw.url, head)
            else:
                answer = await send_raw(gw.url, *post(target, headers, BODIES[route.name]))
            tried += 1
            assert answer.status < 500, (route.name, path, answer.status, answer.body[:200])
    assert tried > 13 * len(HOSTILE)
    for received in upstream[1]:
        assert any(r.method == received.method and clean_path(r.path).fullmatch(received.path) for r in ROUTES), (
            received.target
        )
        assert not re.search(r"[\x00-\x20\x7f#]", received.target), received.target
    # Where a parameter was clean the request did go through: the sweep tests the path, not a wall.
    reached = {r.path for r in upstream[1]}
    assert expected and expected <= reached, expected - reached
    assert any(p.startswith("/v1beta/models/genmodel-x") for p in reached)


@pytest.mark.parametrize("task", ["t.a_b~c", "T-1:2@3", "t+x=y", "0"])
async def test_a_task_id_the_grammar_allows_arrives_exactly(gw, upstream, task):
    await submit(gw.url, ALICE, task)
    assert (await get(gw.url, f"/v1/video/generations/{task}", ALICE)).status == 200
    assert upstream[1][-1].target == f"/v1/video/generations/{task}"


# 6. Keys never reach a log line, however the request that carries them is broken.

LOGGED_KEY = "sk-log-SECRET-4242"


def malformed(key: str, n: int) -> tuple[bytes, bytes]:
    """The n-th of many broken requests, each with the key somewhere in it."""
    k = key.encode()
    body = b'{"model":"respmodel-4o","input":"' + k + b'"'  # never closed
    cases = [
        (b"GET /v1/videos/x?key=" + k + b" HTTP/1.1 ", b""),  # trailing space
        (b"POST /v1/responses HTTP/1.1\r\nAuthorization: Bearer " + k + b"\x01", body),  # control byte
        (b"POST /v1/responses HTTP/1.1\r\nAuthorization: Bearer " + k + b"\x00x", body),
        (b"POST /v1/responses HTTP/1.1\r\nx-api-key: " + k + b"\xff\r\nX: \x7f", body),
        (k + b" /v1/responses HTTP/1.1", b""),  # the key as the method
        (b"GET /v1/videos/" + k + b"%0A HTTP/1.1", b""),  # in a bad path parameter
        (b"GET /v1/videos/" + k + b"%2F.. HTTP/1.1", b""),
        (b"POST http://evil/v1beta/models/genmodel-2.0-flash:generateContent?key=" + k + b" HTTP/1.1", body),
        (b"POST /v1beta/models/genmodel-2.0-flash:generateContent?key=" + k + b"#f HTTP/1.1", body),
        (b"POST /v1beta/models/genmodel-2.0-flash:generateContent?%6Bey=" + k + b"&x=%ff HTTP/1.1", body),
        (b"POST /v1beta/models/genmodel-2.0-flash:generateContent?key=" + k + b"&x=%0d%0a HTTP/1.1", body),
        (b"POST /v1/responses HTTP/1.1\r\nContent-Type: " + k + b"\r\nAuthorization: Bearer " + k, body),
        (b"POST /v1/responses HTTP/1.1\r\nAuthorization: Bearer " + k, body),  # broken JSON
        (b"POST /v1/responses HTTP/1.1\r\n" + k + b": value\x00", body),  # in a header name
        (b"POST /v1/responses HTTP/1.1\r\nX-Big: " + k * 3000, body),  # over the header budget
        (b"GET /v1/videos/x HTTP/9.9\r\nAuthorization: Bearer " + k, b""),  # a version that is none
        (b"GET /v1/videos/x?key=" + k + b"\x85 HTTP/1.1", b""),
        (
            b"POST /v1/messages HTTP/1.1\r\nx-api-key: " + k + b"\r\nTransfer-Encoding: chunked\r\n"
            b"Transfer-Encoding: chunked",
            b"zz\r\n" + k + b"\r\n",
        ),  # broken chunking
        (b"POST /v1/responses HTTP/1.1\r\nHost: " + k + b"\x7f\r\nAuthorization: Bearer " + k, body),
        (b"GET /images/" + k + b"?exp=1&kid=" + k + b"&sig=%C3%A9 HTTP/1.1", b""),
    ]
    head, payload = cases[n % len(cases)]
    if b"\r\ncontent-length" not in head.lower() and b"transfer-encoding" not in head.lower() and payload:
        head += b"\r\nContent-Length: %d" % (len(payload) + n % 3)  # some bodies end early, too
    return head, payload


async def test_6_no_key_in_any_log_line_from_200_malformed_requests(spawn, tmp_path):
    gw = spawn(
        "gateway",
        config=f"""
server: {{listen: "127.0.0.1:{{PORT}}", client_idle_s: 0.5}}
keys: [{{name: logged, key: {LOGGED_KEY}}}]
plugins: {{url_delivery: {{enabled: true, dir: "{tmp_path / "images"}"}}}}
observability: {{logging: {{level: debug}}}}
""",
    )
    statuses = []
    for n in range(200):
        try:
            statuses.append((await send_raw(gw.url, *malformed(LOGGED_KEY, n), timeout=5)).status)
        except (TimeoutError, AssertionError, ConnectionError):
            statuses.append(0)  # closed without an answer: still must not be logged
    # A well-formed request, so the log is known to hold access lines too.
    ok = await send_raw(gw.url, *post("/v1/responses", bearer(LOGGED_KEY), b'{"model":"respmodel-4o","input":"x"}'))
    assert ok.status == 200
    gw.proc.terminate()
    gw.proc.wait(timeout=20)
    log = gw.log.read_text(errors="replace")
    assert all(s < 500 for s in statuses), statuses
    assert statuses.count(400) > 50
    for needle in (LOGGED_KEY, LOGGED_KEY[:12], LOGGED_KEY[-10:]):
        assert needle not in log, [line for line in log.splitlines() if needle in line][:3]
    assert "malformed request refused" in log and '"logger":"modelgate.access"' in log


# Tenants and limits across three instances sharing one Redis.


@pytest.fixture
def three(spawn, shared_redis):
    sim = spawn(
        "simulator", "--key", SECRET, "--video-queued-s", "0", "--video-processing-s", "0.2", "--chunk-delay-ms", "0"
    )
    limited = f"{{name: limited, key: {LIMITED}, limits: {{rpm: 30, concurrent: 2}}}}"
    keys = TENANTS + f"\n  - {limited}"
    text = f'server: {{listen: "127.0.0.1:{{PORT}}"}}\nstate: {{backend: redis, url: "{shared_redis}"}}\n' + config(
        sim.url, keys=keys
    ).replace("observability: {logging: {access_log: false}}", "")
    return [spawn("gateway", config=text) for _ in range(3)]


async def test_tenants_stay_apart_across_three_instances(three):
    a, b, c = (g.url for g in three)
    made = await send_raw(a, *post("/v1/video/generations", bearer(ALICE), VIDEO))
    task = made.json()["task_id"]
    response = (
        await send_raw(b, *post("/v1/responses", bearer(ALICE), b'{"model":"respmodel-4o","input":"x","store":true}'))
    ).json()["id"]
    follow = json.dumps({"model": "respmodel-4o", "input": "and?", "previous_response_id": response}).encode()
    for url in (a, b, c):
        assert (await get(url, f"/v1/video/generations/{task}", BOB)).status == 404
        assert (await get(url, f"/v1/videos/{task}/content", BOB)).status == 404
        assert (await send_raw(url, *post("/v1/responses", bearer(BOB), follow))).status == 404
        assert (await get(url, f"/v1/video/generations/{task}", ALICE_TOO)).status == 200
        assert (await send_raw(url, *post("/v1/responses", bearer(ALICE_TOO), follow))).status == 200


@pytest.mark.parametrize("shared_redis", ["single"], indirect=True)  # across topologies: tests/test_ratelimit.py
async def test_limits_hold_across_three_instances_whatever_request_id_is_repeated(three):
    urls = [g.url for g in three]
    same_id = "X-Request-Id: one-id-for-everything\r\n"
    target = f"/v1beta/models/genmodel-2.0-flash:generateContent?key={LIMITED}"
    slow = f"{same_id}x-sim-chunk-delay-ms: 400\r\nx-sim-output-tokens: 5\r\n"
    streams = await asyncio.gather(
        *(
            send_raw(
                urls[i % 3],
                *post(target.replace(":generate", ":streamGenerate") + "&alt=sse", slow, CONTENT),
                timeout=20,
            )
            for i in range(6)
        )
    )
    assert sorted(s.status for s in streams) == [200, 200, 429, 429, 429, 429]
    statuses = [(await send_raw(urls[i % 3], *post(target, same_id, CONTENT))).status for i in range(36)]
    assert statuses.count(200) == 30 - 2 and statuses.count(429) == 8  # the two streams counted too


async def test_an_upstream_task_id_no_path_could_hold_is_handed_out_as_an_alias(start_gateway):
    operation = "models/videogen-3.0/operations/op 1"

    def google_style(received: Received) -> bytes:
        if received.method == "POST":
            return json_answer(200, {"name": operation, "done": False})
        return json_answer(
            200, {"name": operation, "done": True, "status": "completed", "url": "https://cdn.example/v.mp4"}
        )

    server, received = recording_upstream(google_style)
    async with server:
        gw = await start_gateway(config(server.url))
        made = await send_raw(gw.url, *post("/v1/video/generations", bearer(ALICE), VIDEO))
        alias = made.json()["task_id"]
        assert alias != operation and PARAM_GRAMMAR["task_id"][0].fullmatch(alias)
        assert made.json()["id"] == alias
        polled = await get(gw.url, f"/v1/video/generations/{alias}", ALICE_TOO)
        assert polled.status == 200
        assert polled.json()["data"]["task_id"] == alias
        assert polled.json()["data"]["url"] == f"{gw.url}/v1/videos/{alias}/content"
        # The upstream's own id, from the gateway's record, as one segment.
        assert received[-1].target == "/v1/video/generations/models%2Fvideogen-3.0%2Foperations%2Fop%201"
        assert (await get(gw.url, f"/v1/video/generations/{alias}", BOB)).status == 404


async def test_the_rebuilt_query_reads_as_the_clients_did(gw, upstream):
    target = f"/v1beta/models/genmodel-2.0-flash:generateContent?alt=sse&flag&list=a,b:c&q=x+y%2By&key={ALICE}"
    assert (await send_raw(gw.url, *post(target, "", CONTENT))).status == 200
    assert upstream[1][-1].query == f"alt=sse&flag&list=a,b:c&q=x%20y%2By&key={SECRET}"


# Found by review: each of these once got past the guarantees above.


async def test_a_failed_over_request_carries_only_the_next_channels_credential(start_gateway):
    paid, paid_seen = recording_upstream(lambda r: json_answer(503, {"error": "busy"}))
    local, local_seen = recording_upstream(lambda r: json_answer(400, {"echo": r.head.decode("latin-1")}))
    async with paid, local:
        gw = await start_gateway(
            config("unused").replace(
                f'channels: [{{name: up, base_url: "unused", credential: {SECRET}}}]',
                f'channels: [{{name: paid, base_url: "{paid.url}", credential: {SECRET}, priority: 0}},'
                f' {{name: local, base_url: "{local.url}", priority: 1}}]',
            )
        )
        for target, headers, body in (
            ("/v1/responses", bearer(ALICE), b'{"model":"respmodel-4o","input":"x"}'),
            (
                "/v1/messages",
                f"x-api-key: {ALICE}\r\nmsgapi-version: 2023-06-01\r\n",
                b'{"model":"msgmodel-haiku-4-5","max_tokens":5,"messages":[{"role":"user","content":"x"}]}',
            ),
        ):
            answer = await send_raw(gw.url, *post(target, headers, body))
            assert answer.status == 400 and SECRET not in answer.body.decode()
    assert len(paid_seen) == 2 and all(SECRET in r.head.decode() for r in paid_seen)
    assert len(local_seen) == 2 and not any(SECRET in r.head.decode() for r in local_seen)


def leaky(status: int, extra_headers: str, body: bytes) -> Answerer:
    def answer(received: Received) -> bytes:
        return (
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n{extra_headers}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    return answer


LEAK = json.dumps({"error": f"invalid key {SECRET}"}).encode()


@pytest.mark.parametrize(
    "answerer",
    [
        leaky(401, "Content-Encoding: identity\r\nContent-Encoding: gzip\r\n", gzip.compress(LEAK)),
        leaky(401, "Content-Encoding:\r\nContent-Encoding: gzip\r\n", gzip.compress(LEAK)),
        leaky(
            500, "Content-Encoding: gzip\r\n", gzip.compress(LEAK + b" " * 200_000 + LEAK, mtime=0)
        ),  # past the buffer
        leaky(500, "Content-Encoding: gzip\r\n", gzip.compress(LEAK + bytes(range(256)) * 600)),  # large, and dense
        leaky(400, f"X-Key-{SECRET}: 1\r\n", b"{}"),
    ],
    ids=["two-codings", "empty-then-gzip", "inflates-past-limit", "large-compressed", "in-a-header-name"],
)
async def test_what_hides_the_credential_from_redaction_does_not_reach_the_client(start_gateway, answerer):
    server, _ = recording_upstream(answerer)
    async with server:
        gw = await start_gateway(config(server.url, "server: {max_json_body_mb: 0.1}"))
        answer = await send_raw(
            gw.url,
            *post(
                "/v1/responses", bearer(ALICE) + "Accept-Encoding: gzip\r\n", b'{"model":"respmodel-4o","input":"x"}'
            ),
        )
    assert answer.status >= 400
    body = answer.body
    if "gzip" in answer.headers.get("content-encoding", ""):
        body = gzip.decompress(body)
    assert SECRET.encode() not in body and SECRET not in repr(answer.headers)


async def test_account_routes_drop_a_gateway_key_however_it_is_written(gw, upstream):
    for header in (
        f"Authorization: Bearer\t{ALICE}",
        f"Authorization: Token {ALICE}",
        f"Authorization: Bearer {ALICE}, Bearer x",
        f"api-key: {BOB},{ALICE}",
        f"x-api-key:  {ALICE}  ",
    ):
        answer = await send_raw(gw.url, *post("/api/user/login/2fa", header + "\r\n", b"{}"))
        assert answer.status == 200
    for query in (f"key=+{ALICE}", f"key=%20{ALICE}", f"key={ALICE}%20", f"key={ALICE}%2C{BOB}"):
        assert (await send_raw(gw.url, *post(f"/api/stripe/webhook?{query}", "", b"{}"))).status == 200
    assert (await send_raw(gw.url, *post(f"/api/stripe/webhook?key={ALICE}%00", "", b"{}"))).status == 400
    assert len(upstream[1]) == 9
    for received in upstream[1]:
        assert ALICE not in unquote(received.head.decode("latin-1")), received.head


async def test_two_channels_naming_the_same_task_never_share_it(start_gateway):
    one, one_seen = recording_upstream()
    two, two_seen = recording_upstream()
    async with one, two:
        gw = await start_gateway(
            config("unused").replace(
                f'channels: [{{name: up, base_url: "unused", credential: {SECRET}}}]',
                f'channels: [{{name: one, base_url: "{one.url}", models: ["videogen-3.0*"]}},'
                f' {{name: two, base_url: "{two.url}", models: ["videogen-3.1*"]}}]',
            )
        )
        mine = await send_raw(gw.url, *post("/v1/video/generations", bearer(ALICE), VIDEO))
        theirs = await send_raw(
            gw.url,
            *post("/v1/video/generations", bearer(BOB), b'{"model":"videogen-3.1-generate-preview","prompt":"x"}'),
        )
        assert mine.json()["task_id"] == "task_1"  # both upstreams said task_1
        alias = theirs.json()["task_id"]
        assert alias != "task_1"
        assert (await get(gw.url, "/v1/video/generations/task_1", BOB)).status == 404
        assert (await get(gw.url, "/v1/video/generations/task_1", ALICE)).status == 200
        assert (await get(gw.url, f"/v1/video/generations/{alias}", BOB)).status == 200
    assert one_seen[-1].target == two_seen[-1].target == "/v1/video/generations/task_1"


async def test_json_fields_the_gateway_decides_by_reach_the_upstream_as_it_read_them(gw, upstream):
    headers = f"x-api-key: {GEN_ONLY}\r\nmsgapi-version: 2023-06-01\r\n"
    case = b'{"model":"msgmodel-haiku-4-5","MODEL":"x","max_tokens":5,"messages":[{"role":"user","content":"x"}]}'
    assert (await send_raw(gw.url, *post("/v1/messages", bearer(ALICE) + headers, case))).status == 400
    made = await send_raw(gw.url, *post("/v1/responses", bearer(ALICE), b'{"model":"respmodel-4o","input":"x"}'))
    mine = made.json()["id"]
    for body in (
        f'{{"model":"respmodel-4o","input":"x","previous_response_id":"resp_other","previous_response_id":"{mine}"}}',
        f'{{"model":"respmodel-4o","input":"x","previous_response_\\u0069d":"{mine}"}}',
    ):
        answer = await send_raw(gw.url, *post("/v1/responses", bearer(ALICE), body.encode()))
        assert answer.status == 200, answer.body
        sent = json.loads(upstream[1][-1].body)
        assert sent["previous_response_id"] == mine and upstream[1][-1].body.count(b"previous_response_id") == 1


def form(boundary: bytes, *fields: tuple[str, bytes], tail: bytes = b"") -> bytes:
    out = b""
    for name, value in fields:
        filename = b'; filename="a.png"' if name == "image" else b""
        out += b"--" + boundary + b'\r\nContent-Disposition: form-data; name="' + name.encode() + b'"' + filename
        out += b"\r\n\r\n" + value + b"\r\n"
    return out + b"--" + boundary + b"--\r\n" + tail


@pytest.mark.parametrize(
    ("content_type", "body", "status"),
    [
        (
            "multipart/form-data; xboundary=AAA; boundary=BBB",
            form(b"AAA", ("model", b"imagegen-1"), ("prompt", b"x"), ("image", PNG))
            + form(b"BBB", ("model", b"imagegen-2"), ("prompt", b"x"), ("image", PNG)),
            403,
        ),  # BBB's model is checked
        (
            "multipart/form-data; boundary=AAA; boundary=BBB",
            form(b"AAA", ("model", b"imagegen-2"), ("image", PNG)),
            400,
        ),
        ("multipart/form-data; boundary=\xff", form(b"AAA", ("model", b"imagegen-2"), ("image", PNG)), 400),
        (
            "multipart/form-data; boundary=AAA",
            form(b"AAA", ("model", b"imagegen-1"), ("prompt", b"x"), ("model", b"imagegen-2"), ("image", PNG)),
            400,
        ),
        (
            "multipart/form-data; boundary=AAA",
            form(
                b"AAA", ("model", b"imagegen-1"), ("prompt", b"x"), ("image", PNG), tail=b"--BBB\r\n" + b"x" * 300_000
            ),
            400,
        ),
    ],
    ids=["hidden-boundary", "two-boundaries", "not-a-boundary", "model-twice", "data-after-the-close"],
)
async def test_a_form_read_two_ways_is_refused(gw, upstream, content_type, body, status):
    head = (
        f"POST /v1/images/edits HTTP/1.1\r\n{bearer(CHEAP)}Content-Type: {content_type}\r\nContent-Length: {len(body)}"
    ).encode("latin-1")
    answer = await send_raw(gw.url, head, body)
    assert answer.status == status, answer.body
    assert not any(r.path == "/v1/images/edits" and len(r.body) == len(body) for r in upstream[1])


async def test_request_bodies_are_taken_as_sent(gw, upstream):
    packed = gzip.compress(b'{"model":"respmodel-4o","input":"x"}')
    head = f"POST /v1/responses HTTP/1.1\r\n{bearer(ALICE)}Content-Type: application/json\r\nContent-Encoding: gzip"
    assert (await send_raw(gw.url, f"{head}\r\nContent-Length: {len(packed)}".encode(), packed)).status == 415
    assert (await send_raw(gw.url, f"{head}\r\nContent-Length: 7".encode(), b"notgzip")).status == 415
    head = "POST /api/stripe/webhook HTTP/1.1\r\nContent-Type: application/json\r\nContent-Encoding: gzip"
    assert (await send_raw(gw.url, f"{head}\r\nContent-Length: {len(packed)}".encode(), packed)).status == 200
    assert upstream[1][-1].body == packed and b"content-encoding: gzip" in upstream[1][-1].head.lower()


# Found by a second review: fields read one way by the gateway and another by some upstreams.


@pytest.mark.parametrize(
    "name",
    [
        "previou\u017f_response_id",
        "PREVIOU\u017f_RESPONSE_ID",
        "previous_response_i\u0064",
        "\uff50revious_response_id",
    ],
)
async def test_a_deciding_name_spelled_in_unicode_is_refused(gw, upstream, name):
    made = await send_raw(gw.url, *post("/v1/responses", bearer(ALICE), b'{"model":"respmodel-4o","input":"x"}'))
    theirs = made.json()["id"]
    body = json.dumps({"model": "respmodel-4o", "input": "x", name: theirs}, ensure_ascii=False).encode()
    answer = await send_raw(gw.url, *post("/v1/responses", bearer(BOB), body))
    if name == "previous_response_id":  # \u0064 is plain "d": the real field, checked as such
        assert answer.status == 404
    else:
        assert answer.status == 400 and answer.json()["error"]["param"] == "previous_response_id"
    assert upstream[1][-1].body != body


def part(headers: str, value: bytes) -> bytes:
    return b"--b\r\n" + headers.encode() + b"\r\n\r\n" + value + b"\r\n"


@pytest.mark.parametrize(
    "body",
    [
        part('Content-Disposition: form-data; name="model"; filename=""\r\nContent-Type: text/plain', b"imagegen-2")
        + part('Content-Disposition: form-data; name="model"', b"imagegen-1"),
        part("Content-Disposition: form-data; name=\"x\"; name*=UTF-8''model", b"imagegen-2")
        + part('Content-Disposition: form-data; name="model"', b"imagegen-1"),
        part('Content-Disposition: form-data; name="mod\\el"', b"imagegen-2")
        + part('Content-Disposition: form-data; name="model"', b"imagegen-1"),
        b'--b\nContent-Disposition: form-data; name="model"\n\nimagegen-2\n'
        + part('X-Pad: 1\r\nContent-Disposition: form-data; name="model"', b"imagegen-1"),
        b"--bX\r\n" + part('Content-Disposition: form-data; name="model"', b"imagegen-1")[5:],
    ],
    ids=["model-as-a-file", "rfc2231-name", "escaped-name", "bare-lf-lines", "text-after-the-boundary"],
)
async def test_a_form_some_reader_would_read_otherwise_is_refused(gw, upstream, body):
    body += part('Content-Disposition: form-data; name="prompt"', b"x")
    body += part('Content-Disposition: form-data; name="image"; filename="a.png"\r\nContent-Type: image/png', PNG)
    body += b"--b--\r\n"
    head = (
        f"POST /v1/images/edits HTTP/1.1\r\n{bearer(CHEAP)}Content-Type: multipart/form-data; boundary=b\r\n"
        f"Content-Length: {len(body)}"
    ).encode()
    answer = await send_raw(gw.url, head, body)
    assert answer.status == 400, answer.body
    assert not any(r.path == "/v1/images/edits" and len(r.body) >= len(body) for r in upstream[1])


async def test_a_renamed_model_is_renamed_in_the_model_field_or_not_sent(start_gateway, upstream):
    gw = await start_gateway(
        config(upstream[0].url).replace(
            f"credential: {SECRET}}}", f"credential: {SECRET}, rename: {{imagegen-1: imagegen-1-lowres}}}}"
        )
    )
    decoy = part('Content-Disposition: form-data; name="model_note"', b"imagegen-1")
    for early in (True, False):
        fields = [
            part('Content-Disposition: form-data; name="model"', b"imagegen-1"),
            part('Content-Disposition: form-data; name="prompt"', b"x"),
        ]
        image = part(
            'Content-Disposition: form-data; name="image"; filename="a.png"\r\nContent-Type: image/png',
            PNG + b"\0" * (5 * 1024 * 1024),
        )  # past what the gateway holds in memory
        body = decoy + (b"".join(fields) + image if early else image + b"".join(fields)) + b"--b--\r\n"
        head = (
            f"POST /v1/images/edits HTTP/1.1\r\n{bearer(ALICE)}Content-Type: multipart/form-data; boundary=b\r\n"
            f"Content-Length: {len(body)}"
        ).encode()
        answer = await send_raw(gw.url, head, body, timeout=30)
        if early:
            assert answer.status == 200, answer.body
            sent = upstream[1][-1].body
            assert b'name="model"\r\n\r\nimagegen-1-lowres\r\n' in sent
            assert b'name="model_note"\r\n\r\nimagegen-1\r\n' in sent  # the decoy is left alone
        else:
            assert answer.status == 400 and answer.json()["error"]["param"] == "model"


async def test_account_routes_drop_a_gateway_key_quoted_or_in_basic_credentials(gw, upstream):
    basic = base64.b64encode(f"user:{ALICE}".encode()).decode()
    for header in (
        f"Authorization: Basic {basic}",
        f'Authorization: Bearer "{ALICE}"',
        f"Authorization: Bearer {ALICE};",
    ):
        assert (await send_raw(gw.url, *post("/api/user/login/2fa", header + "\r\n", b"{}"))).status == 200
    assert len(upstream[1]) == 3
    for received in upstream[1]:
        assert ALICE not in received.head.decode("latin-1") and basic not in received.head.decode("latin-1")


async def test_an_upstream_id_that_is_a_dot_segment_is_never_followed(start_gateway):
    def dots(received: Received) -> bytes:
        return json_answer(200, {"task_id": "..", "status": "queued"} if received.method == "POST" else {"ok": True})

    server, received = recording_upstream(dots)
    async with server:
        gw = await start_gateway(config(server.url))
        made = await send_raw(gw.url, *post("/v1/videos", bearer(ALICE), VIDEO))
        assert made.status == 200 and made.json()["id"] == ".."  # not an alias the gateway could follow
        for path in ("/v1/videos/../content", "/v1/videos/%2E%2E/content", "/v1/videos/%2e%2e"):
            assert (await get(gw.url, path, ALICE)).status in (400, 404)
        assert [r.target for r in received if r.method == "GET"] == []


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


async def test_the_version_a_channel_failed_over_from_chose_is_not_sent_on(start_gateway):
    first, _ = recording_upstream(lambda r: json_answer(503, {"error": "busy"}))
    second, seen = recording_upstream()
    async with first, second:
        gw = await start_gateway(f"""
keys: [{{name: alice, key: {ALICE}}}]
channels:
  - {{name: a, base_url: '{first.url}', priority: 0, version_header: anthropic-version}}
  - {{name: b, base_url: '{second.url}', priority: 1}}
""")
        headers = f"x-api-key: {ALICE}\r\nmsgapi-version: 2023-06-01\r\n"
        body = b'{"model":"msgmodel-haiku-4-5","max_tokens":5,"messages":[{"role":"user","content":"x"}]}'
        answer = await send_raw(gw.url, *post("/v1/messages", headers, body))
        assert answer.status == 200
        head = seen[-1].head.decode("latin-1").lower()
        assert "msgapi-version: 2023-06-01" in head and "anthropic-version" not in head
