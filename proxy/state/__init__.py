"""Shared state: a small key/value store with expiry, in process memory or in Redis.

Affinity maps live here (and later rate-limit counters), so several gateway instances
sharing one Redis agree on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the config checks state URLs with proxy.state.connect
    from proxy.config.model import StateConfig


@dataclass(slots=True, frozen=True)
class Write:
    """A value to set, or (`keep`) to put first in a list keeping the newest `keep`, for `ttl_s`."""

    key: str
    value: str
    ttl_s: int
    keep: int | None = None


class StateStore(Protocol):
    async def get(self, key: str) -> str | None: ...
    async def set(self, key: str, value: str, ttl_s: int) -> None: ...
    async def take(self, key: str) -> str | None:
        """Get `key` and delete it, in one step: of several takers, one gets the value."""

    async def add(self, key: str, value: str, ttl_s: int, then: Sequence[Write] = ()) -> bool:
        """Set `key` only if it holds nothing (or has expired); True when it was set, and then
        `then` was written too, in the same step (one round trip on Redis off a Cluster)."""

    async def push(self, key: str, value: str, ttl_s: int, keep: int) -> None:
        """Put `value` first in the list at `key`, keeping the newest `keep`; the list lives `ttl_s`."""

    async def recent(self, key: str, count: int) -> list[str]:
        """The newest `count` values of the list at `key`, newest first."""

    async def ping(self) -> bool:
        """True when the store answers; raises (or False) when it does not."""

    async def close(self) -> None: ...


def make_store(config: StateConfig) -> StateStore:
    if config.backend == "redis":
        from proxy.state.redis import RedisStore

        return RedisStore(config.url, config.prefix)
    from proxy.state.memory import MemoryStore

    return MemoryStore(config.max_items)
