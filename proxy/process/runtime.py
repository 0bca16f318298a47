"""Building a `Runtime` (proxy/core/runtime.py) from a loaded config: the registry checks the
config's plugins and makes them, each route's settings are resolved once, the channels open."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from proxy.config import GatewayConfig, LoadedConfig
from proxy.core.pipeline import Pipeline
from proxy.core.plugin import STORED_KEYS, Plugin
from proxy.core.runtime import RouteSettings, Runtime
from proxy.observability.observer import Observer
from proxy.policy.channels import Channel, ChannelSet
from proxy.policy.health_checks import HealthChecks
from proxy.policy.keys import KeyRing
from proxy.policy.resilience import ChannelHealth
from proxy.registry import build_plugin, config_warnings, plugin_names
from proxy.request.body import body_limits
from proxy.wire.routes import ROUTES, Route

if TYPE_CHECKING:
    from proxy.config.model import ChannelConfig

log = logging.getLogger("modelgate.runtime")


async def build_runtime(
    loaded: LoadedConfig,
    simulator_url: Callable[[ChannelConfig], Awaitable[str]],
    resources: dict[str, Any] | None = None,
) -> Runtime:
    """The live form of `loaded`, opened: its channels (a simulated one started through
    `simulator_url`), each route's plugins, made by the registry, and settings."""
    config = loaded.config
    for warning in config_warnings(config):  # at every start and reload: a public keyed route, say
        log.warning(warning)
    resilience = config.resilience
    channels = []
    for channel_config in config.channels:
        base_url = channel_config.base_url
        if channel_config.is_simulator:
            base_url = await simulator_url(channel_config)
        channels.append(
            Channel(channel_config, base_url, ChannelHealth(resilience.breaker_failures, resilience.breaker_open_s))
        )
    instances: dict[str, Plugin] = {}
    routes: dict[str, RouteSettings] = {}
    for route in ROUTES:
        names = plugin_names(config, route)
        for name in names:
            if name not in instances:
                instances[name] = build_plugin(config, name, resources)
        routes[route.name] = route_settings(config, route, Pipeline([instances[n] for n in names]))
    channel_set = ChannelSet(channels, config.models)
    runtime = Runtime(
        loaded,
        channel_set,
        routes,
        list(instances.values()),
        Observer(config),
        HealthChecks(channel_set.channels),
        KeyRing.from_config(config, (resources or {}).get(STORED_KEYS)),
    )
    await runtime.open()
    return runtime


def route_settings(config: GatewayConfig, route: Route, pipeline: Pipeline) -> RouteSettings:
    """`routes.<route>` over the server's defaults, for `route`."""
    configured = config.routes.get(route.name)  # type: ignore[call-overload]
    body_limit, upload_limit = body_limits(config, route)
    timeout = configured.body_timeout_s if configured is not None else None
    return RouteSettings(
        pipeline=pipeline,
        body_limit=body_limit,
        upload_limit=upload_limit,
        body_timeout_s=timeout if timeout is not None else config.server.body_timeout_s,
        failover_unanswered=configured is not None and configured.failover_unanswered,
    )
