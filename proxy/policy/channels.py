"""Channels: the upstreams, what each serves, and how one is picked for a request.

A channel owns one pool of keep-alive connections (`proxy.upstream`). Among the channels that serve a
route and model, the lowest `priority` number wins (0 first, as in DNS SRV and Envoy);
within that tier a channel is drawn in proportion to its `weight`.
"""

from __future__ import annotations

import fnmatch
import random
import re

from proxy.config.model import ChannelConfig
from proxy.policy.resilience import ChannelHealth
from proxy.request.redact import Redactor
from proxy.upstream import UpstreamPool
from proxy.wire.routes import Route


class Channel:
    __slots__ = (
        "config",
        "name",
        "base_url",
        "priority",
        "weight",
        "credential",
        "redactor",
        "timeouts",
        "_models",
        "_formats",
        "_endpoints",
        "_rename",
        "pool",
        "health",
    )

    def __init__(self, config: ChannelConfig, base_url: str, health: ChannelHealth | None = None) -> None:
        self.config = config
        self.name = config.name
        self.base_url = base_url.rstrip("/")
        self.priority = config.priority
        self.weight = config.weight
        self.credential = config.credential
        # What the upstream echoes of its credential never reaches a client (proxy.request.relay).
        self.redactor = Redactor(config.credential) if config.credential else None
        self.timeouts = config.timeouts
        self._models = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in config.models))
        self._formats = frozenset(config.formats)
        self._endpoints = frozenset(config.endpoints) if config.endpoints is not None else None
        self._rename = dict(config.rename)
        self.pool: UpstreamPool | None = None
        self.health = health or ChannelHealth()  # its breaker and health check (proxy/policy/resilience.py)

    async def open(self) -> None:
        timeouts, pool = self.timeouts, self.config.pool
        self.pool = UpstreamPool(
            self.base_url,
            max_connections=pool.max_connections,
            max_idle=pool.max_idle,
            keepalive_s=pool.keepalive_s,
            connect_s=timeouts.connect_s,
            first_byte_s=timeouts.first_byte_s,
            idle_s=timeouts.idle_s,
            total_s=timeouts.total_s,
        )

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
            self.pool = None

    def serves(self, route: Route) -> bool:
        if self._endpoints is not None:
            return route.name in self._endpoints
        return route.format.name in self._formats

    def serves_model(self, model: str) -> bool:
        return self._models.fullmatch(model) is not None

    def upstream_model(self, model: str) -> str:
        return self._rename.get(model, model)

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, {self.base_url!r})"


_CANDIDATE_CACHE = 4096  # (route, model) pairs remembered; models are the client's words, so bounded


class ChannelSet:
    __slots__ = ("channels", "_by_name", "_candidates")

    def __init__(self, channels: list[Channel]) -> None:
        self.channels = channels
        self._by_name = {c.name: c for c in channels}
        # What serves a route and model follows from config alone, so it is worked out once per pair.
        self._candidates: dict[tuple[str, str | None], list[Channel]] = {}

    def get(self, name: str) -> Channel | None:
        return self._by_name.get(name)

    def candidates(self, route: Route, model: str | None) -> list[Channel]:
        key = (route.name, model)
        found = self._candidates.get(key)
        if found is None:
            found = [c for c in self.channels if c.serves(route) and (model is None or c.serves_model(model))]
            if len(self._candidates) >= _CANDIDATE_CACHE:
                self._candidates.clear()
            self._candidates[key] = found
        return found

    def pick(self, route: Route, model: str | None, exclude: tuple[Channel, ...] = ()) -> Channel | None:
        """The channel for a request: lowest priority number, then weight; channels whose breaker
        is open, and those already tried, are passed over."""
        found = [c for c in self.candidates(route, model) if c not in exclude and c.health.available()]
        if len(found) <= 1:
            chosen = found[0] if found else None  # the usual case: one channel, nothing to weigh
        else:
            best = min(c.priority for c in found)
            tier = [c for c in found if c.priority == best]
            chosen = tier[0] if len(tier) == 1 else random.choices(tier, weights=[c.weight for c in tier])[0]
        if chosen is not None:
            chosen.health.chosen()  # while its breaker is open, this request finds out whether it recovered
        return chosen

    async def open(self) -> None:
        for channel in self.channels:
            await channel.open()

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()
