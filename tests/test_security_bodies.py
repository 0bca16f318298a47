"""Request bodies are read one way: what the gateway decides by reaches the upstream as it read it, and
a body some reader would read otherwise is refused. (docs/security.md; each numbered case is an
attack that once worked, replayed through real sockets against an upstream that records the exact
request line it was sent.)"""

from __future__ import annotations

import gzip
import json

import pytest

from tests.raw_http import json_answer, recording_upstream, send_raw
from tests.security_cases import (  # noqa: F401 (fixtures, taken by name)
    ALICE,
    BOB,
    CHEAP,
    GEN_ONLY,
    PNG,
    SECRET,
    bearer,
    config,
    gw,
    post,
    upstream,
)


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
