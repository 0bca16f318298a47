"""`Runtime`: one loaded config made live — its channels, their sessions, and each route's pipeline.

A reload builds a new Runtime and swaps it in; requests already running keep the one
they started with, and a retired Runtime closes its sessions and plugins only once its
last request has finished, so a reload never cuts a stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from proxy.config import LoadedConfig
from proxy.observability.observer import Observer
from proxy.pipeline import Pipeline
from proxy.plugin import STORED_KEYS, Plugin
from proxy.policy.channels import Channel, ChannelSet
from proxy.policy.health_checks import HealthChecks
from proxy.policy.keys import KeyRing, StoredKeyLookup
from proxy.policy.resilience import ChannelHealth
from proxy.registry import build_plugin, config_warnings, plugin_names
from proxy.wire.routes import ROUTES

if TYPE_CHECKING:
    from proxy.config.model import ChannelConfig

log = logging.getLogger("modelgate.runtime")


class Runtime:
    __slots__ = (
        "loaded",
        "config",
        "channels",
        "pipelines",
        "plugins",
        "observer",
        "health",
        "keys",
        "in_flight",
        "_retired",
        "_closed",
    )

    def __init__(
        self,
        loaded: LoadedConfig,
        channels: ChannelSet,
        pipelines: dict[str, Pipeline],
        plugins: list[Plugin],
        stored_keys: StoredKeyLookup | None = None,
    ) -> None:
        self.loaded = loaded
        self.config = loaded.config
        self.channels = channels
        self.pipelines = pipelines
        self.plugins = plugins
        self.observer = Observer(loaded.config)
        self.health = HealthChecks(channels.channels)
        # To know a gateway key wherever it travels, the key store's too.
        self.keys = KeyRing.from_config(loaded.config, stored_keys)
        self.in_flight = 0
        self._retired = False
        self._closed = asyncio.Event()

    @classmethod
    async def build(
        cls,
        loaded: LoadedConfig,
        simulator_url: Callable[[ChannelConfig], Awaitable[str]],
        resources: dict[str, Any] | None = None,
    ) -> Runtime:
        config = loaded.config
        for warning in config_warnings(config):  # at every start and reload: a public keyed route, say
            log.warning(warning)
        channels = []
        resilience = config.resilience
        for channel_config in config.channels:
            base_url = channel_config.base_url
            if channel_config.is_simulator:
                base_url = await simulator_url(channel_config)
            channels.append(
                Channel(channel_config, base_url, ChannelHealth(resilience.breaker_failures, resilience.breaker_open_s))
            )
        instances: dict[str, Plugin] = {}
        pipelines: dict[str, Pipeline] = {}
        for route in ROUTES:
            names = plugin_names(config, route)
            for name in names:
                if name not in instances:
                    instances[name] = build_plugin(config, name, resources)
            pipelines[route.name] = Pipeline([instances[n] for n in names])
        runtime = cls(
            loaded, ChannelSet(channels), pipelines, list(instances.values()), (resources or {}).get(STORED_KEYS)
        )
        try:
            await runtime.channels.open()
            runtime.health.start()
            for plugin in runtime.plugins:
                plugin.channels = runtime.channels
                await plugin.start()
        except BaseException:
            await runtime._close()  # a half-built runtime must not leak sessions
            raise
        return runtime

    def enter(self) -> None:
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1
        if self._retired and self.in_flight == 0:
            asyncio.get_running_loop().create_task(self._close())

    def retire(self) -> None:
        """No new requests will come; close once the running ones are done."""
        self._retired = True
        if self.in_flight == 0:
            asyncio.get_running_loop().create_task(self._close())

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def _close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        for plugin in self.plugins:
            try:
                await plugin.stop()
            except Exception:
                log.exception("plugin %s failed to stop", type(plugin).__name__)
        await self.health.stop()
        await self.channels.close()
