"""The ledger's journal: with the state in Redis, each request's record is appended to a Redis
stream on the request's post-answer round trip (in one pipeline with its settlements, before the
client's answer ends), so a process killed after that loses none of its records.

The writer (plugins/ledger/writer.py) still takes the record from memory, with its entry's id:
it writes it to PostgreSQL as before, then removes the batch's entries (one XDEL). Entries nobody
removed within `orphan_after_s` (their process died, or PostgreSQL was away) are orphans, and any
instance's writer writes them, a few batches a turn. The ledger's insert is idempotent on request
id, so a record written twice (its writer was slower than the bound, or died between the write
and the XDEL) is still one row.

An entry's age is read off its id, which is the Redis server's clock in milliseconds when it was
added; the scan reads that clock too, in the same script (on a Cluster, on the node holding the
stream), so no gateway's clock is trusted. The stream is `{state.prefix}ledger:journal`, not the
spool's stream: an older release draining `ledger:spool` would take these entries for batches it
cannot read, and delete them.

The records appended in one turn of the event loop are one script call (an XADD each, one
entry per record), made as that turn's pipeline is sent (proxy/state/gathering.py): the call and
its answer are parsed once for all of them, where an XADD each cost a request 15 to 20 us of
CPU under load, and it still rides the pipeline of the requests' settlements.

Bounded by the bytes it holds as written (`spool_max_mb`), counted beside the stream by the
scripts that append and remove (proxy/state/stream_bytes.py): a record that would pass the bound is
not journaled, and goes the old way (memory, then a spool). The append script checks the bound
itself, so it holds exactly across instances at no cost to the request path; the writer reads the
count once a turn as well, so that at the bound records are not even sent until it shrinks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.exceptions import RedisError

from plugins.ledger.record import UsageRecord
from plugins.ledger.spool import Taken
from plugins.ledger.writer import LEDGER_RECORDS
from proxy.core import jsonutil
from proxy.state.gathering import answer_within
from proxy.state.stream_bytes import LUA as STREAM_BYTES
from proxy.state.stream_bytes import beside

log = logging.getLogger("modelgate.ledger")

WAIT_S = 0.5  # the longest a request waits for its record's append, as the limiter waits for its check
_JOURNALED = LEDGER_RECORDS.labels("journaled")
_UNJOURNALED = LEDGER_RECORDS.labels("unjournaled")

# One entry per record (ARGV[2] on, each a record's JSON) while the bytes the stream holds stay
# within ARGV[1]; the entries' ids in order, false for a record that did not fit.
_APPEND = (
    STREAM_BYTES
    + """
local most, bytes, ids = tonumber(ARGV[1]), held(KEYS[1], KEYS[2]), {}
for i = 2, #ARGV do
  local n = 6 + #ARGV[i]
  if bytes + n > most then
    ids[i - 1] = false
  else
    ids[i - 1] = redis.call('XADD', KEYS[1], '*', 'record', ARGV[i])
    bytes = bytes + n
  end
end
redis.call('SET', KEYS[2], bytes)
return ids
"""
)
# The entries ARGV names, written: removed, and their bytes with them.
_REMOVE = (
    STREAM_BYTES
    + """
for i = 1, #ARGV do remove(KEYS[1], KEYS[2], ARGV[i]) end
return 0
"""
)
_HELD = (
    STREAM_BYTES
    + """
