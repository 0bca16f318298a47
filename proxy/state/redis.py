"""State in Redis, shared by every gateway instance that points at it.

Each value lives under one key, so it works unchanged on a Cluster; a list's push is one
script on its own key (one slot). Calls go through the process's shared client for the URL
(proxy/state/shared.py), so those a request makes together share a round trip."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from proxy.state.shared import share, unshare

if TYPE_CHECKING:
    from proxy.state import Write

# LPUSH, then keep the newest ARGV[2] and let the list live ARGV[3] seconds: as one step, so a
# list is never left without its expiry.
_PUSH = """
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""

# SET NX KEYS[1] (ARGV[1] for ARGV[2] seconds); only if it was set, the writes that go with it:
# for each further key, its value, seconds, and 0 to set it or N to push it keeping the newest N.
_ADD_THEN = """
if not redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2], 'NX') then return 0 end
for i = 2, #KEYS do
  local a = 3 + (i - 2) * 3
  local value, ttl, keep = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  if keep == 0 then
    redis.call('SET', KEYS[i], value, 'EX', ttl)
  else
    redis.call('LPUSH', KEYS[i], value)
    redis.call('LTRIM', KEYS[i], 0, keep - 1)
    redis.call('EXPIRE', KEYS[i], ttl)
  end
end
return 1
"""


class RedisStore:
    __slots__ = ("_shared", "_calls", "_prefix", "_push", "_add_then")

    def __init__(self, url: str, prefix: str) -> None:
        self._shared = share(url)
        self._calls = self._shared.calls
        self._prefix = prefix
        self._push = self._shared.client.register_script(_PUSH)
        self._add_then = self._shared.client.register_script(_ADD_THEN)

    async def get(self, key: str) -> str | None:
        found = await self._calls.command("GET", self._prefix + key)
        return found.decode() if found is not None else None

    async def take(self, key: str) -> str | None:
        # Never resent: a GETDEL that ran, sent again, would find nothing and lose the value.
        found = await self._calls.command("GETDEL", self._prefix + key, resend=False)
        return found.decode() if found is not None else None

    async def set(self, key: str, value: str, ttl_s: int) -> None:
        await self._calls.command("SET", self._prefix + key, value, "EX", ttl_s)

    async def add(self, key: str, value: str, ttl_s: int, then: Sequence[Write] = ()) -> bool:
        if not then:
            # Sent again after a failed connection, a SET NX that had landed reads as taken: the id
            # is then treated as held by another (an alias, or a warning), never given to two owners.
            return bool(await self._calls.command("SET", self._prefix + key, value, "EX", ttl_s, "NX"))
        if self._calls.gathers:  # one script: the writes are made only if the key was free
            args: list[str | int] = [value, ttl_s]
            for write in then:
                args += [write.value, write.ttl_s, write.keep or 0]
            keys = [self._prefix + key, *(self._prefix + write.key for write in then)]
            return bool(await self._calls.script(self._add_then, keys, args))
        # A Cluster runs no script over keys of several slots: the writes follow the add.
        if not await self.add(key, value, ttl_s):
            return False
        await asyncio.gather(
            *(
                self.set(w.key, w.value, w.ttl_s) if w.keep is None else self.push(w.key, w.value, w.ttl_s, w.keep)
                for w in then
            )
        )
        return True

    async def push(self, key: str, value: str, ttl_s: int, keep: int) -> None:
        await self._calls.script(self._push, [self._prefix + key], [value, keep, ttl_s])

    async def recent(self, key: str, count: int) -> list[str]:
        found = await self._calls.command("LRANGE", self._prefix + key, 0, count - 1)
        return [value.decode() for value in found]

    async def ping(self) -> bool:
        """Whether the store answers; an error says why it is away (the probe logs it). On a Cluster
        every primary is asked: redis-py asks one node, which answers while another's slots, and the
        keys in them, are unserved."""
        if not self._calls.gathers:  # a Cluster
            return bool(await self._shared.client.ping(target_nodes="primaries"))
        return bool(await self._shared.client.ping())

    async def close(self) -> None:
        shared, self._shared = self._shared, None  # type: ignore[assignment]
        if shared is not None:
            await unshare(shared)
