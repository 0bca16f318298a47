"""Channels: the upstreams, what each serves, and how one is picked for a request.

A channel owns one pool of keep-alive connections (`proxy.upstream`). Among the channels that serve a
route and model, the lowest `priority` number wins (0 first, as in DNS SRV and Envoy);
within that tier a channel is drawn in proportion to its `weight`.

A chat request for a model no channel of its own format serves goes to the channels of the
other chat formats that serve it, translated (proxy/formats/translation/): a model is reached
whichever format its client speaks, while a channel of the client's own format, when there is
one, is always preferred (passed through, nothing to lose).
"""

from __future__ import annotations

import fnmatch
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.config.model import ChannelConfig, ModelTarget
from proxy.formats import FORMATS, Format
from proxy.formats.translation import CODECS
from proxy.formats.translation import ROUTES as TRANSLATED_ROUTES
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
        "_chat_formats",
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
        # The chat formats it speaks, in its config's order: a request of another is translated to the first.
        self._chat_formats = tuple(FORMATS[name] for name in _chat_formats(config))
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

    @property
    def speaks_chat(self) -> bool:
        """Whether it serves any chat format (so a request of every chat format, translated)."""
        return bool(self._chat_formats)

    def translated_format(self, route: Route) -> Format | None:
        """The format a request of `route` goes to this channel in, when not its own: None
        when the channel serves the route as it is, or cannot take it translated."""
        if self.serves(route) or route.name not in TRANSLATED_ROUTES:
            return None
        return next((found for found in self._chat_formats if found is not route.format), None)

    def serves_model(self, model: str) -> bool:
        return self._models.fullmatch(model) is not None

    def upstream_model(self, model: str) -> str:
        return self._rename.get(model, model)

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, {self.base_url!r})"


# Each chat format's generation routes: a channel restricted by `endpoints` takes a request
# translated to a format only when it serves all of them (a translated request may stream or not).
_GENERATION_ROUTES = {
    "messages": ("messages",),
    "content": ("generate_content", "stream_generate_content"),
    "responses": ("responses",),
    "chat": ("chat_completions",),
}


def _chat_formats(config: ChannelConfig) -> list[str]:
    """The chat formats a channel serves whole, in its config's order."""
    if config.endpoints is None:
        return [name for name in dict.fromkeys(config.formats) if name in CODECS]
    listed = set(config.endpoints)
    found = {
        name: min(config.endpoints.index(r) for r in routes)
        for name, routes in _GENERATION_ROUTES.items()
        if listed.issuperset(routes)
    }
    return sorted(found, key=found.__getitem__)


_CANDIDATE_CACHE = 4096  # (route, model) pairs remembered; models are the client's words, so bounded


@dataclass(slots=True, frozen=True)
class Target:
    """Where a public model name (`models:`) is served: a channel, the name there, a weight."""

    channel: Channel
    model: str
    weight: float | None


class ChannelSet:
    __slots__ = ("channels", "_by_name", "_candidates", "aliases")

    def __init__(self, channels: list[Channel], models: Mapping[str, list[ModelTarget]] | None = None) -> None:
        self.channels = channels
        self._by_name = {c.name: c for c in channels}
        # What serves a route and model follows from config alone, so it is worked out once per pair.
        self._candidates: dict[tuple[str, str | None], list[Channel]] = {}
        # The chat routes' public model names, each with its targets in order.
        self.aliases: dict[str, tuple[Target, ...]] = {
            name: tuple(Target(self._by_name[t.channel], t.model, t.weight) for t in targets)
            for name, targets in (models or {}).items()
        }

    def get(self, name: str) -> Channel | None:
        return self._by_name.get(name)

    def targets(self, route: Route, model: str | None) -> tuple[Target, ...] | None:
        """A public model name's targets, on a route of a chat format (None: not such a name, or
        another format's route). On a route that is not translated (counting tokens), only those
        serving it as it is take it."""
        if not self.aliases or model is None or route.format.name not in CODECS:
            return None
        return self.aliases.get(model)

    def upstream_model(self, channel: Channel, route: Route, model: str) -> str:
        """The model's name at `channel`: a target's, for a public name; else the channel's rename."""
        for target in self.targets(route, model) or ():
            if target.channel is channel:
                return target.model
        return channel.upstream_model(model)

    def candidates(self, route: Route, model: str | None) -> list[Channel]:
        key = (route.name, model)
        found = self._candidates.get(key)
        if found is None:
            targets = self.targets(route, model)
            if targets is not None:  # those that can take this route's requests, as they are or translated
                found = [t.channel for t in targets if t.channel.serves(route) or t.channel.translated_format(route)]
            else:
                found = [c for c in self.channels if c.serves(route) and (model is None or c.serves_model(model))]
                if not found and model is not None and route.name in TRANSLATED_ROUTES:
                    found = [c for c in self.channels if c.translated_format(route) and c.serves_model(model)]
            if len(self._candidates) >= _CANDIDATE_CACHE:
                self._candidates.clear()
            self._candidates[key] = found
        return found

    def pick(self, route: Route, model: str | None, exclude: tuple[Channel, ...] = ()) -> Channel | None:
        """The channel for a request: lowest priority number, then weight (for a public model
        name, its targets' order); channels whose breaker is open, and those already tried, are
        passed over."""
        found = [c for c in self.candidates(route, model) if c not in exclude and c.health.available()]
        targets = self.targets(route, model)
        if targets is not None:
            chosen = self._target(targets, found, first=not exclude)
        elif len(found) <= 1:
            chosen = found[0] if found else None  # the usual case: one channel, nothing to weigh
        else:
            best = min(c.priority for c in found)
            tier = [c for c in found if c.priority == best]
            chosen = tier[0] if len(tier) == 1 else random.choices(tier, weights=[c.weight for c in tier])[0]
        if chosen is not None:
            chosen.health.chosen()  # while its breaker is open, this request finds out whether it recovered
        return chosen

    @staticmethod
    def _target(targets: tuple[Target, ...], available: list[Channel], first: bool) -> Channel | None:
        """A public name's next target: in order, but a weighted list's first attempt drawn by weight."""
        if not available:
            return None
        weighted = [t for t in targets if t.channel in available and t.weight is not None]
        if first and weighted:
            return random.choices(weighted, weights=[t.weight or 0.0 for t in weighted])[0].channel
        return available[0]

    async def open(self) -> None:
        for channel in self.channels:
            await channel.open()

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()
