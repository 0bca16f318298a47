"""An upstream refusing the channel's credential (401/403) is the gateway's fault: a 502
`upstream_auth_failed` in the endpoint's own shape (the upstream's words never relayed), logged
at error with the channel, counted, and the channel's breaker opened for every other request."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from proxy.config.model import SimulatorSettings
from proxy.policy.resilience import ChannelHealth
from simulator import build_simulator_app
from simulator.core import Simulator
from tests.conftest import BEARER, DEMO_KEY, MESSAGE_HEADERS

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


def auth_failures(channel: str) -> float | None:
    return REGISTRY.get_sample_value("modelgate_upstream_errors_total", {"channel": channel, "kind": "status_auth"})


async def test_an_upstream_401_is_a_502_of_the_gateways_and_opens_the_breaker(
        start_gateway, http, keyed_upstream, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    sim, url = keyed_upstream
    gw = await start_gateway(f"channels: [{{name: rotated, base_url: '{url}', credential: {WRONG}}}]")
    assert auth_failures("rotated") == 0.0  # counted from 0, so the first one is an increase
    with caplog.at_level(logging.INFO):
        async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
            assert answer.status == 502
            assert answer.headers["x-should-retry"] == "false"
            text = await answer.text()
        error = json.loads(text)["error"]
        assert error["code"] == "upstream_auth_failed" and error["type"] == "server_error"
        assert error["message"] == ("upstream rotated answered 401: it refused the gateway's own credential (the "
                                    "gateway's configuration is at fault, not this request's key)")
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
        (logging.ERROR, "rotated", 401)]
    assert not any(WRONG in r.getMessage() or WRONG in str(r.__dict__) for r in caplog.records)


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("call", ["messages", "content", "images"])
async def test_in_every_format_its_own_shape(start_gateway, http, status: int, call: str) -> None:  # noqa: ANN001
    gw = await start_gateway(f"channels: [{{name: only, base_url: simulator, simulator: {{fail_status: {status}}}}}]")
    path, headers, body = {
        "messages": ("/v1/messages", MESSAGE_HEADERS, MESSAGE),
        "content": (f"/v1beta/models/genmodel-2.0-flash:generateContent?key={DEMO_KEY}", {}, CONTENT),
        "images": ("/v1/images/generations", BEARER, {"model": "imagegen-2", "prompt": "x", "size": "1024x1024"}),
    }[call]
    async with http.post(gw.url + path, json=body, headers=headers) as answer:
        assert answer.status == 502
        error = (await answer.json())["error"]
    if call == "content":  # google.rpc: the machine code is an ErrorInfo reason
        assert error["code"] == 502 and error["status"] == "UNAVAILABLE"
        assert error["details"][0]["reason"] == "upstream_auth_failed"
    else:
        assert error["code"] == "upstream_auth_failed"
    assert "simulated upstream fault" not in error["message"]
    assert f"answered {status}" in error["message"]
    assert gw.channel("only").health.is_open


async def test_another_channel_serves_it_a_video_submission_too(start_gateway, http) -> None:  # noqa: ANN001
    """The upstream refused before doing any work: nothing ran, so the request may go elsewhere."""
    gw = await start_gateway("""
channels:
  - {name: first, base_url: simulator, priority: 0, simulator: {fail_status: 401}}
  - {name: second, base_url: simulator, priority: 1}
""")
    async with http.post(gw.url + "/v1/video/generations", headers=BEARER,
                         json={"model": "videogen-3.0-generate-001", "prompt": "x"}) as answer:
        assert answer.status == 200
    async with http.post(gw.url + "/v1/responses", json=RESPONSE, headers=BEARER) as answer:
        assert answer.status == 200
    # One refusal opened the first channel's breaker: the second request went straight to the second.
    assert len(gw.sim("first").requests) == 1 and len(gw.sim("second").requests) == 2


async def test_on_the_account_routes_a_401_is_the_clients_own_and_relayed(start_gateway, http) -> None:  # noqa: ANN001
    """The login and the webhook carry the client's credentials, never the channel's."""
    gw = await start_gateway("channels: [{name: accounts, base_url: simulator, formats: [account], "
                             "simulator: {fail_status: 401}}]")
    async with http.post(gw.url + "/api/user/login/2fa", json={"code": "000000"}) as answer:
        assert answer.status == 401
        assert "simulated upstream fault 401" in (await answer.json())["error"]["message"]
    assert not gw.channel("accounts").health.is_open


def test_a_refusal_opens_the_breaker_at_once_and_a_failed_probe_opens_it_again(clock) -> None:  # noqa: ANN001
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
