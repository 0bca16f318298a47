"""`Outcome`: what became of one exchange."""

from __future__ import annotations

import time


class Outcome:
    """What became of one exchange, read by the access line, metrics, traces and `on_complete`
    hooks. Changed only through the methods below, each saying one thing that happened (which
    modules call each, tests/test_architecture.py lists): the attributes are for reading. Its
    time is four parts: upstream (every attempt's), failover backoff, pool wait, and the rest,
    the gateway's own (`Exchange.overhead_seconds`)."""

    __slots__ = (
        "status",
        "streamed",
        "bytes_out",
        "events",
        "error",
        "error_code",
        "client_aborted",
        "cut_by",
        "attempts",
        "upstream_started",
        "upstream_headers_at",
        "upstream_status",
        "upstream_finished",
        "upstream_before_s",
        "backoff_s",
        "pool_wait_s",
        "response_id",
        "whole",
    )

    def __init__(self) -> None:
        self.status = 0
        self.streamed = False  # the answer went out as an event stream
        self.bytes_out = 0
        self.events = 0  # stream events that reached the client (streams framed event by event)
        self.error: str | None = None
        self.error_code: str | None = None  # the code of an error answer the gateway made itself
        self.client_aborted = False
        # Who ended an answer before its end, once the upstream had the request: "client" (it
        # left), "upstream" (it broke off or stalled), "gateway" (a drain, or a fault of its own).
        self.cut_by: str | None = None
        self.attempts = 0  # upstream attempts made (a failover's each, a resend's each)
        # The current (or last) attempt, from the moment a connection was had; the attempts before
        # it add their upstream time to `upstream_before_s`.
        self.upstream_started: float | None = None
        self.upstream_headers_at: float | None = None
        self.upstream_status = 0  # what the current attempt's upstream answered (0: no head came)
        self.upstream_finished: float | None = None
        self.upstream_before_s = 0.0
        self.backoff_s = 0.0  # paused between attempts (resilience.backoff_s, doubling)
        self.pool_wait_s = 0.0  # waited for a connection a channel's pool may open (pool.max_connections)
        self.response_id: str | None = None  # the upstream's id for its answer ("": looked for, none given)
        self.whole = False  # a stream's answer is all in: only its closing counts may follow

    def answered(self, status: int, size: int | None = None) -> None:
        """The client's answer has this status (and, sent whole, this many body bytes)."""
        self.status = status
        if size is not None:
            self.bytes_out = size

    def sent(self, size: int) -> None:
        """More of the answer's body went to the client."""
        self.bytes_out += size

    def stream_began(self) -> None:
        """The answer goes out as an event stream."""
        self.streamed = True

    def events_sent(self, count: int) -> None:
        """So many stream events have reached the client, all told."""
        self.events = count

    def failed(self, message: str, code: str | None = None) -> None:
        """What went wrong, as the answer (or the access line) says it."""
        self.error, self.error_code = message, code

    def answer_whole(self) -> None:
        """A stream's answer is all in, and only its closing counts may follow (a chat stream's
        finish, before its usage chunk): what follows goes with the stream's end, as the closing
        counts do, so a client cannot take the whole answer and leave before they come."""
        self.whole = True

    def identified(self, response_id: str | None) -> None:
        """The upstream's id for its answer (a message's, a response's), None when it gave none."""
        self.response_id = response_id[:200] if response_id else ""

    def cut(self, by: str) -> None:
        """The answer ended before its end, once the upstream had the request: by "client",
        "upstream" or "gateway". The upstream's time ends here, not at its answer's head."""
        self.cut_by = by
        self._upstream_stopped()

    def client_gone(self) -> None:
        """The client left (or stopped reading) before the answer's end."""
        self.client_aborted = True
        self.cut_by = self.cut_by or "client"
        self._upstream_stopped()

    def abandoned(self, by_drain: bool) -> None:
        """The handler was cancelled: the client went away, or (`by_drain`) a drain past its cut
        point stopped it. With no answer yet, the status is 499, as nginx logs such a client."""
        self.client_aborted = not by_drain
        if self.upstream_started is not None and self.cut_by is None:
            self.cut_by = "gateway" if by_drain else "client"
        self._upstream_stopped()
        if self.status == 0:
            self.status = 499

    def attempt_started(self, now: float) -> None:
        """An upstream attempt begins: the ones before it keep their upstream time."""
        if self.upstream_started is not None:
            self.upstream_before_s = self.upstream_seconds()  # the last one ended (attempt_ended)
            self.upstream_headers_at = self.upstream_finished = None
        self.upstream_started = now
        self.upstream_status = 0
        self.attempts += 1

    def attempt_ended(self, now: float) -> None:
        """An attempt that goes no further (another channel is tried next): its upstream time
        ends here, not while the pause before the next one runs."""
        if self.upstream_started is not None and self.upstream_finished is None:
            self.upstream_finished = now

    def headers_arrived(self, now: float, status: int) -> None:
        """The current attempt's answer head came, with this status."""
        self.upstream_headers_at = now
        self.upstream_status = status

    def upstream_done(self, now: float) -> None:
        """The upstream's answer ended (its last byte read, or the attempt given up)."""
        self.upstream_finished = now

    def paused(self, seconds: float) -> None:
        """A pause between attempts (resilience.backoff_s) lasted this long."""
        self.backoff_s += seconds

    def pool_waited(self, seconds: float) -> None:
        """The current attempt waited this long for a connection slot before any upstream work."""
        self.pool_wait_s += seconds
        if self.upstream_started is not None:
            self.upstream_started += seconds

    def _upstream_stopped(self) -> None:
        if self.upstream_started is not None and self.upstream_finished is None:
            self.upstream_finished = time.perf_counter()

    def upstream_seconds(self) -> float:
        """Time spent on upstreams, every attempt's together."""
        if self.upstream_started is None:
            return self.upstream_before_s
        end = self.upstream_finished or self.upstream_headers_at or time.perf_counter()
        return self.upstream_before_s + end - self.upstream_started
