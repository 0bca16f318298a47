"""Gateway keys (spec section 5): read from the endpoint's place and where its official SDK sends it
(not in strict mode); 401 and 403 in the endpoint's shape."""

from __future__ import annotations

import hashlib

import aiohttp
import pytest

GOOD, HASHED, OFF, OLD, NARROW = ("good-key-0001", "hashed-key-02", "disabled-key-3", "expired-key-4", "narrow-key-05")
CONFIG = f"""
keys:
  - {{name: good, key: {GOOD}, labels: {{team: search}}}}
  - {{name: hashed, sha256: {hashlib.sha256(HASHED.encode()).hexdigest()}}}
  - {{name: paused, key: {OFF}, enabled: false}}
  - {{name: old, key: {OLD}, expires_at: "2020-01-01T00:00:00Z"}}
  - {{name: narrow, key: {NARROW}, models: ["msgmodel-haiku-*", "genmodel-2.0-*", "respmodel-4o*"],
     endpoints: [messages, generate_content, responses]}}
channels: [{{name: sim, base_url: simulator, credential: upstream-credential}}]
"""

MESSAGE = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
CONTENT = {"contents": [{"parts": [{"text": "hi"}]}]}
RESPONSE = {"model": "respmodel-4o", "input": "hi"}


def messages(key: str | None, model: str = "msgmodel-haiku-4-5") -> tuple[str, dict, dict]:
    headers = {"msgapi-version": "2023-06-01"} | ({"x-api-key": key} if key else {})
    return "/v1/messages", headers, {**MESSAGE, "model": model}


def content(key: str | None, model: str = "genmodel-2.0-flash") -> tuple[str, dict, dict]:
    return f"/v1beta/models/{model}:generateContent" + (f"?key={key}" if key else ""), {}, CONTENT


def responses(key: str | None, model: str = "respmodel-4o") -> tuple[str, dict, dict]:
    return "/v1/responses", {"Authorization": f"Bearer {key}"} if key else {}, {**RESPONSE, "model": model}


