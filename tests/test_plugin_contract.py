"""The plugin contract: plugins declare where they join and what they need, and a pipeline whose
plugins do not get what they require is refused with its key path, by `check-config` too."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from proxy.config import ConfigError
from proxy.core.plugin import Joins, Plugin, PluginCommand
from proxy.registry import default_plugins, order_problems, parse_config
from proxy.wire.routes import ROUTES, ROUTES_BY_NAME
from tests.conftest import DEMO_KEY, MESSAGE_HEADERS

ROOT = Path(__file__).parent.parent


class NeedsCaller(Plugin):
    """A third-party plugin that reads the caller's identity, as a tenant quota would."""

    requires = frozenset({"caller"})


class Counts(Plugin):
    """A third-party plugin joining the message route by default, after the built-in ones."""

    joins = Joins(routes=frozenset({"messages"}))
    order = 999


def problems(config: str) -> list[str]:
    with pytest.raises(ConfigError) as refused:
        parse_config(textwrap.dedent(config), {})
    return refused.value.problems


def test_a_plugin_before_the_one_providing_what_it_requires_is_refused_with_its_key_path() -> None:
    found = problems("routes: {messages: {plugins: [ratelimit, auth, usage, sse]}}")
    assert found == [
        "routes.messages.plugins[0]: ratelimit requires the caller's identity (the gateway key, its "
        "name and tenant), which auth at [1] provides only after it: put auth first"
    ]


def test_a_plugin_whose_requirement_nobody_provides_is_refused_and_told_who_does() -> None:
    # public: an open route still needs the caller for url_delivery, which asks whose it is
    found = problems("routes: {image_generations: {public: true, plugins: [validation, url_delivery, usage]}}")
    assert found == [
        "routes.image_generations.plugins[1]: url_delivery requires the caller's identity (the "
        "gateway key, its name and tenant), which no plugin before it on route image_generations "
        "provides (add auth before it)"
    ]


def test_third_party_plugins_declare_requirements_the_same_way() -> None:
    found = problems("routes: {responses: {plugins: ['tests.test_plugin_contract:NeedsCaller', auth]}}")
    assert [p.split(":")[0] for p in found] == ["routes.responses.plugins[0]"]
    parse_config("routes: {responses: {plugins: [auth, 'tests.test_plugin_contract:NeedsCaller']}}", {})


def test_a_requirement_is_void_where_nothing_could_provide_it() -> None:
    # The login takes no key, so it has no caller: ratelimit limits by client IP there, needing no auth.
    parse_config("routes: {login_2fa: {plugins: [ratelimit]}}", {})
    assert problems("routes: {messages: {plugins: [ratelimit]}}")[0].startswith(
        "routes.messages.plugins[0]: ratelimit requires"
    )


def test_a_plugin_named_twice_is_refused() -> None:
    assert problems("routes: {messages: {plugins: [auth, usage, auth]}}") == [
        "routes.messages.plugins[2]: auth is already at [0]: each plugin runs once"
    ]


def test_check_config_names_an_ordering_problem(tmp_path: Path) -> None:
    config = tmp_path / "wrong-order.yaml"
    config.write_text("routes:\n  responses: {plugins: [url_delivery, auth]}\n")
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(config)], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 1
    assert "routes.responses.plugins[0]: url_delivery requires the caller's identity" in result.stderr


def test_default_pipelines_come_from_the_plugins_declarations_in_their_order() -> None:
    assert default_plugins(ROUTES_BY_NAME["messages"]) == [
        "auth",
        "validation",
        "ratelimit",
        "budget",
        "usage",
        "sse",
        "ledger",
    ]
    assert default_plugins(ROUTES_BY_NAME["image_generations"]) == [
        "auth",
        "validation",
        "ratelimit",
        "budget",
        "url_delivery",
        "usage",
        "sse",
        "ledger",
    ]
    assert default_plugins(ROUTES_BY_NAME["video_generation_status"]) == [
        "auth",
        "validation",
        "ratelimit",
        "budget",
        "video",
        "ledger",
    ]
    assert default_plugins(ROUTES_BY_NAME["payment_webhook"]) == ["ratelimit", "webhook_queue"]
    assert default_plugins(ROUTES_BY_NAME["login_2fa"]) == ["ratelimit"]
    for route in ROUTES:  # every default pipeline keeps the contract it is held to
        assert order_problems(route, default_plugins(route), route.name) == []


