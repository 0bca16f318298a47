"""Active health checks: channels with `health_check` are probed on a timer, apart from traffic.

Passive breakers learn of an outage only by failing requests; a probe learns of it first, and
learns of the recovery without risking a client's request. A channel taken down by its probe
is passed over like one with an open breaker, and `modelgate_channel_up` shows 0 for it.
"""

from __future__ import annotations

import asyncio
import logging

from proxy.config.model import HealthCheck
from proxy.observability import metrics as m
from proxy.policy.channels import Channel
from proxy.upstream import PoolExhausted, UpstreamError

log = logging.getLogger("modelgate.health")


class ChannelProbe:
    """The health of one channel as its probes see it: counts in a row, and the verdict."""

    __slots__ = ("channel", "check", "failures", "successes")

    def __init__(self, channel: Channel, check: HealthCheck) -> None:
        self.channel = channel
        self.check = check
        self.failures = 0
        self.successes = 0

    async def probe(self) -> None:
        ok, detail = await self._ask()
        if ok is None:
            return  # the channel's own pool is full: the gateway's limit says nothing of the upstream
        if ok:
            self.failures, self.successes = 0, self.successes + 1
            if self.channel.health.down and self.successes >= self.check.healthy_after:
                self.channel.health.checked(healthy=True)  # closes the breaker too
                log.info("channel back in rotation", extra={"channel": self.channel.name})
        else:
            self.successes, self.failures = 0, self.failures + 1
            if not self.channel.health.down and self.failures >= self.check.unhealthy_after:
                self.channel.health.checked(healthy=False)
                log.warning(
                    "channel out of rotation: its health check fails",
                    extra={"channel": self.channel.name, "detail": detail},
                )
        m.channel_up(self.channel.name, self.channel.health.up)

    async def _ask(self) -> tuple[bool | None, str]:
        pool = self.channel.pool
        if pool is None:
            return False, "channel closed"
        try:
            answer = await pool.request("GET", self.check.path, self.check.headers, total_s=self.check.timeout_s)
            try:
                await answer.read(limit=1024 * 1024)
            finally:
                answer.release()
        except PoolExhausted:
            return None, "the pool is full"
        except (UpstreamError, ValueError) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return answer.status in self.check.expect_status, f"status {answer.status}"


class HealthChecks:
    """One task per checked channel, for the life of the config that defines them."""

    __slots__ = ("probes", "_tasks")

    def __init__(self, channels: list[Channel]) -> None:
        self.probes = [ChannelProbe(c, c.config.health_check) for c in channels if c.config.health_check is not None]
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._every(probe), name=f"health check {probe.channel.name}") for probe in self.probes
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    @staticmethod
    async def _every(probe: ChannelProbe) -> None:
        while True:
            try:
                await probe.probe()
            except Exception:  # a probe must never end the checking
                log.exception("health check failed to run", extra={"channel": probe.channel.name})
            await asyncio.sleep(probe.check.interval_s)
