"""The limiter in Redis: every gateway instance shares the same windows.

One Lua script checks all of a request's limits and records them only if all pass, in
one round trip, on the Redis server's clock; another settles tokens and releases leases
after the answer, in one more. Sliding windows are sorted sets of request
ids by time (tokens keep each request's amount in a hash and the window's total beside it);
concurrency leases are sorted sets scored by their expiry.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from proxy.limits import LEASE_TTL_S, Check, Decision, Kind, LimiterUnavailable

ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rid = ARGV[1]
local lease = tonumber(ARGV[2])
local best_i, best_remaining, best_reset = 0, -1, 0
for i = 1, #KEYS do
  local a = 2 + (i - 1) * 4
  local kind, limit, window, cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local z = KEYS[i]
  local remaining, reset
  if kind == 1 then
    redis.call('ZREMRANGEBYSCORE', z, '-inf', now - window)
    local count = redis.call('ZCARD', z)
    local oldest = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
    reset = window
    if oldest[2] then reset = tonumber(oldest[2]) + window - now end
    if count + 1 > limit then return {0, i, reset, 0} end
    remaining = limit - count - 1
  elseif kind == 2 then
    local h, total_key = z .. ':h', z .. ':t'
    local old = redis.call('ZRANGEBYSCORE', z, '-inf', now - window)
    if #old > 0 then
      local amounts = redis.call('HMGET', h, unpack(old))
      local freed = 0
      for j = 1, #old do freed = freed + (tonumber(amounts[j]) or 0) end
      redis.call('HDEL', h, unpack(old))
      redis.call('ZREMRANGEBYSCORE', z, '-inf', now - window)
      redis.call('DECRBY', total_key, freed)
    end
    local total = tonumber(redis.call('GET', total_key) or '0')
    local oldest = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
    reset = window
    if oldest[2] then reset = tonumber(oldest[2]) + window - now end
    if total + cost > limit then
      -- refused: walk the window (only now) to find when enough of it expires
      local entries = redis.call('ZRANGE', z, 0, -1, 'WITHSCORES')
      local excess, retry = total + cost - limit, window
      for j = 1, #entries, 2 do
        excess = excess - (tonumber(redis.call('HGET', h, entries[j])) or 0)
        if excess <= 0 then retry = tonumber(entries[j + 1]) + window - now break end
      end
      return {0, i, retry, 0}
    end
    remaining = limit - total - cost
  else
    redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
    if redis.call('ZCARD', z) + 1 > limit then return {0, i, 1000, 0} end
    remaining = limit - redis.call('ZCARD', z) - 1
    reset = 0
  end
  if best_remaining < 0 or remaining < best_remaining then
    best_i, best_remaining, best_reset = i, remaining, reset
  end
end
for i = 1, #KEYS do
  local a = 2 + (i - 1) * 4
  local kind, window, cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local z = KEYS[i]
  if kind == 1 then
    redis.call('ZADD', z, now, rid)
    redis.call('PEXPIRE', z, window)
  elseif kind == 2 then
    redis.call('ZADD', z, now, rid)
    redis.call('HSET', z .. ':h', rid, cost)
    redis.call('INCRBY', z .. ':t', cost)
    for _, k in ipairs({z, z .. ':h', z .. ':t'}) do redis.call('PEXPIRE', k, window) end
  else
    redis.call('ZADD', z, now + lease, rid)
    redis.call('PEXPIRE', z, lease)
  end
end
return {1, best_i, best_remaining, best_reset}
"""

# After the answer: KEYS are token windows to settle (ARGV[2] tokens, or '' to keep) and
# leases to release, told apart by ARGV[3 + i] ('t' or 'c').
FINISH = """
local rid, tokens = ARGV[1], ARGV[2]
for i = 1, #KEYS do
  local z = KEYS[i]
  if ARGV[2 + i] == 'c' then
    redis.call('ZREM', z, rid)
  elseif tokens ~= '' then
    local old = redis.call('HGET', z .. ':h', rid)
    if old then
      redis.call('HSET', z .. ':h', rid, tokens)
      redis.call('INCRBY', z .. ':t', tonumber(tokens) - tonumber(old))
    end
  end
end
return 1
"""


class RedisLimiter:
    def __init__(self, url: str, prefix: str) -> None:
        self._client = aioredis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5,
                                               retry_on_timeout=False, health_check_interval=5)
        self._prefix = prefix + "rl:"
        self._acquire = self._client.register_script(ACQUIRE)
        self._finish = self._client.register_script(FINISH)

    async def acquire(self, checks: list[Check], request_id: str) -> Decision:
        args: list[object] = [request_id, int(LEASE_TTL_S * 1000)]
        for check in checks:
            args += [check.kind.value, check.limit, int(check.window_s * 1000), check.cost]
        try:
            allowed, index, value, reset = await self._acquire(keys=[self._prefix + c.key for c in checks], args=args)
        except (RedisError, OSError) as exc:
            raise LimiterUnavailable(str(exc)) from exc
        check = checks[index - 1] if index else None
        if not allowed:
            return Decision(False, check, 0, value / 1000, value / 1000)
        return Decision(True, check, max(0, int(value)), 0.0, max(0, reset) / 1000)

    async def finish(self, checks: list[Check], request_id: str, tokens: int | None) -> None:
        pending = [c for c in checks if c.kind is Kind.CONCURRENT or (c.kind is Kind.TOKENS and tokens is not None)]
        if not pending:
            return
        kinds = ["c" if c.kind is Kind.CONCURRENT else "t" for c in pending]
        try:
            await self._finish(keys=[self._prefix + c.key for c in pending],
                               args=[request_id, "" if tokens is None else tokens, *kinds])
        except (RedisError, OSError) as exc:
            raise LimiterUnavailable(str(exc)) from exc

    async def close(self) -> None:
        await self._client.aclose()
