"""Budget counters: what a key or tenant has spent this day and this month, shared by every
instance through the state store (or kept in the process with memory state).

A request reserves what it may spend in every window of a subject at once, and only if each has
room for it; after the answer it settles, adding what it really spent less what it reserved.
So spending across instances stops within one request of a budget: a request is let through only
while what is spent and reserved leaves room for its most.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from proxy.state.gathering import Receipt, answer_within


@dataclass(slots=True, frozen=True)
class Window:
    """One budget of one subject for one period: `name` as headers and errors say it (key-day-cost)."""

    key: str  # the counter, period included (it starts from 0 each period)
    name: str
    limit: float
    ttl_s: int  # the counter outlives its period by a little
    starts_at: float  # unix time the period began
    resets_at: float  # unix time the period ends


_DAY_TTL_S = 2 * 86_400
_MONTH_TTL_S = 33 * 86_400


def windows_of(base: str, kind: str, limits: Any, now: datetime) -> list[Window]:
    """The windows `limits` (a key's or a tenant's budget) name this day and month: counters under
    `base`, named for `kind` (key, tenant) as headers and errors say them."""
    day = now.strftime("%Y-%m-%d")
    month = now.strftime("%Y-%m")
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    next_day = (today + timedelta(days=1)).timestamp()
    first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    next_month = (first + timedelta(days=32)).replace(day=1).timestamp()
    found = []
    for measure, period, limit, ttl, resets in (
        ("cost", day, limits.cost_per_day, _DAY_TTL_S, next_day),
        ("cost", month, limits.cost_per_month, _MONTH_TTL_S, next_month),
        ("tokens", day, limits.tokens_per_day, _DAY_TTL_S, next_day),
        ("tokens", month, limits.tokens_per_month, _MONTH_TTL_S, next_month),
    ):
        if limit is not None:
            span = "day" if period == day else "month"
            starts = (today if period == day else first).timestamp()
            found.append(
                Window(f"{base}:{measure}:{period}", f"{kind}-{span}-{measure}", float(limit), ttl, starts, resets)
            )
    return found


@dataclass(slots=True, frozen=True)
class Reserved:
    refused: Window | None  # the first window without room (then nothing was reserved)
    used: list[float]  # each window's spent-and-reserved after this request (or before it, refused)
    made: list[Window] = field(default_factory=list)  # windows whose counter this reservation started


class CountersUnavailable(Exception):
    """The shared store did not answer (in time). `unsent`: the call never went to it, so it
    certainly did not run (a reservation that did go may still be made, late)."""

    def __init__(self, why: str, unsent: bool = False) -> None:
        super().__init__(why)
        self.unsent = unsent


class Counters(Protocol):
    async def reserve(self, windows: Sequence[Window], amounts: Sequence[float]) -> Reserved: ...

    async def settle(self, windows: Sequence[Window], deltas: Sequence[float]) -> None:
        """Add `deltas` to the windows' counters that still exist (a counter whose period ended,
        or that the store lost, is not made again by a late settlement)."""

    async def add(self, windows: Sequence[Window], amounts: Sequence[float]) -> None:
        """Count `amounts` more in `windows`, starting a counter that is gone (spending the ledger
        knows of and the store forgot; spending served while the store was away)."""

    async def hold(self, key: str, value: str, ttl_s: int) -> None:
        """Keep what a generation left open holds (its reservations), until it is claimed; never in
        place of another's (an upstream that gave one id twice: the first keeps it)."""

    async def claim(self, key: str) -> str | None:
        """Take what `hold` kept at `key`, once: the first claim gets it, later ones None."""

    async def read(self, windows: Sequence[Window]) -> list[float]:
        """What each window holds now (spent and reserved), for a report: 0 for one not begun."""

    async def close(self) -> None: ...


class MemoryCounters:
    """In this process (memory state): one instance."""

    def __init__(self, clock: Any = time.time, max_held: int = 100_000) -> None:
        self._clock = clock
        self._values: dict[str, tuple[float, float]] = {}  # key -> (value, expires at)
        self._held: dict[str, tuple[str, float]] = {}  # open generations' reservations -> (value, expires at)
        self._max_held = max_held

    async def reserve(self, windows: Sequence[Window], amounts: Sequence[float]) -> Reserved:
        now = self._clock()
        current = [self._get(w.key, now) for w in windows]
        for window, value, amount in zip(windows, current, amounts):
            if amount > 0 and value + amount > window.limit:
                return Reserved(window, current)
        made = [w for w in windows if w.key not in self._values]
        for window, value, amount in zip(windows, current, amounts):
            self._values[window.key] = (value + amount, now + window.ttl_s)
        self._prune(now)
        return Reserved(None, [v + a for v, a in zip(current, amounts)], made)

    async def settle(self, windows: Sequence[Window], deltas: Sequence[float]) -> None:
        now = self._clock()
        for window, delta in zip(windows, deltas):
            found = self._values.get(window.key)
            if found is not None and found[1] > now:
                self._values[window.key] = (found[0] + delta, found[1])

    async def add(self, windows: Sequence[Window], amounts: Sequence[float]) -> None:
        now = self._clock()
        for window, amount in zip(windows, amounts):
            self._values[window.key] = (self._get(window.key, now) + amount, now + window.ttl_s)

    async def hold(self, key: str, value: str, ttl_s: int) -> None:
        now = self._clock()
        if (found := self._held.get(key)) is not None and found[1] > now:
            return
        self._held[key] = (value, now + ttl_s)
        if len(self._held) > self._max_held:  # the oldest first; expired ones before any
            for old in [k for k, (_, expires) in self._held.items() if expires <= now] or [next(iter(self._held))]:
                del self._held[old]

    async def claim(self, key: str) -> str | None:
        found = self._held.pop(key, None)
        return found[0] if found is not None and found[1] > self._clock() else None

    async def read(self, windows: Sequence[Window]) -> list[float]:
        now = self._clock()
        return [self._get(window.key, now) for window in windows]

    async def close(self) -> None:
        return None

    def _get(self, key: str, now: float) -> float:
        found = self._values.get(key)
        return found[0] if found is not None and found[1] > now else 0.0

    def _prune(self, now: float) -> None:
        if len(self._values) > 10_000:
            for key in [k for k, (_, expires) in self._values.items() if expires <= now]:
                del self._values[key]


