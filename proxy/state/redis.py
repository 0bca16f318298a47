"""State in Redis, shared by every gateway instance that points at it.

Each value lives under one key, so it works unchanged on a Cluster; a list's push is one
script on its own key (one slot). Calls go through the process's shared client for the URL
(proxy/state/shared.py), so those a request makes together share a round trip."""

from __future__ import annotations

from proxy.state.shared import share, unshare

# LPUSH, then keep the newest ARGV[2] and let the list live ARGV[3] seconds: as one step, so a
# list is never left without its expiry.
_PUSH = """
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""


class RedisStore:
    __slots__ = ("_shared", "_calls", "_prefix", "_push")

    def __init__(self, url: str, prefix: str) -> None:
        self._shared = share(url)
        self._calls = self._shared.calls
        self._prefix = prefix
        self._push = self._shared.client.register_script(_PUSH)

    async def get(self, key: str) -> str | None:
        found = await self._calls.command("GET", self._prefix + key)
        return found.decode() if found is not None else None

    async def set(self, key: str, value: str, ttl_s: int) -> None:
        await self._calls.command("SET", self._prefix + key, value, "EX", ttl_s)

    async def add(self, key: str, value: str, ttl_s: int) -> bool:
        # Sent again after a failed connection, a SET NX that had landed reads as taken: the id
        # is then treated as held by another (an alias, or a warning), never given to two owners.
        return bool(await self._calls.command("SET", self._prefix + key, value, "EX", ttl_s, "NX"))

    async def push(self, key: str, value: str, ttl_s: int, keep: int) -> None:
        await self._calls.script(self._push, [self._prefix + key], [value, keep, ttl_s])

    async def recent(self, key: str, count: int) -> list[str]:
        found = await self._calls.command("LRANGE", self._prefix + key, 0, count - 1)
        return [value.decode() for value in found]

    async def ping(self) -> bool:
        return bool(await self._shared.client.ping())  # an error says why the store is away (the probe logs it)

    async def close(self) -> None:
        shared, self._shared = self._shared, None  # type: ignore[assignment]
        if shared is not None:
            await unshare(shared)
