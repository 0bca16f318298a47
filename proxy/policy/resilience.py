"""`ChannelHealth`: whether a channel is in rotation — its circuit breaker and its active
health check's verdict.

The forwarder feeds the breaker with each attempt's outcome (the relay too, for an answer that
breaks after its head; the webhook deliverer for its callbacks); channel selection, `/readyz` and
the metrics only read it. The breaker opens after `failures_to_open` failures in a row and stays
open `open_s` (a failure every request would meet alike opens it at once); then one request goes
as a probe (half-open) and its outcome closes the breaker or opens it again. A probe that never
reports back (its client left) lapses after PROBE_LAPSE_S. The clock is injected, so tests step
it instead of sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable

PROBE_LAPSE_S = 30.0


class ChannelHealth:
    __slots__ = ("failures_to_open", "open_s", "clock", "failures", "open_until", "probing", "down")

    def __init__(
        self, failures_to_open: int = 5, open_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures_to_open = failures_to_open
        self.open_s = open_s
        self.clock = clock
        self.failures = 0  # attempts failed in a row
        self.open_until = 0.0  # the breaker is open until then (the clock's time; 0: closed)
        self.probing = 0.0  # half-open: when the probe left (0: none)
        self.down = False  # taken out of rotation by the active health check

    def available(self) -> bool:
        """Closed breaker, or an open one whose pause is over and whose single probe is free;
        never while the active health check holds the channel down."""
        if self.down:
            return False
        if self.open_until == 0.0:
            return True
        now = self.clock()
        return now >= self.open_until and (not self.probing or now - self.probing > PROBE_LAPSE_S)

    def chosen(self) -> None:
        """A request goes to this channel: while the breaker is open, it is the probe."""
        if self.open_until:
            self.probing = self.clock()

    def record(self, failure: bool, at_once: bool = False) -> None:
        """An attempt's outcome: a failure of the channel's (`failure`), or not. `at_once`: a
        failure every request would meet alike (the upstream refusing the channel's credential),
        which opens the breaker without waiting for `failures_to_open` of them."""
        self.probing = 0.0
        if not failure:
            self.failures, self.open_until = 0, 0.0
            return
        self.failures += 1
        if at_once or self.failures >= self.failures_to_open or self.open_until:
            self.open_until = self.clock() + self.open_s  # opens, or a failed probe opens it again

    def checked(self, healthy: bool) -> None:
        """The active health check's verdict; a healthy one closes the breaker too."""
        if healthy and self.down:
            self.failures, self.open_until = 0, 0.0
        self.down = not healthy

    @property
    def is_open(self) -> bool:
        return self.open_until != 0.0

    @property
    def up(self) -> bool:
        return not self.down and not self.is_open

    def state(self) -> tuple[str, float]:
        """`closed`, `open` or `half_open`, and the seconds until an open one takes a probe."""
        if not self.is_open:
            return "closed", 0.0
        left = self.open_until - self.clock()
        return ("half_open", 0.0) if left <= 0 else ("open", left)
