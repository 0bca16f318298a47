"""Finding plugins and putting pipelines together, knowing none of them by name.

A name in config is a `modelgate.plugins` entry point (the built-in plugins are registered that
way, in pyproject.toml) or a dotted path (`package.module:Class`). A route's default pipeline
is every registered plugin that says it joins that route, in their declared `order`. Any
pipeline, default or configured, is checked against what its plugins require and provide; each
problem names its key path.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from proxy.config import GatewayConfig, LoadedConfig
from proxy.config import config_from_text as _config_from_text
from proxy.config import load_config as _load_config
from proxy.config import parse_config as _parse_config
from proxy.config.model import worker_count
from proxy.core.plugin import CAPABILITIES, Plugin, PluginCommand, PluginRoute
from proxy.wire.routes import ROUTES, Route

ENTRY_POINT_GROUP = "modelgate.plugins"


@functools.cache
def registered() -> dict[str, str]:
    """Registered plugin names and the `module:Class` each stands for."""
    return {point.name: point.value for point in entry_points(group=ENTRY_POINT_GROUP)}


@functools.cache
def registered_classes() -> dict[str, type[Plugin]]:
    """Every registered plugin class by its name (one that cannot be imported is left out here;
    `registration_problems` says so, and no config loads while it does)."""
    found = {}
    for name in registered():
        try:
            found[name] = resolve_plugin(name)
        except LookupError:
            continue
    return found


def registration_problems() -> list[str]:
    """What is wrong with the plugins installed, whatever the config: none registered at all (a
    copy of the code without its package metadata would run every route with no auth), one that
    cannot be imported (it would silently leave the default pipelines it joins), key fields a
    plugin cannot have."""
    if not registered():
        return [
            f"<plugins>: no plugin is registered ({ENTRY_POINT_GROUP} entry points): the default pipelines "
            "would be empty, every route open; install the package (pip install -e .) to register them"
        ]
    problems = []
    for name in registered():
        try:
            resolve_plugin(name)
        except LookupError as exc:
            problems.append(f"<plugins>.{name}: registered but {exc}")
    from proxy.config.model import KeyConfig

    owners: dict[str, str] = {}
    for name, cls in registered_classes().items():
        for field in cls.KeySettings.model_fields if cls.KeySettings is not None else ():
            if field in KeyConfig.model_fields:
                problems.append(f"<plugins>.{name}: its key field '{field}' is the gateway's own")
            elif field in owners:
                problems.append(f"<plugins>.{name}: its key field '{field}' is {owners[field]}'s already")
            else:
                owners[field] = name
    return problems


def resolve_plugin(name: str) -> type[Plugin]:
    """A plugin class from a registered name or a dotted path (`package.module:Class` or `package.module.Class`)."""
    target = registered().get(name, name)
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise LookupError(
            f"unknown plugin {name!r} (registered: {', '.join(registered()) or 'none'}; "
            "or a dotted path package.module:Class)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise LookupError(f"plugin {name!r}: cannot import {module_name}: {exc}") from None
    cls = getattr(module, attr, None)
    if not isinstance(cls, type) or not issubclass(cls, Plugin):
        raise LookupError(f"plugin {name!r}: {module_name} has no Plugin class {attr}")
    return cls


def default_plugins(route: Route) -> list[str]:
    """The pipeline a route gets when config names none."""
    chosen = [(cls.order, name) for name, cls in registered_classes().items() if cls.joins and cls.joins(route)]
    return [name for _, name in sorted(chosen)]


def plugin_names(config: GatewayConfig, route: Route) -> list[str]:
    override = config.routes.get(route.name)  # type: ignore[call-overload]
    if override is not None and override.plugins is not None:
        return list(override.plugins)
    return default_plugins(route)


def configured_without(config: GatewayConfig, cls: type[Plugin], routes: Iterable[Route]) -> list[str]:
    """Of `routes`, the names of those whose pipeline the config names and leaves `cls` out of
    (a plugin a route needs to be charged, say: the route escapes what it enforces)."""
    found = []
    for route in routes:
        override = config.routes.get(route.name)  # type: ignore[call-overload]
        if override is None or override.plugins is None:
            continue
        classes = []
        for name in override.plugins:
            try:
                classes.append(resolve_plugin(name))
            except LookupError:
                continue  # reported as unknown elsewhere
        if cls not in classes:
            found.append(route.name)
    return found


def order_problems(route: Route, names: list[str], where: str) -> list[str]:
    """What a pipeline's plugins require of the ones before them and do not get (`where`: the
    key path of its list); a plugin named twice."""
    classes: list[type[Plugin] | None] = []
    for name in names:
        try:
            classes.append(resolve_plugin(name))
        except LookupError:
            classes.append(None)  # reported as unknown elsewhere
    problems = []
    for index, (name, cls) in enumerate(zip(names, classes, strict=True)):
        if names.index(name) != index:
            problems.append(f"{where}[{index}]: {name} is already at [{names.index(name)}]: each plugin runs once")
            continue
        if cls is None:
            continue
        for need in sorted(cls.requires):
            capability = CAPABILITIES.get(need)
            if capability is not None and not capability.exists_on(route):
                continue  # nobody could provide it here (no caller on the account routes): void
            if any(c is not None and need in c.provides for c in classes[:index]):
                continue
            later = next((i for i, c in enumerate(classes) if c is not None and need in c.provides), None)
            described = capability.described if capability is not None else need
            if later is not None:
                problems.append(
                    f"{where}[{index}]: {name} requires {described}, which {names[later]} at "
                    f"[{later}] provides only after it: put {names[later]} first"
                )
            else:
                providers = [n for n, c in registered_classes().items() if need in c.provides]
                hint = f" (add {' or '.join(providers)} before it)" if providers else ""
                problems.append(
                    f"{where}[{index}]: {name} requires {described}, which no plugin before it "
                    f"on route {route.name} provides{hint}"
                )
    problems += _uses_problems(route, names, classes, where)
    problems += _owner_check_problems(route, names, classes, where)
    return problems


def _uses_problems(route: Route, names: list[str], classes: list[type[Plugin] | None], where: str) -> list[str]:
    """What a plugin reads once the answer is in (the usage it reported), which some plugin of the
    pipeline, in any place, must provide."""
    problems = []
    for index, (name, cls) in enumerate(zip(names, classes, strict=True)):
        for need in sorted(cls.uses if cls is not None else ()):
            capability = CAPABILITIES.get(need)
            if capability is not None and not capability.exists_on(route):
                continue
            if any(c is not None and need in c.provides for c in classes):
                continue
            providers = [n for n, c in registered_classes().items() if need in c.provides]
            hint = f" (add {' or '.join(providers)})" if providers else ""
            described = capability.described if capability is not None else need
            problems.append(
                f"{where}[{index}]: {name} uses {described}, which no plugin of route {route.name}'s "
                f"pipeline provides{hint}: every answer would be charged its most"
            )
    return problems


def _owner_check_problems(route: Route, names: list[str], classes: list[type[Plugin] | None], where: str) -> list[str]:
    """On a route that follows ids, the core checks the owner before the first plugin that may
    read what belongs to the id, and it needs the caller for that: such a plugin before the one
    that names the caller would make every id look like another tenant's."""
    if route.follows is None:
        return []
    caller = next((i for i, c in enumerate(classes) if c is not None and "caller" in c.provides), None)
    if caller is None:
        return []
    return [
        f"{where}[{i}]: {names[i]} must come after {names[caller]}: on route {route.name} it sees the id a "
        f"request follows only once the core has checked it is the caller's, which needs the caller"
        for i, c in enumerate(classes[:caller])
        if c is not None and not c.before_owner_check and c.on_request is not Plugin.on_request
    ]


