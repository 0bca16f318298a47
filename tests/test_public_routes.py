"""A keyed route whose configured pipeline names no caller would serve anyone with the channel's
credential: check-config and every load refuse it unless the route says `public: true`, which
is then said at every start and reload."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.config import ConfigError
from proxy.registry import config_warnings, parse_config

ROOT = Path(__file__).parent.parent
RESPONSE = {"model": "respmodel-4o", "input": "hi"}
CALLERLESS = "routes: {responses: {plugins: [validation, usage, sse]}}\n"
PUBLIC = "routes: {responses: {public: true, plugins: [validation, usage, sse]}}\n"


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(path)], capture_output=True, text=True, cwd=ROOT
    )


def test_check_config_refuses_a_keyed_route_whose_pipeline_names_no_caller(tmp_path: Path) -> None:
    config = tmp_path / "open.yaml"
    config.write_text(CALLERLESS)
    result = check_config(config)
    assert result.returncode == 1
    assert (
        "routes.responses.plugins: no plugin provides the caller's identity (the gateway key, its name and "
        "tenant) (add auth first): anyone who reaches the gateway would be served with the channel's "
        "credential; if that is meant, say so with routes.responses.public: true"
    ) in result.stderr


def test_public_true_passes_check_config_with_a_warning(tmp_path: Path) -> None:
    config = tmp_path / "public.yaml"
    config.write_text(PUBLIC)
    result = check_config(config)
    assert result.returncode == 0, result.stderr
    assert f"{config}: ok" in result.stdout
    assert (
        "warning: routes.responses.public: no plugin of its pipeline provides the caller: anyone who reaches "
        "the gateway is served on this route with the channel's credential"
    ) in result.stderr


def test_every_configured_keyed_route_is_held_to_it_and_the_account_routes_are_not() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(
            "routes: {messages: {plugins: []}, video_generations: {plugins: [video]}, "
            "models: {plugins: [ratelimit]}, login_2fa: {plugins: []}, payment_webhook: {plugins: []}}",
            {},
        )
    callerless = sorted(p.split(":")[0] for p in refused.value.problems if "no plugin provides the caller" in p)
    assert callerless == ["routes.messages.plugins", "routes.models.plugins", "routes.video_generations.plugins"]
    parse_config("routes: {login_2fa: {plugins: []}, payment_webhook: {plugins: []}}", {})  # no key there: no caller


def test_a_public_that_changes_nothing_is_said_too() -> None:
    config = parse_config(
        "routes: {messages: {public: true}, login_2fa: {public: true}, "
        "responses: {public: true, plugins: [auth, usage, sse]}}",
        {},
    )
    assert config_warnings(config) == [
        "routes.messages.public: a plugin of its pipeline provides the caller, so keys are still required: "
        "public changes nothing",
        "routes.responses.public: a plugin of its pipeline provides the caller, so keys are still required: "
        "public changes nothing",
        "routes.login_2fa.public: route login_2fa takes no gateway key: public changes nothing",
    ]


async def test_start_refuses_it_and_a_reload_to_it_keeps_the_running_config(
    start_gateway,
    http,
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError):
        await start_gateway(CALLERLESS)
    gw = await start_gateway("")
    assert gw.owner.config_path is not None
    Path(gw.owner.config_path).write_text(CALLERLESS)
    assert await gw.owner.reload() is False
    async with http.post(gw.url + "/v1/responses", json=RESPONSE) as answer:
        assert answer.status == 401  # still keyed
    assert not gw.sim().requests


async def test_a_public_route_serves_without_a_key_and_says_so_at_start_and_reload(
    start_gateway, http, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="modelgate.runtime"):
        gw = await start_gateway(PUBLIC)
        warned = [r.getMessage() for r in caplog.records if "routes.responses.public" in r.getMessage()]
        assert len(warned) == 1
        async with http.post(gw.url + "/v1/responses", json=RESPONSE) as answer:
            assert answer.status == 200  # no key: as the operator declared
        image = {"model": "imagegen-2", "prompt": "x"}
        async with http.post(gw.url + "/v1/images/generations", json=image) as answer:
            assert answer.status == 401  # every other route keeps its default pipeline
        assert await gw.owner.reload() is True
        assert len([r for r in caplog.records if "routes.responses.public" in r.getMessage()]) == 2
