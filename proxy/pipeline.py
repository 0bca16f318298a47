"""Plugins and the pipeline that runs them, in the order config names them.

A plugin implements any of five hooks. `on_request` may answer the request itself
(an error in the endpoint's shape, say) and so end the pipeline; `on_upstream` runs once the
channel is chosen, the last chance to shape what that channel is sent; `on_response` sees a
buffered upstream answer; `on_event` sees each SSE event and returns the event to send
(the same one, a new one, or None to drop it); `on_complete` runs once at the end,
whatever happened. Only hooks a plugin really implements are called.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from proxy.exchange import Exchange, UpstreamResponse
from proxy.observability.tracing import child_span
from proxy.routes import Route
from proxy.sse import SSEEvent

if TYPE_CHECKING:
    from proxy.channels import ChannelSet
    from proxy.config import GatewayConfig

log = logging.getLogger("modelgate.pipeline")

BUILTIN_PLUGINS: dict[str, str] = {
    "auth": "plugins.auth:Auth",
    "validation": "plugins.validation:Validation",
    "ratelimit": "plugins.ratelimit:RateLimit",
    "url_delivery": "plugins.url_delivery:UrlDelivery",
    "video": "plugins.video:VideoTasks",
    "usage": "plugins.usage:UsageCapture",
    "sse": "plugins.sse:SSEPassthrough",
    "webhook_queue": "plugins.webhook_queue:WebhookQueuePlugin",
}


def default_plugins(route: Route) -> list[str]:
    """The pipeline a route gets when config names none."""
    if not route.number:  # the calls around the endpoints: no usage to count, no stream to frame
        chain = ["auth", "ratelimit"] if route.local else ["auth", "validation", "ratelimit"]
        return chain + ["video"] if route.format.name == "video" else chain
    if route.name in ("image_generations", "image_edits", "generate_content"):
        return ["auth", "validation", "ratelimit", "url_delivery", "usage", "sse"]
    if route.format.name in ("messages", "content", "responses", "images"):
        return ["auth", "validation", "ratelimit", "usage", "sse"]
    if route.format.name == "video":
        return ["auth", "validation", "ratelimit", "video"]
    if route.name == "payment_webhook":
        return ["ratelimit", "webhook_queue"]  # the queue does nothing until enabled
    return ["ratelimit"]  # the login takes no gateway key; limits go by client IP


class Plugin:
    """Base class for plugins; every hook is optional. `Settings` validates the plugin's config."""

    name: ClassVar[str] = "plugin"
    Settings: ClassVar[type[BaseModel] | None] = None

    def __init__(self, settings: Any = None) -> None:
        self.settings = settings
        # Objects that outlive a config reload, owned by the running gateway (set before configure).
        self.resources: dict[str, Any] = {}
        # The running config's channels, for a plugin that talks to upstreams itself (set before start).
        self.channels: ChannelSet | None = None

    def configure(self, config: GatewayConfig) -> None:
        """Called once with the whole config this instance serves (keys, channels ...)."""

    async def start(self) -> None:
        """Called once before the first request (open connections, load state)."""

    async def stop(self) -> None:
        """Called once after the last request of the config this instance belongs to."""

    def unready(self, state_ok: bool) -> str | None:
        """Why this instance cannot serve right now, as far as this plugin knows (`/readyz` says
        so and answers 503), or None; `state_ok`: the state store answers its probe. A plugin
        whose configured fail mode serves on says None."""
        return None

    async def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        return None

    async def on_upstream(self, ex: Exchange) -> None:
        return None

    async def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        return None

    def on_event(self, ex: Exchange, event: SSEEvent) -> SSEEvent | None:
        return event

    async def on_complete(self, ex: Exchange) -> None:
        return None