def check_plugins(tree: dict[str, Any]) -> list[str]:
    """Problems with the plugins a config names, read from the raw tree so they are reported
    alongside every other problem: unknown names, bad settings (of the plugin and on each key),
    and pipelines whose plugins do not get what they require."""
    problems = registration_problems()
    routes, plugins = tree.get("routes"), tree.get("plugins")
    configured = routes if isinstance(routes, dict) else {}
    for route_name, route in configured.items():
        names = route.get("plugins") if isinstance(route, dict) else None
        for index, name in enumerate(names if isinstance(names, list) else ()):
            try:
                resolve_plugin(str(name))
            except LookupError as exc:
                problems.append(f"routes.{route_name}.plugins[{index}]: {exc}")
    for route in ROUTES:
        entry = configured.get(route.name)
        names = entry.get("plugins") if isinstance(entry, dict) else None
        if isinstance(names, list):
            names = [str(n) for n in names]
            problems.extend(order_problems(route, names, f"routes.{route.name}.plugins"))
            if route.takes_key and not provides_caller(names) and entry.get("public") is not True:
                problems.append(_callerless(route))
        else:  # a default pipeline is held to the same contract, so a registered plugin cannot break it unseen
            defaults = default_plugins(route)
            problems.extend(order_problems(route, defaults, f"<default pipeline of {route.name}>"))
            if route.takes_key and not any("caller" in registered_classes()[n].provides for n in defaults):
                problems.append(
                    f"<default pipeline of {route.name}>: no registered plugin provides the caller's "
                    "identity: the route would serve anyone"
                )
    for name, settings in (plugins or {}).items() if isinstance(plugins, dict) else ():
        try:
            cls = resolve_plugin(str(name))
        except LookupError as exc:
            problems.append(f"plugins.{name}: {exc}")
            continue
        if isinstance(settings, dict):
            problems.extend(_model_problems(cls.Settings, f"plugins.{name}", settings, f"{name} takes no settings"))
    keys = tree.get("keys")
    for index, key in enumerate(keys if isinstance(keys, list) else ()):
        if isinstance(key, dict):
            problems.extend(_key_settings_problems(key, f"keys[{index}]"))
    return problems


