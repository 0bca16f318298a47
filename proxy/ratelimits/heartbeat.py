"""Leases owned by live processes: each process renews the leases it holds, so a dead one's lapse in seconds.

A concurrency lease in Redis is its request's gateway id (whose first half names the process
that made it, proxy/request/gateway.py) scored by when it lapses: LEASE_LIFE_S after it was
taken or last renewed. While a process lives, its limiter renews every RENEW_EVERY_S the leases
it holds and has not released; a process that dies (kill -9, a lost machine) stops renewing, and
its leases drop out of the count at the next check of their key, which removes lapsed leases
anyway: no scan of other keys, no registry of processes. Taking and releasing a lease add no
round trip: the heartbeat only notes them, and a round of renewals is one pipeline to Redis (one
per node on a Cluster) for all the leases a process holds, whatever their number.

The life leaves a margin for a process that is alive but late: a round that fails (Redis away,
or slower than a round) or an event loop stalled by up to LEASE_LIFE_S - RENEW_EVERY_S (4.5 s)
loses nothing. Past that, the process's leases lapse while their requests run, and for the rest
of those requests the key may run more than its limit at once; the next round finds them gone
(they are never put back, so a lease a release removed meanwhile never returns) and says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("modelgate.ratelimit")

LEASE_LIFE_S = 6.0  # a dead holder's leases count at most this long: well inside the 10 s the issue allows
RENEW_EVERY_S = 1.5  # three rounds may fail or come late before a live holder's leases lapse

# Renews the leases it is given ({lease set: request ids}); answers those no longer there.
Renew = Callable[[dict[str, list[str]]], Awaitable[list[tuple[str, str]]]]


class Heartbeat:
    """The leases this process holds and has not released, by lease set, renewed while any is held."""

    def __init__(self, renew: Renew, life_s: float = LEASE_LIFE_S, every_s: float = RENEW_EVERY_S) -> None:
        self._renew = renew
        self._life_s = life_s
        self._every_s = every_s
        self._held: dict[str, set[str]] = {}
        self._beating: asyncio.Task[None] | None = None
        self._failing = False

    @property
    def held(self) -> dict[str, set[str]]:
        return self._held

    def hold(self, lease_set: str, request_id: str) -> None:
        """A lease taken: renewed from the next round on (the first round starts now if none runs)."""
        self._held.setdefault(lease_set, set()).add(request_id)
        if self._beating is None or self._beating.done():
            self._beating = asyncio.get_running_loop().create_task(self._beat(), name="limits lease heartbeat")

    def release(self, lease_set: str, request_id: str) -> None:
        """A lease released, or given up to a release kept for later: never renewed again."""
        members = self._held.get(lease_set)
        if members is not None:
            members.discard(request_id)
            if not members:
                del self._held[lease_set]

    async def _beat(self) -> None:
        while self._held:  # idle, no task runs; the next lease taken starts one
            await asyncio.sleep(self._every_s)
            await self.renew_once()

    async def renew_once(self) -> None:
        """One round; never raises (a round that fails is the next one's to make up)."""
        held = {lease_set: list(members) for lease_set, members in self._held.items()}
        if not held:
            return
        try:
            async with asyncio.timeout(self._every_s):  # a slow Redis does not stretch the rounds apart
                gone = await self._renew(held)
        except Exception as exc:
            if not self._failing:
                self._failing = True
                log.warning(
                    "could not renew concurrency leases (tried again every %g s; they lapse after "
                    "%g s without renewal): %s",
                    self._every_s,
                    self._life_s,
                    exc or type(exc).__name__,
                )
            return
        if self._failing:
            self._failing = False
            log.info("concurrency leases renewed again")
        lapsed = [(s, r) for s, r in gone if r in self._held.get(s, ())]  # not those released meanwhile
        for lease_set, request_id in lapsed:
            self.release(lease_set, request_id)
        if lapsed:
            log.warning(
                "concurrency leases lapsed while their requests ran (renewals failed or came late for "
                "%g s): their keys may run more than their limit at once until those requests end",
                self._life_s,
                extra={"lapsed": len(lapsed)},
            )

    async def close(self) -> None:
        """No more rounds: what is still held lapses within the lease's life."""
        beating, self._beating = self._beating, None
        if beating is not None:
            beating.cancel()
            await asyncio.gather(beating, return_exceptions=True)
        if self._held:
            log.warning(
                "stopping with concurrency leases held: they lapse within %g s",
                self._life_s,
                extra={"held": sum(len(m) for m in self._held.values())},
            )
        self._held.clear()
