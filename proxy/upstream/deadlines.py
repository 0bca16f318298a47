"""`Deadlines`: one timer for all the waitings of a pool that are waiting on their upstream.

A timer per request (first byte) and per stream read (idle gap) would be created and
cancelled thousands of times a second, almost never firing. Instead a waiting waiting
records when it gives up, and a single timer is set for the earliest of those times; a
wait that ends early just drops its entry. Timeouts fire on time, not on a coarse tick.
"""

from __future__ import annotations

import asyncio
from math import inf
from typing import Protocol


class Waiting(Protocol):
    def timed_out(self) -> None: ...


class Deadlines:
    """When each waiting waiting gives up; its `timed_out` is called at that time."""

    __slots__ = ("_due", "_timer", "_timer_at")

    def __init__(self) -> None:
        self._due: dict[Waiting, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = inf

    def watch(self, waiting: Waiting, at: float) -> None:
        self._due[waiting] = at
        if at < self._timer_at:
            self._set_timer(at)

    def unwatch(self, waiting: Waiting) -> None:
        self._due.pop(waiting, None)

    def close(self) -> None:
        self._due.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, inf

    def _set_timer(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_at = None, inf
        now = asyncio.get_running_loop().time()
        now += 0.001  # the loop may run a timer a hair early
        late = [waiting for waiting, at in self._due.items() if at <= now]
        for waiting in late:
            del self._due[waiting]
            waiting.timed_out()
        if self._due:
            self._set_timer(min(self._due.values()))
