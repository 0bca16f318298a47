"""Spending a budget could not count when it happened: requests served while the state store was
away (`plugins.budget.fail: open`), counted once it answers again, so a subject's counter comes to
hold what its ledger rows hold. Kept in this process, at most `most` of them (the oldest go first,
and the log says so), tried every second until the store takes them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence

from plugins.budget.counters import Counters, CountersUnavailable, Window

log = logging.getLogger("modelgate.budget")

_RETRY_S = 1.0


class LateCounts:
    def __init__(self, counters: Counters, most: int = 10_000) -> None:
        self._counters = counters
        self._waiting: deque[tuple[Sequence[Window], Sequence[float]]] = deque()
        self._most = most
        self._task: asyncio.Task[None] | None = None
        self._dropped = 0

    def count(self, windows: Sequence[Window], amounts: Sequence[float]) -> None:
        """Count `amounts` in `windows` as soon as the store takes them (never waited on)."""
        if not any(amounts):
            return
        self._waiting.append((windows, amounts))
        if len(self._waiting) > self._most:
            self._waiting.popleft()
            self._dropped += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="budget late counts")

    async def _run(self) -> None:
        while self._waiting:
            if not await self._add_waiting():
                await asyncio.sleep(_RETRY_S)
        if self._dropped:
            log.error(
                "budgets: %d requests served while the state store was away were never counted in their "
                "counters (more were waiting than are kept)",
                self._dropped,
            )
            self._dropped = 0
        log.info("budgets: what was served while the state store was away is counted")

    async def _add_waiting(self) -> bool:
        """Add what waits, oldest first; False when the store does not take it yet."""
        while self._waiting:
            windows, amounts = self._waiting[0]
            try:
                await self._counters.add(windows, amounts)
            except CountersUnavailable:
                return False
            self._waiting.popleft()
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._waiting:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_RETRY_S):
                    await self._add_waiting()
        if self._waiting:
            log.error(
                "budgets: stopping with %d requests served while the state store was away not counted",
                len(self._waiting),
            )