def shape(fmt: str, status: int, body: dict) -> None:
    error = body["error"]
    if fmt == "messages":
        assert set(error) == {"type", "message", "code"}
        assert error["type"] == {401: "authentication_error", 403: "permission_error"}[status]
    elif fmt == "content":
        assert set(error) == {"code", "message", "status", "details"} and error["code"] == status
        assert error["status"] == {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED"}[status]
    else:
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == {401: "authentication_error", 403: "permission_error"}[status]


@pytest.fixture
async def gw(start_gateway):
    return await start_gateway(CONFIG)


CASES = [
    ("missing key", 401, "missing_api_key", None, None),
    ("unknown key", 401, "invalid_api_key", "not-a-real-key", None),
    ("disabled key", 401, "api_key_disabled", OFF, None),
    ("expired key", 401, "api_key_expired", OLD, None),
    (
        "model not allowed",
        403,
        "model_not_allowed",
        NARROW,
        {"messages": "msgmodel-opus-4-5", "content": "genmodel-3-pro-image-preview", "responses": "respmodel-5"},
    ),
]


@pytest.mark.parametrize(("fmt", "build"), [("messages", messages), ("content", content), ("responses", responses)])
@pytest.mark.parametrize(("case", "status", "code", "key", "models"), CASES)
async def test_refused_keys_get_401_or_403_in_the_endpoint_shape(gw, http, fmt, build, case, status, code, key, models):
    path, headers, body = build(key, models[fmt]) if models else build(key)
    async with http.post(gw.url + path, json=body, headers=headers) as answer:
        assert answer.status == status, case
        got = await answer.json()
    shape(fmt, status, got)
    reason = got["error"]["details"][0]["reason"] if fmt == "content" else got["error"]["code"]
    assert reason == code
    assert len(gw.sim("sim").requests) == 0


async def test_an_endpoint_the_key_may_not_use_is_a_403(gw, http):
    body = {"model": "imagegen-2", "prompt": "x"}
    async with http.post(
        gw.url + "/v1/images/generations", json=body, headers={"Authorization": f"Bearer {NARROW}"}
    ) as answer:
        assert answer.status == 403
        assert (await answer.json())["error"]["code"] == "endpoint_not_allowed"


@pytest.mark.parametrize(("fmt", "build"), [("messages", messages), ("content", content), ("responses", responses)])
@pytest.mark.parametrize("key", [GOOD, HASHED])
async def test_a_good_key_passes_and_the_upstream_never_sees_it(gw, http, fmt, build, key):
    path, headers, body = build(key)
    async with http.post(gw.url + path, json=body, headers=headers) as answer:
        assert answer.status == 200
    record = gw.last_upstream_request("sim")
    assert key not in repr(record.headers) + record.query


SDK_PLACES = [  # where the official SDKs put the key: read unless server.strict_interface
    ("/v1/messages", {"Authorization": f"Bearer {GOOD}", "anthropic-version": "2023-06-01"}, MESSAGE),
    ("/v1beta/models/genmodel-2.0-flash:generateContent", {"x-goog-api-key": GOOD}, CONTENT),
    ("/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse", {"x-goog-api-key": GOOD}, CONTENT),
]
WRONG_PLACES = [
    ("/v1/responses", {"x-api-key": GOOD}, RESPONSE),
    ("/v1/responses?key=" + GOOD, {}, RESPONSE),
    ("/v1beta/models/genmodel-2.0-flash:generateContent", {"Authorization": f"Bearer {GOOD}"}, CONTENT),
    ("/v1beta/models/genmodel-2.0-flash:generateContent", {"x-api-key": GOOD}, CONTENT),
    ("/v1/messages?key=" + GOOD, {"msgapi-version": "2023-06-01"}, MESSAGE),
    ("/v1/video/generations", {"x-api-key": GOOD}, {"model": "videogen-3.0-generate-001", "prompt": "x"}),
]


@pytest.mark.parametrize(("path", "headers", "body"), SDK_PLACES)
async def test_a_key_where_the_formats_sdk_sends_it_is_read_and_never_forwarded(gw, http, path, headers, body):
    async with http.post(gw.url + path, json=body, headers=headers) as answer:
        assert answer.status == 200, await answer.text()
        await answer.read()
    record = gw.last_upstream_request("sim")
    assert GOOD not in repr(record.headers) + record.query
    assert "upstream-credential" in repr(record.headers) + record.query  # the channel's own, in the spec's place


@pytest.mark.parametrize(("path", "headers", "body"), SDK_PLACES)
async def test_strict_mode_reads_only_the_spec_places(start_gateway, http, path, headers, body):
    gw = await start_gateway(CONFIG + "server: {strict_interface: true}\n")
    spec_version = {"msgapi-version": "2023-06-01"} if path == "/v1/messages" else {}
    async with http.post(gw.url + path, json=body, headers={**headers, **spec_version}) as answer:
        assert answer.status == 401, await answer.text()
        message = (await answer.json())["error"]["message"]
    assert "x-goog-api-key" not in message and "Bearer" not in message  # only the spec's place is named
    assert len(gw.sim("sim").requests) == 0


async def test_anthropic_version_stands_for_msgapi_version_except_in_strict_mode(start_gateway, http):
    lenient = await start_gateway(CONFIG)
    headers = {"x-api-key": GOOD, "anthropic-version": "2023-06-01"}
    async with http.post(lenient.url + "/v1/messages", json=MESSAGE, headers=headers) as answer:
        assert answer.status == 200
    assert lenient.last_upstream_request("sim").header("anthropic-version") == "2023-06-01"
    strict = await start_gateway(CONFIG + "server: {strict_interface: true}\n")
    async with http.post(strict.url + "/v1/messages", json=MESSAGE, headers=headers) as answer:
        assert answer.status == 400
        assert (await answer.json())["error"]["message"].startswith("msgapi-version: this header is required")


@pytest.mark.parametrize("wanted", ["msgapi-version", "anthropic-version"])
async def test_a_channel_names_the_version_header_it_is_sent(start_gateway, http, wanted):
    gw = await start_gateway(
        CONFIG.replace("credential: upstream-credential", f"credential: upstream-credential, version_header: {wanted}")
    )
    for sent in ({"anthropic-version": "2023-06-01"}, {"msgapi-version": "2023-06-01"}):
        async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers={"x-api-key": GOOD, **sent}) as answer:
            assert answer.status == 200
        headers = {name.lower(): value for name, value in gw.last_upstream_request("sim").headers}
        assert headers[wanted] == "2023-06-01"
        assert ({"msgapi-version", "anthropic-version"} - {wanted}).isdisjoint(headers)


async def test_two_different_keys_in_one_request_are_refused(gw, http):
    headers = {"x-api-key": GOOD, "Authorization": f"Bearer {HASHED}", "msgapi-version": "2023-06-01"}
    async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=headers) as answer:
        assert answer.status == 401
        assert (await answer.json())["error"]["code"] == "ambiguous_api_key"
    path = f"/v1beta/models/genmodel-2.0-flash:generateContent?key={GOOD}"
    async with http.post(gw.url + path, json=CONTENT, headers={"x-goog-api-key": HASHED}) as answer:
        assert answer.status == 401
    assert len(gw.sim("sim").requests) == 0