def test_a_third_party_plugin_joins_default_pipelines_by_declaring_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy import registry

    monkeypatch.setitem(registry.registered_classes(), "counts", Counts)
    assert default_plugins(ROUTES_BY_NAME["messages"]) == [
        "auth",
        "validation",
        "ratelimit",
        "budget",
        "usage",
        "sse",
        "ledger",
        "counts",
    ]
    assert "counts" not in default_plugins(ROUTES_BY_NAME["responses"])


def test_plugin_fields_on_a_key_are_read_by_their_plugin_and_checked(tmp_path: Path) -> None:
    config = parse_config(f"keys: [{{name: k, key: {DEMO_KEY}, url_delivery: 'false'}}]", {})
    assert config.keys[0].model_extra == {"url_delivery": False}  # as the plugin's model reads it, not the text
    assert problems(f"keys: [{{name: k, key: {DEMO_KEY}, url_delivry: true}}]") == [
        "keys[0].url_delivry: unknown key (did you mean 'url_delivery'?)"
    ]
    assert problems(f"keys: [{{name: k, key: {DEMO_KEY}, url_delivery: maybe}}]")[0].startswith("keys[0].url_delivery:")


async def test_the_readme_plugin_runs_as_it_is(
    start_gateway,
    http,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(from datetime .*?)```", readme, re.S)
    config = re.search(r"```yaml\n(routes:\n  # a configured list.*?)```", readme, re.S)
    assert code is not None and config is not None
    (tmp_path / "mycompany").mkdir()
    (tmp_path / "mycompany" / "__init__.py").write_text("")
    (tmp_path / "mycompany" / "gateway.py").write_text(code[1])
    monkeypatch.syspath_prepend(str(tmp_path))
    tree = yaml.safe_load(config[1])
    settings = tree["plugins"]["mycompany.gateway:BlockWeekends"]
    message = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    try:
        gw = await start_gateway(
            yaml.safe_dump(
                {**tree, "plugins": {"mycompany.gateway:BlockWeekends": {**settings, "days": list(range(7))}}}
            )
        )
        async with http.post(gw.url + "/v1/messages", json=message, headers=MESSAGE_HEADERS) as answer:
            assert answer.status == 403
            assert (await answer.json())["error"]["message"] == "see you on Monday, demo"
        gw = await start_gateway(
            yaml.safe_dump({**tree, "plugins": {"mycompany.gateway:BlockWeekends": {**settings, "days": []}}})
        )
        async with http.post(gw.url + "/v1/messages", json=message, headers=MESSAGE_HEADERS) as answer:
            assert answer.status == 200
        wrong = problems("routes: {messages: {plugins: ['mycompany.gateway:BlockWeekends', auth]}}")
        assert wrong[0].startswith("routes.messages.plugins[0]: mycompany.gateway:BlockWeekends requires the caller's")
    finally:
        for name in ("mycompany.gateway", "mycompany"):
            sys.modules.pop(name, None)


class Registered:
    """What is registered, for one test: `install(name, target, cls)` adds a plugin, `(name, None)` takes it away."""

    def __init__(self, names: dict[str, str], classes: dict[str, type[Plugin]]) -> None:
        self.names, self.classes = names, classes

    def install(self, name: str, target: str | None, cls: type[Plugin] | None = None) -> None:
        self.names.pop(name, None) if target is None else self.names.__setitem__(name, target)
        self.classes.pop(name, None) if cls is None else self.classes.__setitem__(name, cls)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Registered:
    from proxy import registry as found

    registered = Registered(dict(found.registered()), dict(found.registered_classes()))
    monkeypatch.setattr(found, "registered", lambda: registered.names)
    monkeypatch.setattr(found, "registered_classes", lambda: registered.classes)
    return registered


def test_a_copy_without_registered_plugins_refuses_to_load_rather_than_serve_without_auth(registry) -> None:
    for name in list(registry.names):
        registry.install(name, None)
    assert problems("")[0].startswith("<plugins>: no plugin is registered (modelgate.plugins entry points)")


def test_a_registered_plugin_that_cannot_be_imported_is_a_problem_not_a_gap(registry) -> None:
    registry.install("billing", "nowhere.at_all:Billing")
    assert problems("")[0].startswith("<plugins>.billing: registered but plugin 'billing': cannot import nowhere")


def test_a_keyed_route_whose_default_pipeline_lost_its_caller_refuses_to_load(registry) -> None:
    registry.install("auth", None)
    found = problems("")
    assert (
        "<default pipeline of messages>: no registered plugin provides the caller's identity: the route "
        "would serve anyone" in found
    )
    assert not [p for p in found if p.startswith("<default pipeline of login_2fa>")]  # the account routes take no key


class TakesLabels(Plugin):
    class KeySettings(BaseModel):
        labels: dict[str, str] = {}
        url_delivery: int = 0


def test_a_plugin_cannot_take_a_key_field_the_gateway_or_another_plugin_has(registry) -> None:
    registry.install("takes_labels", "tests.test_plugin_contract:TakesLabels", TakesLabels)
    found = problems("")
    assert "<plugins>.takes_labels: its key field 'labels' is the gateway's own" in found
    assert "<plugins>.takes_labels: its key field 'url_delivery' is url_delivery's already" in found


def test_a_plugin_command_never_takes_a_built_in_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from proxy.process import cli

    ran = []
    commands = [
        PluginCommand("serve", "a clash", lambda parser: None, lambda config, args: 9),
        PluginCommand("hello", "greets", lambda parser: None, lambda config, args: ran.append(config) or 0),
    ]
    monkeypatch.setattr(cli, "plugin_commands", lambda: commands)
    assert cli.main(["hello"]) == 0 and len(ran) == 1  # no --config of its own: the embedded defaults
    assert "a plugin's command 'serve' is taken; it is left out" in capsys.readouterr().err


async def test_a_plugin_the_config_gives_nothing_to_do_is_never_called(start_gateway) -> None:
    """The ledger without a database or prices, and budgets that name none, declare their hooks
    idle: a default gateway calls neither, per request nor per stream event."""
    from proxy.core.pipeline import plugin_name

    def hooks(gateway: object, route: str) -> set[str]:
        pipeline = gateway.owner.runtime.routes[route].pipeline  # type: ignore[attr-defined]
        every = [*pipeline.request_hooks, *pipeline.response_hooks, *pipeline.event_hooks, *pipeline.complete_hooks]
        return {plugin_name(hook.plugin) for hook in every}

    idle = await start_gateway()
    assert not {"ledger", "budget"} & hooks(idle, "messages")
    busy = await start_gateway(
        f"keys: [{{name: k, key: {DEMO_KEY}, budget: {{tokens_per_day: 100}}}}]\n"
        'prices: [{model: "*", input_per_mtok: 1}]\n'
    )
    assert {"ledger", "budget"} <= hooks(busy, "messages")


async def test_a_plugin_keeps_its_request_state_in_a_room_no_other_plugin_reaches(start_gateway, http) -> None:
    """A plugin writing every name the built-in plugins keep request state under spoils nothing:
    a key allowed one request at a time makes three in a row (a lease the limiter lost track of
    would never be released), and the plugin finds its own room as it left it."""
    from tests.recording_plugin import Squatter

    gw = await start_gateway(
        f"keys: [{{name: k, key: {DEMO_KEY}, limits: {{concurrent: 1, tpm: 100000}}}}]\n"
        "routes: {messages: {plugins: [auth, tests.recording_plugin:Squatter, validation, ratelimit, usage]}}\n"
    )
    Squatter.seen.clear()
    body = {"model": "msgmodel-haiku-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(3):
        async with http.post(f"{gw.url}/v1/messages", json=body, headers=MESSAGE_HEADERS) as answer:
            assert answer.status == 200, await answer.text()
    assert len(Squatter.seen) == 3 and all(room == dict.fromkeys(Squatter.NAMES) for room in Squatter.seen)