# KEYS: the windows' counters. ARGV: each window's limit, amount and ttl. Reserves every amount
# only if each window has room; answers {refused index (0: none), value of each window, and for
# each window 1 if this call made its counter (0 else)}.
RESERVE = """
local values, made = {}, {}
for i = 1, #KEYS do
  local a = (i - 1) * 3
  local limit, amount = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local found = redis.call('GET', KEYS[i])
  local value = tonumber(found or '0')
  values[i] = tostring(value)
  made[i] = found and 0 or 1
  if amount > 0 and value + amount > limit then return {i, values, made} end
end
for i = 1, #KEYS do
  local a = (i - 1) * 3
  values[i] = redis.call('INCRBYFLOAT', KEYS[i], ARGV[a + 2])
  redis.call('EXPIRE', KEYS[i], ARGV[a + 3])
end
return {0, values, made}
"""


# KEYS: a subject's counters; ARGV: what to add to each. A counter that is gone (its period
# over, or lost by the store) is left gone: INCRBYFLOAT would make it again with no expiry.
SETTLE = """
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('INCRBYFLOAT', KEYS[i], ARGV[i]) end
end
return 1
"""


# KEYS: counters; ARGV: what to add to each, then each one's life. One that was gone is started,
# with its expiry (INCRBYFLOAT alone would make it with none).
ADD = """
local n = #KEYS
for i = 1, n do
  redis.call('INCRBYFLOAT', KEYS[i], ARGV[i])
  if redis.call('TTL', KEYS[i]) < 0 then redis.call('EXPIRE', KEYS[i], ARGV[n + i]) end
end
return 1
"""


class RedisCounters:
    """In the shared state store: every instance counts in the same windows. A subject's windows
    share a hash tag on a Cluster, so one script reserves them all."""

    def __init__(self, url: str, wait_s: float = 0.5) -> None:
        from proxy.state.shared import share

        self._shared = share(url)
        self._wait_s = wait_s  # as the limiter's (state.check_timeout_s): past it the fail mode decides
        self._reserve = self._shared.client.register_script(RESERVE)
        self._settle = self._shared.client.register_script(SETTLE)
        self._add = self._shared.client.register_script(ADD)

    async def reserve(self, windows: Sequence[Window], amounts: Sequence[float]) -> Reserved:
        args: list[Any] = []
        for window, amount in zip(windows, amounts):
            args += [repr(window.limit), repr(amount), window.ttl_s]
        # With its receipt: a reservation that timed out unsent never ran (its request is counted later).
        refused, values, made = await self._call(
            *self._shared.calls.script_with_receipt(self._reserve, [w.key for w in windows], args)
        )
        return Reserved(
            windows[refused - 1] if refused else None,
            [float(v) for v in values],
            [w for w, new in zip(windows, made) if new and not refused],
        )

    async def settle(self, windows: Sequence[Window], deltas: Sequence[float]) -> None:
        # Scripts are never resent: counted twice, a settlement would err by more than one request.
        if any(deltas):
            await self._call(
                self._shared.calls.script(self._settle, [w.key for w in windows], [repr(d) for d in deltas])
            )

    async def hold(self, key: str, value: str, ttl_s: int) -> None:
        await self._call(self._shared.calls.command("SET", key, value, "EX", ttl_s, "NX"))

    async def claim(self, key: str) -> str | None:
        # GETDEL is never resent: sent again after it ran, it would find nothing and lose the claim.
        found = await self._call(self._shared.calls.command("GETDEL", key, resend=False))
        return found.decode() if found is not None else None

    async def read(self, windows: Sequence[Window]) -> list[float]:
        # One subject's windows a call (they share a hash tag on a Cluster, so one slot).
        found = await self._call(self._shared.calls.command("MGET", *[w.key for w in windows]))
        return [float(value) if value is not None else 0.0 for value in found]

    async def _call(self, pending: asyncio.Future[Any], receipt: Receipt | None = None) -> Any:
        from redis.exceptions import RedisError

        try:
            return await answer_within(pending, self._wait_s)
        except (RedisError, OSError, TimeoutError) as exc:
            raise CountersUnavailable(type(exc).__name__, unsent=receipt is not None and not receipt.sent) from exc

    async def add(self, windows: Sequence[Window], amounts: Sequence[float]) -> None:
        args = [repr(a) for a in amounts] + [w.ttl_s for w in windows]
        await self._call(self._shared.calls.script(self._add, [w.key for w in windows], args))

    async def close(self) -> None:
        from proxy.state.shared import unshare

        shared, self._shared = self._shared, None
        if shared is not None:
            await unshare(shared)
