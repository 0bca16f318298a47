"""`Admission`: how many requests one worker serves at once, and what the others are told.

A request past the bound is answered at once with a 503 in its endpoint's shape, code
`overloaded` and `Retry-After: 1`, decided from its head before a byte of its body is read (so a
refusal costs the worker little), and counted in `modelgate_requests_shed_total`. Only the
interface's endpoints are admitted this way: `/healthz`, `/readyz` and `/metrics` never are, so a
load balancer and Prometheus see an overloaded worker as it is.

The bound is `server.max_in_flight`. A number fixes it. `auto`, the default, derives it from what
the worker can do, measured as it runs: every PROBE_S a timer notes how late the event loop ran
it. That delay is the worker's own queue (every step of every request waits that long for the
CPU), and it grows with the worker's own load only, never with a slow upstream or a slow client.
At the end of each window (WINDOW_S, and at least MIN_PROBES probes, so one stall of the loop is
not taken for a load) the bound moves on the window's median delay, as a congestion window moves
on a delay signal (TCP Vegas; Netflix's concurrency-limits):

- over `server.max_loop_delay_ms`: cut to the requests in flight times target/delay (kept
  between 0.5 and 0.9), so it bites at once however high it had grown (unless fewer than
  MIN_LIMIT are in flight: then they are not what holds the loop up);
- under half of it, while the bound was used (a request refused, or 90% of it in flight):
  doubled, so a worker with CPU to spare does not go on refusing;
- in between, while used: one more.

A bound on requests in flight cannot help when each request is short: the worker may have a
handful in flight and still fall behind, what it has not read yet waiting in the kernel (in the
sockets' buffers, then in the listening socket's queues, where a client's connection waits for
its SYN to be retried, seconds). So when the loop runs late with fewer than MIN_LIMIT in flight
and at least MIN_LIMIT requests arrived in the window (the requests are what holds it up, not a
pause of the loop's own), `auto` also admits only a share of the requests that arrive, spread
evenly (the others are refused as past the bound): cut as the bound is (target/delay, kept
between 0.5 and 0.9), never below MIN_SHARE; a quarter more each window the loop keeps under half
its target. While it sheds so, a request that arrives when the probe's timer is overdue by more
than the target (the loop is that late now, not only on the window's median) is admitted at
MIN_SHARE: the backlog is cleared by refusing, not by waiting a window. (Not before a window has
cut the share: a single pause of the loop, a collection or a large body parsed, would then refuse
the burst that arrived during it.) A refusal while shedding is decided on the connection as the
request's head is parsed, at a fraction of what one through the web framework costs
(proxy/process/shedding.py).

The loop's delay shows a queue once it has formed; the CPU's busy share shows one forming. So
every CUT_S `auto` also reads the CPU time the loop's thread used against what the worker may
use (proxy/process/cpu.py: one core, less under a CPU quota or with workers sharing cores). Past
`server.max_cpu_busy`, with at least MIN_CUT_ARRIVALS requests arriving meanwhile to account for
it, and the loop a fifth of its target late at two readings running (BEHIND: busy and falling
behind, not only busy, nor held up once), the admitted share is cut by target/busy (to no less
than half), or halved when the CPU is SATURATED (what is asked of it is then unknown). It
regrows while the CPU keeps under _ROOM of its target and the loop under half of its; while the
CPU is busy but the loop keeps well up (under half of BEHIND), only slowly (_CREEP). Read this
often, not each window: at an overload's onset every window waited is a window of requests
queued. The first cut also needs the requests in flight climbing, or the loop FAR times as late:
a closed loop of clients (each waiting for its answer before it sends again) saturates a CPU with
no more in flight than it has clients, and on a slow machine runs its loop past BEHIND too.

It starts at `server.max_connections` (a connection carries one request at a time, so no more
can be in flight) and never rises above it, nor falls below MIN_LIMIT: a worker that keeps up
never refuses anything, whatever it holds.

Streams count as one request each for as long as they run, as a short call does. A stream
waiting on its upstream holds a slot but no CPU, so it adds nothing to the delay and the `auto`
bound grows past the streams held; what a stream does cost (an event relayed now and then)
shows in the delay like any other work. Weighing streams less would take a second bound and a
guess at the weight. A fixed `max_in_flight` must be sized for the streams a worker holds plus
its short calls.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import Callable

from aiohttp import web

from proxy.config.model import ServerConfig
from proxy.observability.metrics import CPU_BUSY, IN_FLIGHT_LIMIT, LOOP_DELAY
from proxy.process.cpu import WorkerCpu

log = logging.getLogger("modelgate.admission")

PROBE_S = 0.01  # the timer whose lateness is the delay; 100 wake-ups a second cost the worker nothing measurable
WINDOW_S = 0.1  # the bound moves at most this often: a few probes even when each is late
MIN_PROBES = 3
MIN_LIMIT = 16  # what an overloaded worker still admits: it serves some, rather than refusing all
MIN_SHARE = 0.05  # the least share of arriving requests `auto` admits, for the same reason
CUT_S = 0.03  # how often the CPU's busy share is read against `max_cpu_busy`: onset is where the wait grows
MIN_CUT_ARRIVALS = 5  # arrivals in that time for a busy CPU to be the requests' doing (5 in 30 ms: 170 a second)
SATURATED = 0.97  # busy past this, the CPU is saturated: what is asked of it is unknown, so the share halves
# ... and only while the loop runs this share of `max_loop_delay_ms` late: a CPU saturated by a
# fixed number of clients (each waiting for its answer before it sends again) queues no more than
# they are, and its loop keeps up (64 such clients: under 2 ms late; 256: 6-9 ms); a worker
# offered more than it serves falls further behind each turn.
BEHIND = 0.2
# ... and, before the first cut, a reading counts as behind only if the loop is FAR times that
# late, or the requests in flight have climbed past all of the last CLIMB_READINGS readings (a
# second's): a closed loop's own delay is its clients times a request's cost, so on a slower
# machine its tail reaches BEHIND (64 clients at 0.6 ms a request: p99 11 ms, at most 17), while
# it holds no more requests than it has clients. An open loop's onset is both: 10, 50, 18, 57 ms
# late, and 10, 37, 40, 54, 74 in flight (bench/RESULTS.md, "Overload: what the runs showed").
# Once shedding, BEHIND alone: the cuts themselves hold what is in flight level.
FAR = 2
CLIMB_READINGS = 33
_REGROW = 1.25  # the admitted share's growth a window, while the loop keeps under half its target
_ROOM = 0.85  # ... and the CPU under this share of `max_cpu_busy`
_CREEP = 1.05  # its growth a window while the CPU has no room but the loop keeps well up
RETRY_AFTER_S = 1  # a short wait: overload passes, or the balancer sends the retry elsewhere
_USED = 0.9  # the share of the bound in flight that counts as using it
_LOG_EVERY_S = 1.0


def admitted(request: web.BaseRequest) -> bool:
    """Whether this request was admitted on its connection as its head was parsed
    (proxy/process/shedding.py, counted in `Admission.waiting` until then); the mark is taken,
    so it answers once."""
    take = getattr(request.protocol, "take_admission", None)
    return take is not None and take()


class Admission:
    """The bound on requests in flight in this worker, and the probe that moves it (`auto`)."""

    __slots__ = (
        "limit",
        "share",
        "waiting",
        "auto",
        "ceiling",
        "target_s",
        "busy_target",
        "delay_s",
        "busy",
        "cpu",
        "_clock",
        "_window_start",
        "_delays",
        "_peak",
        "_refused",
        "_arrived",
        "_credit",
        "_due",
        "_unlogged",
        "_logged_at",
        "_timer",
        "_in_flight",
        "_used_at",
        "_cut_at",
        "_used_at_cut",
        "_arrived_at_cut",
        "_cut_from",
        "_behind",
        "_in_flight_seen",
    )

    def __init__(
        self, server: ServerConfig, clock: Callable[[], float] = time.perf_counter, cpu: WorkerCpu | None = None
    ) -> None:
        self._clock = clock
        self.cpu = cpu or WorkerCpu()
        self._window_start = self._cut_at = clock()
        self._used_at = self._used_at_cut = self.cpu.used()
        self._arrived_at_cut = 0
        self._cut_from = 0  # the first of `_delays` since the CPU was last read
        self._behind = 0  # readings of the CPU running that found the loop behind
        self._in_flight_seen: collections.deque[int] = collections.deque(maxlen=CLIMB_READINGS)  # at each reading
        self._delays: list[float] = []
        self._peak = 0  # the most requests in flight this window
        self._refused = 0  # refusals this window
        self._arrived = 0  # requests asked about this window
        self._credit = 0.0  # spreads the admitted share evenly: one admitted each time it reaches 1
        self._due = math.inf  # when the probe's timer is due to run next
        self._unlogged = 0  # refusals not yet in a log line
        self._logged_at = -math.inf
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: Callable[[], int] = lambda: 0
        self.delay_s = 0.0  # the last window's median delay
        self.busy = 0.0  # the share of its CPU the worker kept busy over the last window
        self.limit = 0.0
        self.share = 1.0  # the share of arriving requests admitted below the bound (`auto`)
        # Admitted on their connections and not yet handled (proxy/process/shedding.py): the
        # gateway counts a request in flight once its handler runs, a turn of the loop later.
        self.waiting = 0
        self.configure(server)

    def configure(self, server: ServerConfig) -> None:
        """Take the bound's settings: at start, and at each reload (an `auto` bound keeps what it learnt)."""
        self.auto = server.max_in_flight == "auto"
        self.ceiling = server.max_connections if server.max_in_flight == "auto" else server.max_in_flight
        self.target_s = server.max_loop_delay_ms / 1000
        self.busy_target = server.max_cpu_busy
        self.limit = min(self.limit, self.ceiling) if self.auto and self.limit else float(self.ceiling)
        if not self.auto:
            self.share = 1.0
        IN_FLIGHT_LIMIT.set(int(self.limit))

    def admits(self, in_flight: int) -> bool:
        """Whether a request that finds `in_flight` others being served may be served too."""
        self._arrived += 1
        share = self.share
        if share < 1.0 and self._clock() - self._due > self.target_s:
            share = MIN_SHARE  # already shedding, and the loop is that late now: next to nothing until it catches up
        if in_flight < self.limit and (share >= 1.0 or self._by_share(share)):
            if in_flight >= self._peak:
                self._peak = in_flight + 1
            return True
        self._refused += 1
        self._unlogged += 1
        now = self._clock()
        if now - self._logged_at >= _LOG_EVERY_S:
            # Refusals get no access line each (under overload that would be most of the work): one line a second.
            log.warning(
                "overloaded: refusing requests with 503",
                extra={
                    "refused": self._unlogged,
                    "in_flight": in_flight,
                    "max_in_flight": int(self.limit),
                    "admitted_share": round(self.share, 3),
                    "loop_delay_ms": round(self.delay_s * 1000, 1),
                    "cpu_busy": round(self.busy, 2),
                },
            )
            self._unlogged, self._logged_at = 0, now
        return False

    def _by_share(self, share: float) -> bool:
        self._credit += share
        if self._credit >= 1.0:
            self._credit -= 1.0
            return True
        return False

    def observe(self, delay_s: float, in_flight: int) -> None:
        """One probe's delay; at the end of a window the bound moves (`auto` only)."""
        self._delays.append(delay_s)
        now = self._clock()
        if now - self._cut_at >= CUT_S - PROBE_S / 2:  # at the probe nearest CUT_S
            self._check_busy(now, in_flight)
        if now - self._window_start < WINDOW_S or len(self._delays) < MIN_PROBES:
            return
        delays = sorted(self._delays)
        delay = self.delay_s = delays[len(delays) // 2]
        used = self.cpu.used()
        busy = self.busy = (used - self._used_at) / max(1e-9, now - self._window_start) / self.cpu.available()
        self._used_at = used
        before = int(self.limit)
        if self.auto:
            bound_used = self._refused > 0 or self._peak >= _USED * self.limit
            if delay > self.target_s:
                floor = min(MIN_LIMIT, self.ceiling)
                shrink = min(0.9, max(0.5, self.target_s / delay))
                if in_flight >= floor:
                    self.limit = max(float(floor), min(self.limit, in_flight) * shrink)
                elif self._arrived >= MIN_LIMIT:  # short requests, too many of them
                    self.share = max(MIN_SHARE, self.share * shrink)
            else:
                if bound_used:
                    grown = self.limit * 2 if delay < self.target_s / 2 else self.limit + 1
                    self.limit = min(float(self.ceiling), grown)
                if self.share < 1.0 and delay < self.target_s / 2:
                    if busy < _ROOM * self.busy_target:
                        self.share = min(1.0, self.share * _REGROW)
                    elif delay < self.target_s * BEHIND / 2:
                        # Busy, but keeping up: a closed loop of clients saturating the CPU, or an
                        # overload held just below where it queues. Grown back slowly, so a cut made
                        # by one stall (a collection, a burst of keys made live) does not last as
                        # long as the load, while an overload it holds comes back only a little.
                        self.share = min(1.0, self.share * _CREEP)
        LOOP_DELAY.set(delay)
        CPU_BUSY.set(busy)
        if int(self.limit) != before:
            IN_FLIGHT_LIMIT.set(int(self.limit))
        self._delays.clear()
        self._peak, self._refused, self._arrived, self._window_start = in_flight, 0, 0, now
        self._arrived_at_cut = self._cut_from = 0

    def _check_busy(self, now: float, in_flight: int) -> None:
        """Every CUT_S: past `max_cpu_busy`, with the requests arriving to account for it and the
        loop falling behind, the admitted share is cut (`auto` only). Read this often, not each
        window: at the onset of an overload every window waited is a window of requests queued."""
        used = self.cpu.used()
        late = sorted(self._delays[self._cut_from :])
        # Behind for two readings running: one stall of the loop (a collection) is one reading.
        delay = late[len(late) // 2] if late else 0.0
        climbing = in_flight > max(self._in_flight_seen, default=-1)
        self._in_flight_seen.append(in_flight)
        behind = delay >= self.target_s * BEHIND and (
            self.share < 1.0 or climbing or delay >= self.target_s * BEHIND * FAR
        )
        self._behind = self._behind + 1 if behind else 0
        if (
            self.auto
            and self.busy_target < 1.0
            and self._arrived - self._arrived_at_cut >= MIN_CUT_ARRIVALS
            and self._behind >= 2
        ):
            busy = (used - self._used_at_cut) / max(1e-9, now - self._cut_at) / self.cpu.available()
            if busy > self.busy_target:
                cut = 0.5 if busy > SATURATED else max(0.5, self.busy_target / busy)
                self.share = max(MIN_SHARE, self.share * cut)
        self._cut_at, self._used_at_cut, self._arrived_at_cut = now, used, self._arrived
        self._cut_from = len(self._delays)

    def start(self, in_flight: Callable[[], int]) -> None:
        """Probe the event loop's delay from now on (for the metric too, when the bound is fixed)."""
        self._in_flight = in_flight
        if self._timer is None:
            self._schedule()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._due = math.inf

    def _schedule(self) -> None:
        self._due = self._clock() + PROBE_S
        self._timer = asyncio.get_running_loop().call_later(PROBE_S, self._probe, self._due)

    def _probe(self, due: float) -> None:
        self.observe(max(0.0, self._clock() - due), self._in_flight())
        self._schedule()
