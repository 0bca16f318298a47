"""The limiter in process memory: exact, for one gateway process."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from proxy.ratelimits import Check, Decision, Kind

# No other process shares these leases, and they die with this one: a lease is released when its
# request ends, and this long life only bounds one whose release never came.
_LEASE_S = 1800.0


class _Window:
    """Entries (request id -> (time, amount)) in time order, with their running total."""

    __slots__ = ("entries", "total", "last_used")

    def __init__(self) -> None:
        self.entries: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self.total = 0
        self.last_used = 0.0

    def expire(self, before: float) -> None:
        while self.entries:
            rid, (at, amount) = next(iter(self.entries.items()))
            if at > before:
                break
            del self.entries[rid]
            self.total -= amount

    def free_at(self, needed: int, limit: int, window_s: float) -> float:
        """When enough of the window has expired for `needed` more to fit."""
        excess = self.total + needed - limit
        for at, amount in self.entries.values():
            excess -= amount
            if excess <= 0:
                return at + window_s
        return time.monotonic() + window_s


class MemoryLimiter:
    _SWEEP_EVERY = 4096

    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}
        self._since_sweep = 0
        self._finishing: set[asyncio.Task[None]] = set()

    async def acquire(self, checks: list[Check], request_id: str) -> Decision:
        now = time.monotonic()
        self._since_sweep += 1
        if self._since_sweep >= self._SWEEP_EVERY:
            self._sweep(now)
        tightest: Decision | None = None
        for check in checks:
            window = self._windows.setdefault(check.key, _Window())
            window.last_used = now
            window.expire(now if check.kind is Kind.CONCURRENT else now - check.window_s)
            amount = check.cost if check.kind is Kind.TOKENS else 1
            remaining = check.limit - window.total - amount
            if remaining < 0:
                if check.kind is Kind.CONCURRENT:
                    retry = 1.0
                else:
                    retry = max(0.0, window.free_at(amount, check.limit, check.window_s) - now)
                return Decision(False, check, 0, retry, retry)
            reset = (
                (next(iter(window.entries.values()))[0] + check.window_s - now) if window.entries else check.window_s
            )
            if check.kind is not Kind.CONCURRENT and (tightest is None or remaining < tightest.remaining):
                tightest = Decision(True, check, remaining, 0.0, max(0.0, reset))
        for check in checks:
            window = self._windows[check.key]
            at = now + _LEASE_S if check.kind is Kind.CONCURRENT else now
            amount = check.cost if check.kind is Kind.TOKENS else 1
            window.entries[request_id] = (at, amount)
            window.total += amount
        return tightest or Decision(True)

    def finish_later(self, checks: list[Check], request_id: str, tokens: int | None) -> None:
        task = asyncio.get_running_loop().create_task(self.finish(checks, request_id, tokens))  # never away
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def finish(self, checks: list[Check], request_id: str, tokens: int | None) -> None:
        for check in checks:
            window = self._windows.get(check.key)
            if window is None or request_id not in window.entries:
                continue  # already out of the window: nothing left to correct
            if check.kind is Kind.CONCURRENT:
                window.total -= window.entries.pop(request_id)[1]
            elif check.kind is Kind.TOKENS and tokens is not None:
                at, reserved = window.entries[request_id]
                window.entries[request_id] = (at, tokens)
                window.total += tokens - reserved

    async def close(self) -> None:
        self._windows.clear()

    def _sweep(self, now: float) -> None:
        """Forget windows idle for longer than anything in them can live (one per client IP
        would otherwise pile up)."""
        self._since_sweep = 0
        idle = [key for key, window in self._windows.items() if window.last_used < now - _LEASE_S]
        for key in idle:
            del self._windows[key]