def provides_caller(names: Iterable[str]) -> bool:
    """Whether a pipeline has a plugin that provides the caller (an unknown name provides nothing)."""
    for name in names:
        try:
            if "caller" in resolve_plugin(name).provides:
                return True
        except LookupError:
            continue
    return False


def _callerless(route: Route) -> str:
    """A keyed route whose configured pipeline names no caller: every request would go upstream
    with the channel's credential, whoever sent it. Said unless the route is declared public."""
    providers = [n for n, c in registered_classes().items() if "caller" in c.provides]
    hint = f" (add {' or '.join(providers)} first)" if providers else ""
    return (
        f"routes.{route.name}.plugins: no plugin provides {CAPABILITIES['caller'].described}{hint}: anyone "
        f"who reaches the gateway would be served with the channel's credential; if that is meant, say so "
        f"with routes.{route.name}.public: true"
    )


def config_warnings(config: GatewayConfig) -> list[str]:
    """What a valid config does that its operator must hear of, from check-config and at every
    start and reload: a keyed route served to anyone (`public: true`), or a `public` that changes
    nothing (the route takes no key, or its pipeline names the caller after all)."""
    warnings = []
    for route in ROUTES:
        override = config.routes.get(route.name)  # type: ignore[call-overload]
        if override is None or not override.public:
            continue
        where = f"routes.{route.name}.public"
        if not route.takes_key:
            warnings.append(f"{where}: route {route.name} takes no gateway key: public changes nothing")
        elif override.plugins is None or provides_caller(override.plugins):
            warnings.append(
                f"{where}: a plugin of its pipeline provides the caller, so keys are still "
                "required: public changes nothing"
            )
        else:
            warnings.append(
                f"{where}: no plugin of its pipeline provides the caller: anyone who reaches the "
                "gateway is served on this route with the channel's credential"
            )
    demo = next((key for key in config.keys if key.digest_hex() == _DEMO_KEY), None)
    if demo is not None and config.key_store.database_url:
        warnings.append(
            f"keys: the embedded demo key ({demo.name}, sk-demo-key, every model) is served beside the "
            "key store's: this config has no keys: section of its own; give it one (keys: [] for none)"
        )
    return warnings


_DEMO_KEY = hashlib.sha256(b"sk-demo-key").hexdigest()  # the embedded defaults' key, for trying the gateway


def _model_problems(model: type[BaseModel] | None, where: str, values: dict[str, Any], why_none: str) -> list[str]:
    if model is None:
        return [f"{where}.{key}: unknown key ({why_none})" for key in values]
    try:
        model.model_validate(values)
    except ValidationError as exc:
        return [
            f"{where}." + ".".join(str(p) for p in err["loc"]) + f": {err['msg'][:1].lower()}{err['msg'][1:]}"
            for err in exc.errors()
        ]
    return []


def key_fields() -> dict[str, type[BaseModel]]:
    """The fields registered plugins add to each key entry, and the settings model of each."""
    return _declared("KeySettings")


def tenant_fields() -> dict[str, type[BaseModel]]:
    """The fields registered plugins read on a stored tenant (`TenantSettings`), and the model of each."""
    return _declared("TenantSettings")


def _declared(settings: str) -> dict[str, type[BaseModel]]:
    fields: dict[str, type[BaseModel]] = {}
    for cls in registered_classes().values():
        if (model := getattr(cls, settings)) is not None:
            fields.update(dict.fromkeys(model.model_fields, model))
    return fields


