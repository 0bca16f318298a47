"""State in Redis, shared by every gateway instance that points at it.

Each value lives under one key, so it works unchanged on a Cluster; a list's push is one
transaction on its own key (one slot)."""

from __future__ import annotations

from proxy.state.connect import connect


class RedisStore:
    __slots__ = ("_client", "_prefix")

    def __init__(self, url: str, prefix: str) -> None:
        self._client = connect(url, decode_responses=True, socket_timeout=2.0, socket_connect_timeout=2.0,
                               health_check_interval=30)
        self._prefix = prefix

    async def get(self, key: str) -> str | None:
        return await self._client.get(self._prefix + key)

    async def set(self, key: str, value: str, ttl_s: int) -> None:
        await self._client.set(self._prefix + key, value, ex=ttl_s)

    async def add(self, key: str, value: str, ttl_s: int) -> bool:
        return bool(await self._client.set(self._prefix + key, value, ex=ttl_s, nx=True))

    async def push(self, key: str, value: str, ttl_s: int, keep: int) -> None:
        async with self._client.pipeline(transaction=True) as pipe:
            key = self._prefix + key
            await pipe.lpush(key, value).ltrim(key, 0, keep - 1).expire(key, ttl_s).execute()

    async def recent(self, key: str, count: int) -> list[str]:
        return await self._client.lrange(self._prefix + key, 0, count - 1)

    async def ping(self) -> bool:
        return bool(await self._client.ping())  # an error says why the store is away (the probe logs it)

    async def close(self) -> None:
        await self._client.aclose()
