"""An upstream refusing the channel's credential (401) is the gateway's fault: a 502
`upstream_auth_failed` in the endpoint's own shape (the upstream's words never relayed), logged
at error with the channel, counted, and the channel's breaker opened for every other request.
A 403 refuses one request (a model the account may not use): a 502 `upstream_forbidden`, and
the channel stays in rotation."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from proxy.config.model import SimulatorSettings
from proxy.observability.access_log import AccessLog
from proxy.policy.resilience import ChannelHealth
from simulator import build_simulator_app
from simulator.core import Simulator
from tests.conftest import BEARER, DEMO_KEY, MESSAGE_HEADERS
from tests.raw_http import Received, json_answer, recording_upstream

RESPONSE = {"model": "respmodel-4o", "input": "hi"}
MESSAGE = {"model": "msgmodel-sonnet-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
CONTENT = {"contents": [{"parts": [{"text": "hi"}]}]}
WRONG = "sk-upstream-rotated-away-1234"


@pytest.fixture
async def keyed_upstream() -> AsyncIterator[tuple[Simulator, str]]:
    """A simulator of its own that takes one credential only (not the one the gateway will send)."""
    sim = Simulator("upstream", SimulatorSettings(), key="sk-upstream-current-5678")
    runner = web.AppRunner(build_simulator_app(sim))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield sim, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    await runner.cleanup()


def auth_failures(channel: str, kind: str = "status_auth") -> float | None:
    return REGISTRY.get_sample_value("modelgate_upstream_errors_total", {"channel": channel, "kind": kind})


async def test_an_upstream_401_is_a_502_of_the_gateways_and_opens_the_breaker(
    start_gateway,
    http,
    keyed_upstream,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim, url = keyed_upstream
    access_lines: list[dict[str, object]] = []
    monkeypatch.setattr(AccessLog, "write", lambda self, event: access_lines.append(event))
    gw = await start_gateway(f"channels: [{{name: rotated, base_url: '{url}', credential: {WRONG}}}]")
    assert auth_failures("rotated") == 0.0  # counted from 0, so the first one is an increase
    with caplog.at_level(logging.INFO):
        async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
            assert answer.status == 502
            assert answer.headers["x-should-retry"] == "false"
            text = await answer.text()
        error = json.loads(text)["error"]
        assert error["code"] == "upstream_auth_failed" and error["type"] == "server_error"
        assert error["message"] == (
            "upstream rotated answered 401: it refused the gateway's own credential (the "
            "gateway's configuration is at fault, not this request's key)"
        )
        assert "invalid or missing API key" not in text and WRONG not in text  # the upstream's words stay upstream
        assert len(sim.requests) == 1
        # The credential is wrong for every request: the next one is not sent upstream.
        async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
            assert answer.status == 503
            assert (await answer.json())["error"]["code"] == "no_healthy_channel"
        assert len(sim.requests) == 1
    assert gw.channel("rotated").health.is_open
    assert auth_failures("rotated") == 1.0
    said = [r for r in caplog.records if r.name == "modelgate.forwarder"]
    assert [(r.levelno, getattr(r, "channel", None), getattr(r, "status", None)) for r in said] == [
        (logging.ERROR, "rotated", 401)
    ]
    assert not any(WRONG in r.getMessage() or WRONG in str(r.__dict__) for r in caplog.records)
    # The access line says what the client was sent: the gateway's own answer, all its bytes.
    assert [(line["status"], line["bytes_out"]) for line in access_lines][:1] == [(502, len(text.encode()))]


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("call", ["messages", "content", "images"])
async def test_in_every_format_its_own_shape(start_gateway, http, status: int, call: str) -> None:
    gw = await start_gateway(f"channels: [{{name: only, base_url: simulator, simulator: {{fail_status: {status}}}}}]")
    path, headers, body = {
        "messages": ("/v1/messages", MESSAGE_HEADERS, MESSAGE),
        "content": (f"/v1beta/models/genmodel-2.0-flash:generateContent?key={DEMO_KEY}", {}, CONTENT),
        "images": ("/v1/images/generations", BEARER, {"model": "imagegen-2", "prompt": "x", "size": "1024x1024"}),
    }[call]
    async with http.post(gw.url + path, json=body, headers=headers) as answer:
        assert answer.status == 502
        assert answer.headers["x-should-retry"] == "false"
        error = (await answer.json())["error"]
    code = {401: "upstream_auth_failed", 403: "upstream_forbidden"}[status]
    if call == "content":  # google.rpc: the machine code is an ErrorInfo reason
        assert error["code"] == 502 and error["status"] == "UNAVAILABLE"
        assert error["details"][0]["reason"] == code
    else:
        assert error["code"] == code
    assert "simulated upstream fault" not in error["message"]
    assert f"answered {status}" in error["message"]
    assert gw.channel("only").health.is_open is (status == 401)  # a 403 is this request's, not the channel's


MESSAGE_ANSWER = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "stop_reason": "end_turn",
    "content": [{"type": "text", "text": "hi"}],
    "usage": {"input_tokens": 1, "output_tokens": 1},
}
# What Anthropic answers a model the account may not use; it names the account.
FORBIDDEN = {
    "type": "error",
    "error": {"type": "permission_error", "message": "Your organization org-gw-4711 may not use model 'forbidden'"},
}


def forbidding(model: str):
    """An upstream that answers 403 permission_error to requests for `model`, and 200 to others."""

    def answer(received: Received) -> bytes:
        refused = json.loads(received.body).get("model") == model
        return json_answer(403, FORBIDDEN) if refused else json_answer(200, MESSAGE_ANSWER)

    return recording_upstream(answer)


def two_channels(a: str, b: str, b_priority: int = 0) -> str:
    return f"""