class Pipeline:
    """The plugins of one route, with each hook list holding only real implementations."""

    __slots__ = ("plugins", "request_hooks", "upstream_hooks", "response_hooks", "event_hooks", "complete_hooks")

    def __init__(self, plugins: list[Plugin]) -> None:
        self.plugins = plugins
        self.request_hooks = _implemented(plugins, "on_request")
        self.upstream_hooks = _implemented(plugins, "on_upstream")
        self.response_hooks = _implemented(plugins, "on_response")
        self.event_hooks = _implemented(plugins, "on_event")
        self.complete_hooks = _implemented(plugins, "on_complete")

    async def run_request(self, ex: Exchange) -> web.StreamResponse | None:
        for hook in self.request_hooks:
            if ex.span is None:
                answer = await hook(ex)
            else:
                with child_span(ex, f"{plugin_name(hook)} on_request") as span:
                    answer = await hook(ex)
                    if answer is not None:
                        span.set_attribute("modelgate.short_circuit_status", answer.status)
            if answer is not None:
                return answer
        return None

    async def run_upstream(self, ex: Exchange) -> None:
        for hook in self.upstream_hooks:
            if ex.span is None:
                await hook(ex)
            else:
                with child_span(ex, f"{plugin_name(hook)} on_upstream"):
                    await hook(ex)

    async def run_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        for hook in self.response_hooks:
            if ex.span is None:
                await hook(ex, upstream)
            else:
                with child_span(ex, f"{plugin_name(hook)} on_response"):
                    await hook(ex, upstream)

    def run_event(self, ex: Exchange, event: SSEEvent) -> SSEEvent | None:
        for hook in self.event_hooks:
            event = hook(ex, event)
            if event is None:
                return None
        return event

    async def run_complete(self, ex: Exchange) -> None:
        for hook in self.complete_hooks:
            try:
                if ex.span is None:
                    await hook(ex)
                else:
                    with child_span(ex, f"{plugin_name(hook)} on_complete"):
                        await hook(ex)
            except Exception:  # one plugin's bookkeeping must not hide the others'
                log.exception("on_complete hook failed", extra={"request_id": ex.request_id})


def plugin_name(hook: Callable[..., Any]) -> str:
    plugin = getattr(hook, "__self__", None)
    name = getattr(plugin, "name", None)
    return name if isinstance(name, str) and name != "plugin" else type(plugin).__name__


def _implemented(plugins: list[Plugin], hook: str) -> list[Callable[..., Any]]:
    found = []
    for plugin in plugins:
        method = getattr(plugin, hook, None)
        if method is None:
            continue
        if getattr(type(plugin), hook, None) is getattr(Plugin, hook):
            continue  # the base class's no-op
        found.append(method)
    return found


def resolve_plugin(name: str) -> type[Plugin]:
    """A plugin class from a built-in name or a dotted path (`package.module:Class` or `package.module.Class`)."""
    target = BUILTIN_PLUGINS.get(name, name)
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise LookupError(f"unknown plugin {name!r} (built-in: {', '.join(BUILTIN_PLUGINS)}; "
                          "or a dotted path package.module:Class)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise LookupError(f"plugin {name!r}: cannot import {module_name}: {exc}") from None
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise LookupError(f"plugin {name!r}: {module_name} has no class {attr}")
    return cls


def plugin_names(config: GatewayConfig, route: Route) -> list[str]:
    override = config.routes.get(route.name)  # type: ignore[call-overload]
    if override is not None and override.plugins is not None:
        return list(override.plugins)
    return default_plugins(route)


def check_plugins(routes: Any, plugins: Any) -> list[str]:
    """Problems with the plugins a config names (read from the raw tree, so they are reported
    alongside every other problem): unknown names, bad settings."""
    problems: list[str] = []
    for route_name, route in (routes or {}).items() if isinstance(routes, dict) else ():
        names = route.get("plugins") if isinstance(route, dict) else None
        for index, name in enumerate(names if isinstance(names, list) else ()):
            try:
                resolve_plugin(str(name))
            except LookupError as exc:
                problems.append(f"routes.{route_name}.plugins[{index}]: {exc}")
    for name, settings in (plugins or {}).items() if isinstance(plugins, dict) else ():
        try:
            cls = resolve_plugin(str(name))
        except LookupError as exc:
            problems.append(f"plugins.{name}: {exc}")
            continue
        if isinstance(settings, dict):
            problems.extend(_settings_problems(cls, str(name), settings))
    return problems


def _settings_problems(cls: type[Plugin], name: str, settings: dict[str, Any]) -> list[str]:
    if cls.Settings is None:
        return [f"plugins.{name}.{key}: unknown key ({name} takes no settings)" for key in settings]
    try:
        cls.Settings.model_validate(settings)
    except ValidationError as exc:
        return [f"plugins.{name}." + ".".join(str(p) for p in err["loc"]) + f": {err['msg']}"
                for err in exc.errors()]
    return []


def build_plugin(config: GatewayConfig, name: str, resources: dict[str, Any] | None = None) -> Plugin:
    cls = resolve_plugin(name)
    raw = config.plugins.get(name, {})
    settings = cls.Settings.model_validate(raw) if cls.Settings is not None else None
    plugin = cls(settings)
    plugin.resources = resources if resources is not None else {}
    configure = getattr(plugin, "configure", None)
    if configure is not None:
        configure(config)
    return plugin