return held(KEYS[1], KEYS[2])
"""
)
_MOST_A_CALL = 500  # records in one script call (a busy turn makes several)

# Entries older than ARGV[1] ms by the server's clock, from ARGV[2] ('-', or '(' and the last id
# seen), ARGV[3] at most.
_ORPHANS = """
local now = redis.call('TIME')
local before = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - tonumber(ARGV[1])
if before <= 0 then return {} end
return redis.call('XRANGE', KEYS[1], ARGV[2], string.format('%d', before), 'COUNT', ARGV[3])
"""


def orphan_age_s(flush_interval_s: float, write_timeout_s: float) -> float:
    """How old an entry must be to be taken for an orphan: twice the longest a live writer keeps a
    record before writing it (a flush, then a write PostgreSQL takes its whole timeout over), and
    two seconds more."""
    return 2 * (flush_interval_s + write_timeout_s) + 2


class Journal:
    """The stream, through the process's shared client (proxy/state/shared.py)."""

    def __init__(self, shared: Any, key: str, max_bytes: int, orphan_after_s: float) -> None:
        self._shared = shared
        self._calls = shared.calls
        self.key = key
        self._keys = [key, beside(key)]
        self.max_bytes = max_bytes
        self.orphan_after_ms = int(orphan_after_s * 1000)
        self.full = False
        self._failing = False
        self._unreadable = False
        self._after = "-"  # where this turn's scan for orphans goes on from (past entries it cannot read)
        self._orphans = shared.client.register_script(_ORPHANS)
        self._append = shared.client.register_script(_APPEND)
        self._remove = shared.client.register_script(_REMOVE)
        self._held = shared.client.register_script(_HELD)
        # This turn's records, and the future each of their requests waits on (one per request:
        # a request cancelled meanwhile cancels its own, never the others').
        self._records: list[bytes] = []
        self._waiting: list[asyncio.Future[bytes | None]] = []

    async def append(self, record: UsageRecord) -> bytes | None:
        """Append `record`: its entry's id, or None when the journal did not take it (full, or
        Redis failed or did not answer within WAIT_S). Never raises for Redis."""
        if self.full:
            _UNJOURNALED.inc()
            return None
        if not self._records:
            self._calls.at_flush(self._send)
        waiting = asyncio.get_running_loop().create_future()
        self._records.append(record.encoded())
        self._waiting.append(waiting)
        return await waiting

    def _send(self) -> None:
        """This turn's records, in one call (or a few, past _MOST_A_CALL), with the turn's pipeline."""
        records, waiting, self._records, self._waiting = self._records, self._waiting, [], []
        loop = asyncio.get_running_loop()
        for start in range(0, len(records), _MOST_A_CALL):
            called = self._calls.script(
                self._append, self._keys, [self.max_bytes, *records[start : start + _MOST_A_CALL]]
            )
            them = waiting[start : start + _MOST_A_CALL]
            late = loop.call_later(WAIT_S, self._answered, them, None, TimeoutError())
            called.add_done_callback(lambda done, them=them, late=late: self._took(done, them, late))

    def _took(
        self, called: asyncio.Future[Any], waiting: list[asyncio.Future[bytes | None]], late: asyncio.TimerHandle
    ) -> None:
        late.cancel()
        if called.cancelled():
            self._answered(waiting, None, TimeoutError())
        elif (failure := called.exception()) is not None:
            self._answered(waiting, None, failure)
        else:
            self._answered(waiting, called.result(), None)

    def _answered(
        self,
        waiting: list[asyncio.Future[bytes | None]],
        entries: list[bytes | None] | None,
        failure: BaseException | None,
    ) -> None:
        """Each request hears its entry's id, or None: its record is not journaled (it did not fit
        within the bound; Redis refused, failed or did not answer in time: one that answers later
        holds an orphan, written once)."""
        heard = taken = 0  # not those that heard already (the call answered after WAIT_S) or left
        for index, answer in enumerate(waiting):
            if not answer.done():
                entry = entries[index] if entries is not None else None
                answer.set_result(entry)
                heard += 1
                taken += entry is not None
        if not heard:
            return
        if entries is None:
            _UNJOURNALED.inc(heard)
            if not self._failing:  # once an outage: the counter shows the rest
                self._failing = True
                log.warning(
                    "ledger: the journal in Redis did not take records (%s); they wait in memory until it does",
                    type(failure).__name__,
                )
            return
        _JOURNALED.inc(taken)
        if heard > taken:  # at the bound: those go the old way, and the next ones are not sent
            _UNJOURNALED.inc(heard - taken)
            self._mark_full(True)
        if self._failing:
            self._failing = False
            log.info("ledger: the journal in Redis takes records again")

    async def measure(self) -> None:
        """Read the bytes the journal holds (once a writer turn, never per request): at the bound
        it is sent no more records until it shrinks."""
        self._after = "-"
        try:
            held = await answer_within(self._calls.script(self._held, self._keys, []), WAIT_S)
        except (RedisError, OSError, TimeoutError):
            return  # an append would fail as fast; the flag stays as last read
        self._mark_full(held >= self.max_bytes)

    def _mark_full(self, full: bool) -> None:
        if full and not self.full:
            log.error(
                "ledger: the journal in Redis holds its most (%d bytes, spool_max_mb); records are not "
                "journaled until it shrinks (a killed process loses those it holds)",
                self.max_bytes,
            )
        elif self.full and not full:
            log.info("ledger: the journal in Redis takes records again")
        self.full = full

    async def remove(self, entries: list[bytes]) -> None:
        """The records of `entries` are written: their entries go (one XDEL). Never raises: entries
        left are written again as orphans, once."""
        try:
            await answer_within(self._calls.script(self._remove, self._keys, entries), WAIT_S)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning(
                "ledger: journal entries of written records not removed (%s): they are written again, once",
                type(exc).__name__,
            )

    async def take(self, limit: int) -> Taken | None:
        """Up to `limit` orphans (for the writer's drain, like a spool's); None when there are none,
        or Redis is away (an append says so, and the next turn looks again)."""
        try:
            entries = await self._calls.script(self._orphans, [self.key], [self.orphan_after_ms, self._after, limit])
        except (RedisError, OSError, TimeoutError):
            return None
        if not entries:
            return None
        records, ids = [], []
        for entry_id, fields in entries:
            self._after = "(" + (entry_id.decode() if isinstance(entry_id, bytes) else entry_id)
            try:
                data = dict(zip(fields[::2], fields[1::2]))
                records.append(UsageRecord.from_json(jsonutil.loads(data[b"record"])))
            except (ValueError, TypeError, KeyError):
                # Left there (a newer release may know its shape), and passed over until the next turn.
                if not self._unreadable:
                    self._unreadable = True
                    log.error(
                        "ledger: a journal entry this release cannot read is left in the journal",
                        extra={"entry": str(entry_id)},
                    )
                continue
            ids.append(entry_id)
        return Taken(records, ids)

    async def done(self, taken: Taken) -> None:
        if taken.token:
            await self._calls.script(self._remove, self._keys, taken.token)

    async def close(self) -> None:
        from proxy.state.shared import unshare

        shared, self._shared = self._shared, None
        if shared is not None:
            await unshare(shared)
