"""No key leaks: a gateway key's name, encoded, never travels upstream; undecodable keys are 401s; the
channel credential is scrubbed from what comes back; no key in any log line. (docs/security.md; each
numbered case is an attack that once worked, replayed through real sockets against an upstream that
records the exact request line it was sent.)"""

from __future__ import annotations

import base64
import gzip
import json
from urllib.parse import unquote

import pytest

from tests.raw_http import Answerer, Received, json_answer, recording_upstream, send_raw
from tests.security_cases import (  # noqa: F401 (fixtures, taken by name)
    ALICE,
    BOB,
    CONTENT,
    SECRET,
    bearer,
    config,
    gw,
    post,
    upstream,
)


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
