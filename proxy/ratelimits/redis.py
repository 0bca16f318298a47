"""The limiter in Redis: every gateway instance shares the same windows.

A Lua script checks a request's limits and records them only if all pass, on the Redis
server's clock; another settles tokens and releases leases after the answer. Sliding windows
are sorted sets of request ids by time (tokens keep each request's amount in a hash and the
window's total beside it); concurrency leases are sorted sets scored by their expiry, which
the process holding a lease pushes back while it lives (proxy/ratelimits/heartbeat.py), so the
leases of a process that died lapse within seconds.

Every key a script touches is passed in KEYS. On a Cluster a subject's keys (those of one key,
one key and model, one route, one client IP) share a hash tag, `{key:demo}`, so they live in
one slot; elsewhere keys keep the names they always had (`modelgate:rl:key:demo:rpm`), so
instances of an older release, during an upgrade, count in the same windows. On one server,
or a Sentinel-named primary, all of a request's limits go in one script call: one round trip.
On a Cluster, limits of subjects in different slots cannot share a script; each slot gets its
own call, all sent at once (one round trip's wait), and when any
refuses, what the others took is given back (UNDO), so a refused request counts nowhere. The
price: for the moment between the take and the undo, another request of the same subject may
see that request counted, and be refused where it would otherwise have passed; never the other
way round. Off a Cluster, the calls go through the process's shared client and are gathered
with the other calls made in the same turn (proxy/state/gathering.py): with the record of the id
a request follows, with other requests' checks (under load a limit check then costs the gateway
about half the CPU), and after the answer with the request's pin or image.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from redis.crc import key_slot
from redis.exceptions import DataError, NoScriptError, RedisError, ResponseError

from proxy.ratelimits import Check, Decision, Kind, LimiterUnavailable
from proxy.ratelimits.heartbeat import LEASE_LIFE_S, RENEW_EVERY_S, Heartbeat
from proxy.state.connect import Mode, mode_of
from proxy.state.gathering import answer_within
from proxy.state.shared import share, unshare

log = logging.getLogger("modelgate.ratelimit")

_RETRY_S = 1.0  # between tries of settlements Redis could not take
_MAX_UNSETTLED = 10_000
_RENEW_BATCH = 500  # leases per renewal call: a round for thousands of streams does not hold Redis up in one script

# KEYS, check by check: a window's sorted set (REQUESTS), or that and its amounts' hash and
# total (TOKENS), or a lease set (CONCURRENT); last, the request's give-back mark. ARGV: the
# request id, the lease's life, then kind, limit, window and cost of each check. Answers
# {allowed, check, remaining or retry, reset}; a request already given back takes nothing.
ACQUIRE = """
if redis.call('EXISTS', KEYS[#KEYS]) == 1 then return {0, 0, 0, 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rid = ARGV[1]
local lease = tonumber(ARGV[2])
local checks = (#ARGV - 2) / 4
local best_i, best_remaining, best_reset = 0, -1, 0
local k = 1
for i = 1, checks do
  local a = 2 + (i - 1) * 4
  local kind, limit = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local window, cost = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local z = KEYS[k]
  local remaining, reset
  if kind == 1 then
    k = k + 1
    redis.call('ZREMRANGEBYSCORE', z, '-inf', now - window)
    local count = redis.call('ZCARD', z)
    local oldest = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
    reset = window
    if oldest[2] then reset = tonumber(oldest[2]) + window - now end
    if count + 1 > limit then return {0, i, reset, 0} end
    remaining = limit - count - 1
  elseif kind == 2 then
    local h, total_key = KEYS[k + 1], KEYS[k + 2]
    k = k + 3
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
    k = k + 1
    redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
    if redis.call('ZCARD', z) + 1 > limit then return {0, i, 1000, 0} end
    remaining = limit - redis.call('ZCARD', z) - 1
    reset = 0
  end
  if kind ~= 3 and (best_remaining < 0 or remaining < best_remaining) then
    best_i, best_remaining, best_reset = i, remaining, reset
  end
end
k = 1
for i = 1, checks do
  local a = 2 + (i - 1) * 4
  local kind, window, cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local z = KEYS[k]
  if kind == 1 then
    k = k + 1
    redis.call('ZADD', z, now, rid)
    redis.call('PEXPIRE', z, window)
  elseif kind == 2 then
    local h, total_key = KEYS[k + 1], KEYS[k + 2]
    k = k + 3
    redis.call('ZADD', z, now, rid)
    redis.call('HSET', h, rid, cost)
    redis.call('INCRBY', total_key, cost)
    for _, key in ipairs({z, h, total_key}) do redis.call('PEXPIRE', key, window) end
  else
    k = k + 1
    redis.call('ZADD', z, now + lease, rid)
    -- never shortened: during an upgrade an older release's leases (30 minutes) share the set
    if redis.call('PTTL', z) < lease then redis.call('PEXPIRE', z, lease) end
  end
end
return {1, best_i, best_remaining, best_reset}
"""

# After the answer, or to give back what a request took: KEYS as for ACQUIRE; ARGV the request
# id, the tokens spent ('' keeps the reservation; 'undo' gives back every entry), and each
# check's kind. Leases are always released. A give-back leaves its mark for a minute, so a check
# of the same request that reaches Redis after it (a late one, on another connection) takes nothing.
FINISH = """
local rid, tokens = ARGV[1], ARGV[2]
if tokens == 'undo' then redis.call('SET', KEYS[#KEYS], '1', 'PX', 60000) end
local k = 1
for i = 3, #ARGV do
  local kind, z = ARGV[i], KEYS[k]
  if kind == '2' then
    local h, total_key = KEYS[k + 1], KEYS[k + 2]
    k = k + 3
    local old = redis.call('HGET', h, rid)
    if old and tokens == 'undo' then
      redis.call('ZREM', z, rid)
      redis.call('HDEL', h, rid)
      redis.call('DECRBY', total_key, tonumber(old))
    elseif old and tokens ~= '' then
      redis.call('HSET', h, rid, tokens)
      redis.call('INCRBY', total_key, tonumber(tokens) - tonumber(old))
    end
  else
    k = k + 1
    if kind == '3' or tokens == 'undo' then redis.call('ZREM', z, rid) end
  end
end
return 1
"""

# The heartbeat's round (proxy/ratelimits/heartbeat.py): KEYS are lease sets; ARGV the lease's life,
# then for each set how many request ids follow, and those ids. Each lease still there lapses a
# life from now; one that is gone (released, or lapsed and removed by a check) stays gone: XX.
# Answers the gone ones, as {index of the set in KEYS, request id, ...}, looked for only when
# fewer leases than sent were renewed: a round then costs Redis a third less than looking always.
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
local gone = {}
local a = 2
for i = 1, #KEYS do
  local z, count = KEYS[i], tonumber(ARGV[a])
  local renewal = {}
  for j = 1, count do
    renewal[2 * j - 1] = now + lease
    renewal[2 * j] = ARGV[a + j]
  end
  local renewed = redis.call('ZADD', z, 'XX', 'GT', 'CH', unpack(renewal))
  if renewed < count then
    local scores = redis.call('ZMSCORE', z, unpack(ARGV, a + 1, a + count))
    for j = 1, count do
      if not scores[j] then
        gone[#gone + 1] = i
        gone[#gone + 1] = ARGV[a + j]
      end
    end
  end
  if renewed > 0 and redis.call('PTTL', z) < lease then redis.call('PEXPIRE', z, lease) end
  a = a + count + 1
end
return gone
"""


class RedisLimiter:
    def __init__(
        self,
        url: str,
        prefix: str,
        lease_life_s: float = LEASE_LIFE_S,
        renew_every_s: float = RENEW_EVERY_S,
        wait_s: float = 0.5,
    ) -> None:
        # wait_s (state.check_timeout_s): the longest a check waits on Redis before the fail mode
        # decides (the shared client's own timeouts are longer, for the image store's writes).
        self._wait_s = wait_s
        # Scripts are never resent: one that timed out may have run, and a second run would count
        # the request's tokens twice. An error is the fail mode's to decide.
        self._shared = share(url)
        self._prefix = prefix + "rl:"
        self._by_slot = mode_of(url) is Mode.CLUSTER
        self._acquire = self._shared.client.register_script(ACQUIRE)
        # Settlements and give-backs Redis could not take yet: (request id, first key) -> (checks, spent).
        self._unsettled: OrderedDict[tuple[str, str], tuple[Sequence[Check], str]] = OrderedDict()
        self._resettling: asyncio.Task[None] | None = None
        self._finish = self._shared.client.register_script(FINISH)
        self._renewal = self._shared.client.register_script(RENEW)
        self._lease_ms = int(lease_life_s * 1000)
        self._heartbeat = Heartbeat(self._renew, lease_life_s, renew_every_s)

    async def acquire(self, checks: list[Check], request_id: str) -> Decision:
        """A check that fails, times out or is cancelled (its client went away) may still have
        run, or run later: it is given back (kept and tried every second until Redis takes it),
        so a request the fail mode served or refused, or that nobody waits for, never holds a lease.
        A lease taken is renewed by this process until it is released (proxy/ratelimits/heartbeat.py)."""
        groups = self._groups(checks)
        if len(groups) == 1:
            try:
                decision = await self._acquire_group(checks, request_id)
            except (LimiterUnavailable, asyncio.CancelledError):  # cancelled: the caller went away, the check may run
                self._keep(checks, request_id, "undo")
                raise
            except (RedisError, OSError) as exc:
                self._keep(checks, request_id, "undo")
                raise LimiterUnavailable(str(exc)) from exc
            if decision.allowed:
                self._hold(checks, request_id)
            return decision
        try:
            found = await asyncio.gather(*(self._acquire_group(g, request_id) for g in groups), return_exceptions=True)
        except asyncio.CancelledError:
            for group in groups:
                self._keep(group, request_id, "undo")
            raise
        failed = next((r for r in found if isinstance(r, BaseException)), None)
        refused = [r for r in found if isinstance(r, Decision) and not r.allowed]
        if failed is not None or refused:
            for group, result in zip(groups, found):
                if isinstance(result, BaseException):
                    self._keep(group, request_id, "undo")
            taken = [g for g, r in zip(groups, found) if isinstance(r, Decision) and r.allowed]
            undone = await asyncio.gather(
                *(self._call_finish(g, request_id, "undo") for g in taken), return_exceptions=True
            )
            for group, result in zip(taken, undone):
                if isinstance(result, BaseException):
                    self._keep(group, request_id, "undo")
            if failed is not None:
                if isinstance(failed, (RedisError, OSError)):
                    raise LimiterUnavailable(str(failed)) from failed
                raise failed
            return min(refused, key=lambda d: checks.index(d.check))  # type: ignore[arg-type]
        self._hold(checks, request_id)
        windows = [d for d in found if isinstance(d, Decision) and d.check is not None]
        return min(windows, key=lambda d: d.remaining) if windows else found[0]  # type: ignore[return-value]

    async def finish(self, checks: list[Check], request_id: str, tokens: int | None) -> None:
        self._let_go(checks, request_id)
        pending = [c for c in checks if c.kind is Kind.CONCURRENT or (c.kind is Kind.TOKENS and tokens is not None)]
        if not pending:
            return
        spent = "" if tokens is None else str(tokens)
        try:
            await self._settle(pending, request_id, spent)
        except (RedisError, OSError, LimiterUnavailable) as exc:
            self._keep(pending, request_id, spent)
            raise LimiterUnavailable(str(exc)) from exc

    def finish_later(self, checks: list[Check], request_id: str, tokens: int | None) -> None:
        self._let_go(checks, request_id)
        pending = [c for c in checks if c.kind is Kind.CONCURRENT or (c.kind is Kind.TOKENS and tokens is not None)]
        if pending:
            self._keep(pending, request_id, "" if tokens is None else str(tokens))

    def _hold(self, checks: Sequence[Check], request_id: str) -> None:
        for check in checks:
            if check.kind is Kind.CONCURRENT:
                self._heartbeat.hold(self._window(check), request_id)

    def _let_go(self, checks: Sequence[Check], request_id: str) -> None:
        """Before the release is sent: a renewal never races it, and one Redis could not take now
        (kept for later) leaves the lease to lapse within its life if it is never taken."""
        for check in checks:
            if check.kind is Kind.CONCURRENT:
                self._heartbeat.release(self._window(check), request_id)

    async def _renew(self, held: dict[str, list[str]]) -> list[tuple[str, str]]:
        """One heartbeat round: every lease set's call at once (off a Cluster, in one pipeline with
        whatever else is sent in this turn); the leases found gone."""
        calls = self._renewals(held)
        if self._by_slot:
            answers = await self._renew_on_cluster(calls)
        else:
            answers = await asyncio.gather(
                *(self._shared.calls.script(self._renewal, keys, args) for keys, args in calls)
            )
        gone = []
        for (keys, _), answer in zip(calls, answers):
            for at in range(0, len(answer), 2):
                request_id = answer[at + 1]
                gone.append(
                    (keys[int(answer[at]) - 1], request_id.decode() if isinstance(request_id, bytes) else request_id)
                )
        return gone

    def _renewals(self, held: dict[str, list[str]]) -> list[tuple[list[str], list[Any]]]:
        """The round's calls: at most _RENEW_BATCH leases each, and on a Cluster the sets of one slot."""
        by_slot: dict[int, list[str]] = {}
        for lease_set in held:
            by_slot.setdefault(key_slot(lease_set.encode()) if self._by_slot else 0, []).append(lease_set)
        calls: list[tuple[list[str], list[Any]]] = []
        for lease_sets in by_slot.values():
            keys: list[str] = []
            args: list[Any] = [self._lease_ms]
            for lease_set in lease_sets:
                ids = held[lease_set]
                for start in range(0, len(ids), _RENEW_BATCH):
                    part = ids[start : start + _RENEW_BATCH]
                    if keys and len(args) - 1 - len(keys) + len(part) > _RENEW_BATCH:
                        calls.append((keys, args))
                        keys, args = [], [self._lease_ms]
                    keys.append(lease_set)
                    args += [len(part), *part]
            if keys:
                calls.append((keys, args))
        return calls

    async def _renew_on_cluster(self, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """One pipeline, which the cluster client splits by node: a round trip per node, not per
        set. A renewal may run twice (it only pushes expiries back), so calls a node answers
        with NOSCRIPT (restarted, or failed over) are sent again once the script is loaded."""
        client = self._shared.client

        async def send(batch: list[tuple[list[str], list[Any]]]) -> list[Any]:
            async with client.gate, client.pipeline() as pipe:
                for keys, args in batch:
                    pipe.execute_command("EVALSHA", self._renewal.sha, len(keys), *keys, *args)
                return await pipe.execute(raise_on_error=False)

        answers = await send(calls)
        lost = [i for i, answer in enumerate(answers) if isinstance(answer, NoScriptError)]
        if lost:
            await client.script_load(RENEW)  # on every primary
            for i, answer in zip(lost, await send([calls[i] for i in lost])):
                answers[i] = answer
        failed = next((a for a in answers if isinstance(a, Exception)), None)
        if failed is not None:
            raise failed
        return answers

    async def _settle(self, checks: list[Check], request_id: str, spent: str) -> None:
        groups = self._groups(checks)
        if len(groups) == 1:  # sent in this turn, with whatever else the request writes now
            await self._call_finish(groups[0], request_id, spent)
        else:
            await asyncio.gather(*(self._call_finish(g, request_id, spent) for g in groups))

    def _keep(self, checks: Sequence[Check], request_id: str, spent: str) -> None:
        """A settlement or give-back Redis could not take now, tried again every second while this
        limiter lives: a stream that ended during a blip, or a check that timed out but ran, would
        otherwise hold its lease (a slot of the key's concurrency) until it lapses. Sending one
        twice is harmless: a settlement sets a request's amount, a lease goes once, and a
        give-back's mark stops a check that comes later. At most _MAX_UNSETTLED wait; past that
        the oldest are left to lapse."""
        self._unsettled[(request_id, checks[0].key)] = (checks, spent)
        while len(self._unsettled) > _MAX_UNSETTLED:
            self._unsettled.popitem(last=False)
        if self._resettling is None or self._resettling.done():
            self._resettling = asyncio.get_running_loop().create_task(self._settle_later(), name="limits unsettled")

    async def _settle_later(self) -> None:
        while self._unsettled:
            await asyncio.sleep(_RETRY_S)
            if await self._settle_kept():
                log.info("rate-limit state back: every settlement left over is made")

    async def _settle_kept(self) -> bool:
        """Send the kept ones, oldest first; True when none is left. One that fails goes last
        and the round ends (Redis is away, or its node is: the others get their turn next round)."""
        while self._unsettled:
            place, (checks, spent) = next(iter(self._unsettled.items()))
            try:
                await self._settle(list(checks), place[0], spent)
            except (ResponseError, DataError) as exc:  # refused by Redis or unsendable: trying again would not help
                log.warning("a settlement Redis refused is left to lapse: %s", exc)
            except (RedisError, OSError, LimiterUnavailable):
                self._unsettled.move_to_end(place)
                return False
            self._unsettled.pop(place, None)
        return True

    async def close(self) -> None:
        """No more renewals (a reload closes the limiter after its last request, so none of its
        leases is still in use); one last try (within a second) for what is kept; a reload or
        shutdown during an outage leaves the rest to lapse, and says so."""
        await self._heartbeat.close()
        if self._resettling is not None:
            self._resettling.cancel()
        if self._unsettled:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_RETRY_S):
                    while not await self._settle_kept():
                        await asyncio.sleep(0.1)
        if self._unsettled:
            log.error(
                "stopping with settlements Redis never took: their leases lapse within %g s",
                self._lease_ms / 1000,
                extra={"pending": len(self._unsettled)},
            )
        shared, self._shared = self._shared, None  # type: ignore[assignment]
        if shared is not None:
            await unshare(shared)

    async def _acquire_group(self, checks: Sequence[Check], request_id: str) -> Decision:
        args: list[Any] = [request_id, self._lease_ms]
        for check in checks:
            args += [check.kind.value, check.limit, int(check.window_s * 1000), check.cost]
        allowed, index, value, reset = await self._run(self._acquire, self._keys(checks, request_id), args)
        check = checks[index - 1] if index else None
        if not allowed:
            return Decision(False, check, 0, value / 1000, value / 1000)
        return Decision(True, check, max(0, int(value)), 0.0, max(0, reset) / 1000)

    async def _call_finish(self, checks: Sequence[Check], request_id: str, spent: str) -> None:
        await self._run(
            self._finish, self._keys(checks, request_id), [request_id, spent, *(c.kind.value for c in checks)]
        )

    async def _run(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return await answer_within(self._shared.calls.script(script, keys, args), self._wait_s)
        except TimeoutError as exc:
            raise LimiterUnavailable(f"no answer within {self._wait_s}s") from exc

    def _keys(self, checks: Sequence[Check], request_id: str) -> list[str]:
        """Each check's keys, then the request's give-back mark (in the first check's slot)."""
        keys = []
        mark = f"{self._prefix}undone:{request_id}"
        for check in checks:
            window = self._window(check)
            if self._by_slot and not keys:
                mark = f"{self._prefix}{{{_subject(check)}}}:undone:{request_id}"
            keys += (window, window + ":h", window + ":t") if check.kind is Kind.TOKENS else (window,)
        return [*keys, mark]

    def _window(self, check: Check) -> str:
        """The check's sorted set: its window, or its lease set."""
        if not self._by_slot:
            return self._prefix + check.key
        subject = _subject(check)  # a subject's keys in one slot: {key:demo}:rpm
        return f"{self._prefix}{{{subject}}}{check.key[len(subject) :]}"

    def _groups(self, checks: list[Check]) -> list[list[Check]]:
        """The checks one script call may take together: all of them, except on a Cluster, where
        only those whose keys share a slot."""
        if not self._by_slot or len(checks) == 1:
            return [checks]
        by_slot: dict[int, list[Check]] = {}
        for check in checks:
            by_slot.setdefault(key_slot(self._keys([check], "")[0].encode()), []).append(check)
        return list(by_slot.values())


def _subject(check: Check) -> str:
    """What a check's keys are tagged with on a Cluster: its subject, or its own key when it names none."""
    return check.subject if check.subject and check.key.startswith(check.subject) else check.key