def tenant_settings(entry: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A stored tenant's plugin fields as their plugins' models read them, and what is wrong with
    them (each problem `FIELD: message`): unknown fields, or values their plugin refuses."""
    known = tenant_fields()
    problems = [
        f"{field}: unknown field (a tenant takes {', '.join(sorted(known)) or 'no plugin field'})"
        for field in sorted(set(entry) - set(known))
    ]
    out: dict[str, Any] = {}
    for model, values in _per_plugin(entry, known):
        found = _model_problems(model, "", values, "")
        if found:
            problems += [problem.lstrip(".") for problem in found]
            continue
        read = model.model_validate(values)
        out.update({f: getattr(read, f) for f in values})
    return out, problems


def _key_settings_problems(key: dict[str, Any], where: str) -> list[str]:
    from proxy.config.model import KeyConfig

    known = key_fields()
    problems = []
    for field in sorted(set(key) - set(KeyConfig.model_fields)):
        if field not in known:
            hint = difflib.get_close_matches(field, [*KeyConfig.model_fields, *known], n=1)
            problems.append(f"{where}.{field}: unknown key" + (f" (did you mean '{hint[0]}'?)" if hint else ""))
    for model, values in _per_plugin(key, known):
        problems.extend(_model_problems(model, where, values, ""))
    return problems


def key_settings_problems(key: dict[str, Any], where: str) -> list[str]:
    """What is wrong with a key entry's fields beyond the core's: unknown, or not as its plugin reads them."""
    return _key_settings_problems(key, where)


def key_settings(extra: dict[str, Any]) -> dict[str, Any]:
    """A key entry's plugin fields, as their plugins' models read them (`"false"` is False)."""
    out: dict[str, Any] = {}
    for model, values in _per_plugin(extra, key_fields()):
        read = model.model_validate(values)
        out.update({f: getattr(read, f) for f in values})
    return out


def _per_plugin(
    entry: dict[str, Any], known: dict[str, type[BaseModel]]
) -> list[tuple[type[BaseModel], dict[str, Any]]]:
    """A key entry's plugin fields, grouped by the settings model that declares them."""
    groups: dict[type[BaseModel], dict[str, Any]] = {}
    for field, value in entry.items():
        if field in known:
            groups.setdefault(known[field], {})[field] = value
    return list(groups.items())


def plugin_config_problems(config: GatewayConfig, workers: int) -> list[str]:
    """What each plugin configured, or registered, finds wrong with the whole config."""
    problems: list[str] = []
    seen: set[type[Plugin]] = set()
    for name in [*registered(), *config.plugins]:
        try:
            cls = resolve_plugin(name)
        except LookupError:
            continue
        if cls not in seen:
            seen.add(cls)
            problems.extend(cls.config_problems(config, workers))
    return problems


def plugin_routes(config: GatewayConfig, *, admin: bool = False) -> list[PluginRoute]:
    """The paths the registered plugins, and any other the config names, ask the app to serve
    (all of them from the start: a reload cannot add a path, and the handler of a plugin not
    configured says so); `admin`: their paths for operators only."""
    classes = dict.fromkeys(registered_classes().values())
    for route in config.routes.values():
        for name in route.plugins or ():
            classes.setdefault(resolve_plugin(name))
    return [extra for cls in classes for extra in (cls.admin_routes() if admin else cls.routes())]


def plugin_commands() -> list[PluginCommand]:
    """The `modelgate` subcommands the registered plugins add."""
    return [command for cls in registered_classes().values() for command in cls.commands()]


def build_plugin(config: GatewayConfig, name: str, resources: dict[str, Any] | None = None) -> Plugin:
    cls = resolve_plugin(name)
    raw = config.plugins.get(name, {})
    settings = cls.Settings.model_validate(raw) if cls.Settings is not None else None
    plugin = cls(settings)
    plugin.resources = resources if resources is not None else {}
    plugin.configure(config)
    return plugin


class RegisteredRules:
    """The registered plugins' rules for a config (proxy/config's PluginRules)."""

    def problems(self, tree: dict[str, Any], config: GatewayConfig | None) -> list[str]:
        problems = check_plugins(tree)
        if config is not None:
            problems.extend(plugin_config_problems(config, worker_count(config)))
        return problems

    def settle(self, config: GatewayConfig) -> None:
        for key in config.keys:  # the plugins' own fields on each key, as their models read them
            if key.model_extra:
                key.model_extra.update(key_settings(key.model_extra))


RULES = RegisteredRules()


def load_config(
    path: str | Path | None, environ: Mapping[str, str] | None = None, *, reloading: bool = False
) -> LoadedConfig:
    """A config file (None: the embedded defaults) read for use: its sections and its plugins checked."""
    return _load_config(path, environ, reloading=reloading, rules=RULES)


def config_from_text(
    text: str, source: str, environ: Mapping[str, str], files: Mapping[str, str | None] | None = None
) -> LoadedConfig:
    """A config's text read for use: its sections and its plugins checked."""
    return _config_from_text(text, source, environ, files, RULES)


def parse_config(text: str, environ: Mapping[str, str]) -> GatewayConfig:
    """A config's text, its sections and its plugins checked."""
    return _parse_config(text, environ, RULES)
