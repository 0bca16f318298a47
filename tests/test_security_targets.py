"""The upstream request is built, not copied: only origin-form targets, no encoded traversal, nothing
but the route's template reaches the upstream. (docs/security.md; each numbered case is an attack
that once worked, replayed through real sockets against an upstream that records the exact request
line it was sent.)"""

from __future__ import annotations

import base64
import re
from urllib.parse import quote, unquote

import pytest

from proxy.request.target import PARAM_GRAMMAR
from proxy.wire.routes import ROUTES
from tests.raw_http import Received, json_answer, recording_upstream, send_raw
from tests.security_cases import (  # noqa: F401 (fixtures, taken by name)
    ALICE,
    CONTENT,
    GEN_ONLY,
    PNG,
    SECRET,
    VIDEO,
    bearer,
    config,
    get,
    gw,
    post,
    submit,
    upstream,
)


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
    "chat_completions": b'{"model":"respmodel-4o","messages":[{"role":"user","content":"x"}]}',
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


async def test_the_rebuilt_query_reads_as_the_clients_did(gw, upstream):
    target = f"/v1beta/models/genmodel-2.0-flash:generateContent?alt=sse&flag&list=a,b:c&q=x+y%2By&key={ALICE}"
    assert (await send_raw(gw.url, *post(target, "", CONTENT))).status == 200
    assert upstream[1][-1].query == f"alt=sse&flag&list=a,b:c&q=x%20y%2By&key={SECRET}"


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
