"""`Runtime`: one loaded config made live — its channels, their sessions, and each route's
settings and pipeline (proxy/process/runtime.py builds one).

A reload builds a new Runtime and swaps it in; requests already running keep the one they
started with, and a retired Runtime closes its sessions and plugins only once its last request
has finished, so a reload never cuts a stream.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.config import GatewayConfig, LoadedConfig
    from proxy.core.pipeline import Pipeline
    from proxy.core.plugin import Plugin
    from proxy.observability.observer import Observer
    from proxy.policy.channels import ChannelSet
    from proxy.policy.health_checks import HealthChecks
    from proxy.policy.keys import KeyRing

log = logging.getLogger("modelgate.runtime")


@dataclass(slots=True, frozen=True)
class RouteSettings:
    """What a request on one route reads of the config, resolved once when the runtime is built
    (`routes.<route>` over the server's defaults), not looked up per request."""

    pipeline: Pipeline
    body_limit: int  # bytes of a whole body
    upload_limit: int  # bytes of a streamed upload
    body_timeout_s: float  # the longest a whole body may take to arrive
    failover_unanswered: bool  # a chat request an upstream took and never answered may go to another


class Runtime:
    __slots__ = (
        "loaded",
        "config",
        "channels",
        "routes",
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
        routes: dict[str, RouteSettings],
        plugins: list[Plugin],
        observer: Observer,
        health: HealthChecks,
        keys: KeyRing,
    ) -> None:
        self.loaded = loaded
        self.config: GatewayConfig = loaded.config
        self.channels = channels
        self.routes = routes
        self.plugins = plugins
        self.observer = observer
        self.health = health
        self.keys = keys  # to know a gateway key wherever it travels, the key store's too
        self.in_flight = 0
        self._retired = False
        self._closed = asyncio.Event()

    async def open(self) -> None:
        """Open the channels' sessions, start health checks and the plugins; a runtime that fails
        half-way is closed again (it must not leak sessions)."""
        try:
            await self.channels.open()
            self.health.start()
            for plugin in self.plugins:
                plugin.channels = self.channels
                await plugin.start()
        except BaseException:
            await self._close()
            raise

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