channels:
  - {{name: a, base_url: "{a}", credential: sk-upstream-a-1111, models: ["*"]}}
  - {{name: b, base_url: "{b}", credential: sk-upstream-b-2222, models: ["*"], priority: {b_priority}}}
"""


async def test_a_403_for_one_model_opens_no_breaker_and_the_others_are_served(start_gateway, http) -> None:
    """Both channels' accounts may not use one model. Before, one request for it opened both
    breakers (30 s of 503 `no_healthy_channel` for every tenant); now each 403 is that request's
    alone: it goes to the other channel, then the client gets a 502 `upstream_forbidden`, and the
    channels serve every other request."""
    (up_a, got_a), (up_b, got_b) = forbidding("forbidden"), forbidding("forbidden")
    async with up_a, up_b:
        gw = await start_gateway(two_channels(up_a.url, up_b.url))
        kinds = ("status_auth", "status_forbidden")
        before = {(c, kind): auth_failures(c, kind) or 0.0 for c in "ab" for kind in kinds}
        forbidden = {**MESSAGE, "model": "forbidden"}
        for n in range(1, 8):  # past breaker_failures (5), had they counted
            async with http.post(gw.url + "/v1/messages", json=forbidden, headers=MESSAGE_HEADERS) as answer:
                assert answer.status == 502, await answer.text()
                assert answer.headers["x-should-retry"] == "false"
                text = await answer.text()
            error = json.loads(text)["error"]
            assert error["code"] == "upstream_forbidden" and error["type"] == "server_error"
            assert "answered 403: it refused this request" in error["message"]
            # The upstream's words name its account: not relayed.
            assert "org-gw-4711" not in text and "permission_error" not in text
            assert len(got_a) == len(got_b) == n  # the other channel was tried: another account may be permitted
            for name in "ab":
                health = gw.channel(name).health
                assert not health.is_open and health.failures == 0 and health.available()
        async with http.post(gw.url + "/v1/messages", json=MESSAGE, headers=MESSAGE_HEADERS) as answer:
            assert answer.status == 200, await answer.text()
    for name in "ab":
        assert auth_failures(name, "status_forbidden") == before[(name, "status_forbidden")] + 7
        assert auth_failures(name) == before[(name, "status_auth")]  # nothing for the credential alert


async def test_a_403_goes_to_a_channel_whose_account_is_permitted(start_gateway, http) -> None:
    forbids, permits = forbidding("forbidden"), forbidding("none-of-these")
    (up_a, got_a), (up_b, got_b) = forbids, permits
    async with up_a, up_b:
        gw = await start_gateway(two_channels(up_a.url, up_b.url, b_priority=1))  # a first
        for _ in range(2):
            async with http.post(
                gw.url + "/v1/messages", json={**MESSAGE, "model": "forbidden"}, headers=MESSAGE_HEADERS
            ) as answer:
                assert answer.status == 200, await answer.text()
        assert len(got_a) == len(got_b) == 2  # a stays first: its 403 did not take it out of rotation
        assert not gw.channel("a").health.is_open


async def test_another_channel_serves_it_a_video_submission_too(start_gateway, http) -> None:
    """The upstream refused before doing any work: nothing ran, so the request may go elsewhere."""
    gw = await start_gateway("""
channels:
  - {name: first, base_url: simulator, priority: 0, simulator: {fail_status: 401}}
  - {name: second, base_url: simulator, priority: 1}
""")
    async with http.post(
        gw.url + "/v1/video/generations", headers=BEARER, json={"model": "videogen-3.0-generate-001", "prompt": "x"}
    ) as answer:
        assert answer.status == 200
    async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
        assert answer.status == 200
    # One refusal opened the first channel's breaker: the second request went straight to the second.
    assert len(gw.sim("first").requests) == 1 and len(gw.sim("second").requests) == 2


async def test_on_the_account_routes_a_401_is_the_clients_own_and_relayed(start_gateway, http) -> None:
    """The login and the webhook carry the client's credentials, never the channel's."""
    gw = await start_gateway(
        "channels: [{name: accounts, base_url: simulator, formats: [account], simulator: {fail_status: 401}}]"
    )
    async with http.post(gw.url + "/api/user/login/2fa", json={"code": "000000"}) as answer:
        assert answer.status == 401
        assert "simulated upstream fault 401" in (await answer.json())["error"]["message"]
    assert not gw.channel("accounts").health.is_open


def test_a_refusal_opens_the_breaker_at_once_and_a_failed_probe_opens_it_again(clock) -> None:
    health = ChannelHealth(failures_to_open=5, open_s=30, clock=clock)
    health.record(True, at_once=True)
    assert health.state() == ("open", 30.0)
    clock.advance(30)
    assert health.available()
    health.chosen()  # the probe: the credential still wrong
    health.record(True, at_once=True)
    assert health.state() == ("open", 30.0)
    clock.advance(30)
    health.chosen()
    health.record(False)  # fixed (a reload builds new breakers anyway)
    assert health.state() == ("closed", 0.0)