@pytest.mark.parametrize(("path", "headers", "body"), WRONG_PLACES)
async def test_a_key_in_another_formats_place_is_not_read(gw, http, path, headers, body):
    async with http.post(gw.url + path, json=body, headers=headers) as answer:
        assert answer.status == 401


async def test_login_and_webhook_take_no_key(gw, http):
    async with http.post(gw.url + "/api/user/login/2fa", json={}) as answer:
        assert answer.status == 200
    async with http.post(gw.url + "/api/acme/webhook", data=b"{}") as answer:
        assert answer.status == 200


async def test_the_exchange_carries_the_key_name_and_labels(start_gateway, http):
    from tests.recording_plugin import Recorder

    Recorder.finished.clear()
    gw = await start_gateway(CONFIG + "routes: {responses: {plugins: [auth, tests.recording_plugin:Recorder]}}\n")
    path, headers, body = responses(GOOD)
    async with http.post(gw.url + path, json=body, headers=headers) as answer:
        assert answer.status == 200
    ex = Recorder.finished[-1]
    assert ex.key_name == "good" and ex.key.labels == {"team": "search"}


async def test_a_plaintext_key_never_reaches_the_logs(spawn):
    gw = spawn("gateway", config="server: {listen: '127.0.0.1:{PORT}'}\n" + CONFIG)
    async with aiohttp.ClientSession() as http:
        for build in (messages, content, responses):
            for key in (GOOD, OFF, "wrong-but-secret-key"):
                path, headers, body = build(key)
                async with http.post(gw.url + path, json=body, headers=headers) as answer:
                    await answer.read()
    gw.proc.terminate()
    gw.proc.wait(timeout=10)
    log = gw.log.read_text()
    assert '"key_name":"good"' in log and '"key_name":"paused"' in log
    for secret in (GOOD, OFF, "wrong-but-secret-key"):
        assert secret not in log


def test_key_config_problems_name_the_key():
    from proxy.config import ConfigError
    from proxy.registry import parse_config

    with pytest.raises(ConfigError) as caught:
        parse_config(
            """
            keys:
              - {name: a, key: short}
              - {name: b, sha256: nothex}
              - {name: c}
              - {name: d, key: same-secret-1, sha256: %s}
        """
            % ("ab" * 32),
            {},
        )
    problems = "\n".join(caught.value.problems)
    assert "keys[0]: a key must be at least 8 characters" in problems
    assert "keys[1].sha256: not a SHA-256 hex digest" in problems
    assert "keys[2]: give exactly one of 'key' and 'sha256'" in problems
    assert "keys[3]: give exactly one of 'key' and 'sha256'" in problems


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/messages", [("Authorization", f"Bearer {GOOD}"), ("Authorization", f"Bearer {HASHED}")]),
        ("/v1/messages", [("x-api-key", GOOD), ("x-api-key", HASHED)]),
        ("/v1beta/models/genmodel-2.0-flash:generateContent", [("x-goog-api-key", GOOD), ("x-goog-api-key", HASHED)]),
        (f"/v1beta/models/genmodel-2.0-flash:generateContent?key={GOOD}&key={HASHED}", []),
    ],
)
async def test_a_key_place_given_twice_with_two_keys_is_ambiguous(gw, path, headers):
    from tests.raw_http import send_raw

    lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
    body = (
        b'{"model":"msgmodel-haiku-4-5","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'
        if path == "/v1/messages"
        else b'{"contents":[{"parts":[{"text":"hi"}]}]}'
    )
    head = (
        f"POST {path} HTTP/1.1\r\n{lines}msgapi-version: 2023-06-01\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}"
    ).encode()
    answer = await send_raw(gw.url, head, body)
    assert answer.status == 401 and b"ambiguous_api_key" in answer.body
    assert len(gw.sim("sim").requests) == 0


async def test_two_version_headers_that_differ_are_no_conflict_the_interfaces_goes(gw, http):
    # An SDK sends its own version on every call; the one the client set in msgapi-version wins
    # (tests/test_open_enums.py has the SDK's call and every channel setting).
    headers = {"x-api-key": GOOD, "msgapi-version": "2023-06-01", "anthropic-version": "2099-01-01"}
    async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=headers) as answer:
        assert answer.status == 200
    record = gw.last_upstream_request("sim")
    assert record.header("msgapi-version") == "2023-06-01" and record.header("anthropic-version") is None
