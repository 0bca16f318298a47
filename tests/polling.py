"""Waiting for what a test waits on: poll it, never sleep a guessed time."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def within(
    seconds: float, check: Callable[[], bool | Awaitable[bool]], what: str = "", every: float = 0.02
) -> float:
    """How long `check()` (true or false, or an awaitable of either) took to come true, asked
    every `every` seconds; fails, naming `what`, once `seconds` have passed."""
    start = time.monotonic()
    while True:
        found = check()
        if inspect.isawaitable(found):
            found = await found
        if found:
            return time.monotonic() - start
        if time.monotonic() - start > seconds:
            raise AssertionError(f"not within {seconds} s: {what or 'the awaited condition'}")
        await asyncio.sleep(every)
