"""`StoreProbe`: whether the shared state store answers, asked in the background and remembered, so
`/readyz` answers at once whatever the store does (a hung Redis held each probe for its 2 s socket
timeout, past a load balancer's probe timeout).

The answer is a detail of readiness, not its verdict: every instance shares the store, and taking
them all out of rotation at once turns a degraded gateway (follow-ups refused with a retryable 503,
pins kept locally) into no gateway. Plugins that cannot serve without it say so themselves
(`Plugin.unready`), and `modelgate_state_store_up` and its alert tell the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from proxy.observability.metrics import STATE_STORE_UP
from proxy.state import StateStore

log = logging.getLogger("modelgate.readiness")

INTERVAL_S = 1.0


class StoreProbe:
    __slots__ = ("_store", "_timeout_s", "ok", "since", "_task")

    def __init__(self, store: StateStore, timeout_s: float = 0.5) -> None:
        self._store = store
        self._timeout_s = timeout_s  # state.check_timeout_s: a store slower than a check waits is away
        self.ok = True
        self.since = time.monotonic()  # when `ok` last changed
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="state store probe")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def check(self) -> bool:
        why = "it did not answer"
        try:
            ok = await asyncio.wait_for(self._store.ping(), self._timeout_s)
        except TimeoutError:
            ok, why = False, f"no answer within {self._timeout_s} s"
        except Exception as exc:  # whatever the client raises, the probe goes on: it is readiness's only source
            ok, why = False, f"{type(exc).__name__}: {exc}"
        if ok != self.ok:
            self.ok, self.since = ok, time.monotonic()
            if ok:
                log.info("state store reachable again")
            else:
                log.error("state store unreachable (%s)", why)
        STATE_STORE_UP.set(1 if ok else 0)
        return ok

    async def _run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(INTERVAL_S)
