"""In-process state: right for one gateway process, and the embedded default."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from proxy.core import jsonutil

if TYPE_CHECKING:
    from proxy.state import Write


class MemoryStore:
    """Keys with expiry in a dict. Bounded: past `max_items` the oldest entries go first (an
    affinity pin lives a week; without a bound a busy gateway would keep every one of them)."""

    __slots__ = ("_items", "_sets_since_sweep", "_max_items", "_clock")

    _SWEEP_EVERY = 1024

    def __init__(self, max_items: int = 200_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._items: dict[str, tuple[str, float]] = {}
        self._sets_since_sweep = 0
        self._max_items = max_items
        self._clock = clock

    async def get(self, key: str) -> str | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[1] < self._clock():
            del self._items[key]
            return None
        return item[0]

    async def take(self, key: str) -> str | None:
        found = await self.get(key)
        self._items.pop(key, None)
        return found

    async def set(self, key: str, value: str, ttl_s: int) -> None:
        self._items.pop(key, None)  # re-inserted at the end: insertion order is age order
        self._items[key] = (value, self._clock() + ttl_s)
        self._sets_since_sweep += 1
        if self._sets_since_sweep >= self._SWEEP_EVERY:
            self._sweep()
        while len(self._items) > self._max_items:
            del self._items[next(iter(self._items))]

    async def add(self, key: str, value: str, ttl_s: int, then: Sequence[Write] = ()) -> bool:
        if await self.get(key) is not None:
            return False
        await self.set(key, value, ttl_s)
        for write in then:
            if write.keep is None:
                await self.set(write.key, write.value, write.ttl_s)
            else:
                await self.push(write.key, write.value, write.ttl_s, write.keep)
        return True

    async def push(self, key: str, value: str, ttl_s: int, keep: int) -> None:
        held = await self.get(key)
        values = [value, *(jsonutil.loads(held) if held else [])][:keep]
        await self.set(key, jsonutil.dumps(values).decode(), ttl_s)

    async def recent(self, key: str, count: int) -> list[str]:
        held = await self.get(key)
        return jsonutil.loads(held)[:count] if held else []

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._items.clear()

    def _sweep(self) -> None:
        # Expired keys nobody reads again would otherwise stay forever.
        now = self._clock()
        self._items = {k: v for k, v in self._items.items() if v[1] >= now}
        self._sets_since_sweep = 0
