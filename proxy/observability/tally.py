"""Per-request bookkeeping as plain numbers, folded into the Prometheus families when they are read.

prometheus-client takes a lock for every increment and walks a histogram's buckets one by one
for every observation: a request's eleven updates cost more than its access line. On the hot
path a request adds to dicts of plain numbers here instead (a histogram's bucket found by
bisection); `fold()` moves what accumulated into the families. Folding runs first whenever the
process's registry is collected (a scrape, a test's `get_sample_value`): `_Fold` is registered
before any family. With several worker processes (multiprocess mode, where a scrape reads every
worker's files) each worker also folds once a second, so a scrape sees at most a second's lag.

A latency histogram keeps, per bucket, the trace id of the last traced request that fell in it:
an exemplar, shown in the OpenMetrics exposition, so a dashboard goes from a slow bucket to a
trace (prometheus-client keeps no exemplars in multiprocess mode).
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from typing import Any

from prometheus_client.samples import Exemplar

_TALLIES: list[Any] = []


class CounterTally:
    """A labelled counter's increments since the last fold."""

    __slots__ = ("family", "pending", "children")

    def __init__(self, family: Any) -> None:
        self.family = family
        self.pending: dict[tuple[str, ...], float] = {}
        self.children: dict[tuple[str, ...], Any] = {}
        _TALLIES.append(self)

    def add(self, labels: tuple[str, ...], amount: float = 1) -> None:
        pending = self.pending
        pending[labels] = pending.get(labels, 0) + amount

    def fold(self) -> None:
        pending, self.pending = self.pending, {}
        for labels, amount in pending.items():
            _child(self, labels).inc(amount)


class GaugeTally:
    """A labelled gauge kept as plain numbers, set on the family when folded."""

    __slots__ = ("family", "values", "children", "folded")

    def __init__(self, family: Any) -> None:
        self.family = family
        self.values: dict[tuple[str, ...], float] = {}
        self.folded: dict[tuple[str, ...], float] = {}
        self.children: dict[tuple[str, ...], Any] = {}
        _TALLIES.append(self)

    def add(self, labels: tuple[str, ...], amount: float) -> None:
        values = self.values
        values[labels] = values.get(labels, 0) + amount

    def fold(self) -> None:
        for labels, value in self.values.items():
            if self.folded.get(labels) != value:
                self.folded[labels] = value
                _child(self, labels).set(value)


class _Buckets:
    __slots__ = ("counts", "sum", "exemplars")

    def __init__(self, size: int) -> None:
        self.counts = [0] * size
        self.sum = 0.0
        self.exemplars: dict[int, tuple[int, float, float]] | None = None


class HistogramTally:
    """A labelled histogram's observations since the last fold, bucket by bucket."""

    __slots__ = ("family", "bounds", "pending", "children")

    def __init__(self, family: Any) -> None:
        self.family = family
        self.bounds: list[float] = list(family._upper_bounds)  # the family's own, +Inf last
        self.pending: dict[tuple[str, ...], _Buckets] = {}
        self.children: dict[tuple[str, ...], Any] = {}
        _TALLIES.append(self)

    def observe(self, labels: tuple[str, ...], value: float, trace_id: int | None = None) -> None:
        """One value; `trace_id`, a traced request's, is its bucket's exemplar until a later one
        replaces it (written in hex only when folded: most are replaced before)."""
        found = self.pending.get(labels)
        if found is None:
            found = self.pending[labels] = _Buckets(len(self.bounds))
        index = bisect_left(self.bounds, value)  # the first bound at or above it: Prometheus's `le`
        found.counts[index] += 1
        found.sum += value
        if trace_id is not None:
            if found.exemplars is None:
                found.exemplars = {}
            found.exemplars[index] = (trace_id, value, time.time())

    def fold(self) -> None:
        pending, self.pending = self.pending, {}
        for labels, found in pending.items():
            child = _child(self, labels)
            child._sum.inc(found.sum)
            buckets = child._buckets
            for index, count in enumerate(found.counts):
                if count:
                    buckets[index].inc(count)
            for index, (trace_id, value, at) in (found.exemplars or {}).items():
                buckets[index].set_exemplar(Exemplar({"trace_id": f"{trace_id:032x}"}, value, at))


def _child(tally: Any, labels: tuple[str, ...]) -> Any:
    found = tally.children.get(labels)
    if found is None:
        found = tally.children[labels] = tally.family.labels(*labels) if labels else tally.family
    return found


def fold() -> None:
    """Every tally's accumulated numbers into its family."""
    for tally in _TALLIES:
        tally.fold()


class Fold:
    """A collector that yields nothing and folds: registered before the families, so any read
    of the registry sees every request counted so far."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        fold()
        return []


class Folding:
    """Folds every `interval_s` from the running loop, and once more when stopped: for a worker
    whose families another process reads (multiprocess mode)."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        fold()
        self.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            fold()
