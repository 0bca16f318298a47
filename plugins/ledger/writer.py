"""Writing usage records to PostgreSQL off the request path: batched, COPY, idempotent.

A request only appends its record to a list (`submit`). One task takes what has gathered, at
most `batch_size` at a time and at least every `flush_interval_s`, and COPYs it into a
temporary table whose rows are then inserted unless their request id is there already, in one
transaction: a batch written twice (it reached PostgreSQL but the answer did not reach the
gateway, or the spool handed it out again) is written once. A batch PostgreSQL does not take
goes to the spool (plugins/ledger/spool.py), which the same task drains once PostgreSQL answers
again. Closing writes what is left, or spools it.

With a journal (plugins/ledger/journal.py: the state in Redis), a record comes with the id of
its journal entry, appended before the client's answer ended: once written, the batch's entries
are removed; a batch PostgreSQL does not take is not spooled again, its journaled records staying
where they are until a writer (this one or another instance's) takes them for orphans. Only the
records the journal did not take wait in this process's memory alone: a process killed without
warning (SIGKILL, a lost machine) loses those, the records of the last `flush_interval_s`, or of
the last `write_timeout_s` while a write to a PostgreSQL that does not answer is under way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge

from plugins.ledger.record import COLUMNS, UsageRecord
from plugins.ledger.schema import migrate

if TYPE_CHECKING:
    from plugins.ledger.journal import Journal

log = logging.getLogger("modelgate.ledger")

LEDGER_RECORDS = Counter(
    "modelgate_ledger_records",
    "Usage records by where they went (written to PostgreSQL, "
    "spooled while it was away, dropped: the spool was full, refused: PostgreSQL refused "
    "what one held; journaled in Redis before the answer ended, or unjournaled: the "
    "journal was full or Redis away)",
    ["outcome"],
)
for _outcome in ("written", "spooled", "dropped", "refused", "journaled", "unjournaled"):  # a panel reads each
    LEDGER_RECORDS.labels(_outcome)
LEDGER_WAITING = Gauge(
    "modelgate_ledger_waiting_records",
    "Usage records not yet in PostgreSQL (in memory and in this process's spool file)",
    multiprocess_mode="livesum",
)

# Records arrive in a table of the session's own, their cost in billionths (UsageRecord.row), and
# go on from there unless their request id is in the ledger already; the one exception, a pending
# row, takes its settlement in place. So a record written twice, or a pending one arriving after
# its settlement, changes nothing. A batch holding a row twice (pending and settled) gives one,
# the settled: an upsert may touch a row once a statement.
_SELECTED = ", ".join("cost::numeric / 1000000000" if c == "cost" else c for c in COLUMNS)
_SETTLED = (
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "images",
    "video_seconds",
    "cost",
    "priced",
    "estimated",
    "pending",
    "settled_at",
)
_INSERT = (
    f"INSERT INTO usage_records ({', '.join(COLUMNS)}) SELECT DISTINCT ON (request_id) {_SELECTED} "
    "FROM ledger_incoming ORDER BY request_id, pending "
    f"ON CONFLICT (request_id) DO UPDATE SET {', '.join(f'{c} = EXCLUDED.{c}' for c in _SETTLED)} "
    "WHERE usage_records.pending AND NOT EXCLUDED.pending"
)
_INCOMING = (
    "CREATE TEMP TABLE IF NOT EXISTS ledger_incoming (LIKE usage_records INCLUDING DEFAULTS) "
    "ON COMMIT DELETE ROWS; ALTER TABLE ledger_incoming ALTER COLUMN cost TYPE bigint USING 0"
)
_RETRY_S = 1.0


class LedgerWriter:
    def __init__(
        self,
        database_url: str,
        batch_size: int,
        flush_interval_s: float,
        spools: Sequence[Any],
        write_timeout_s: float = 3.0,
        journal: Journal | None = None,
    ) -> None:
        self.database_url = database_url
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.write_timeout_s = write_timeout_s
        self.spools = list(spools)  # tried in order (a Redis stream, then the local file)
        self.journal = journal
        # Each record with its journal entry's id (None: not journaled, in this memory alone).
        self._pending: list[tuple[UsageRecord, bytes | None]] = []
        self._wake = asyncio.Event()
        self._pool: Any = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._down_until = 0.0  # PostgreSQL failed: no write is tried before this (monotonic)
        self._refusals: tuple[type[BaseException], ...] = ()  # PostgreSQL refusing what a batch holds
        self._away = False
        self._retired: asyncio.Task[None] | None = None  # a pool a new database URL replaced, closing

    def use_database(self, database_url: str) -> None:
        """Write from now on with `database_url` (a reload's: a rotated password, another server).
        The pool made with the old one is closed once its batch is written; the next batch
        connects anew."""
        if database_url == self.database_url:
            return
        self.database_url = database_url
        self._down_until = 0.0  # the old URL's failures say nothing of the new one
        pool, self._pool = self._pool, None
        if pool is not None:
            self._retired = asyncio.get_running_loop().create_task(pool.close(), name="ledger pool retired")
            self._retired.add_done_callback(lambda task: task.cancelled() or task.exception())  # seen: no warning
        log.info("ledger: the database URL changed; the next batch connects with the new one")

    def submit(self, record: UsageRecord, entry: bytes | None = None) -> None:
        """Take a record, and the id of its journal entry if it has one (on the request path:
        nothing but an append)."""
        self._pending.append((record, entry))
        if len(self._pending) >= self.batch_size:
            self._wake.set()

    async def journaled(self, record: UsageRecord) -> None:
        """Append `record` to the journal, then take it (`submit`); a record the journal does not
        take, or whose append is cancelled (its client left meanwhile), is taken all the same."""
        entry = None
        try:
            entry = await self.journal.append(record)  # type: ignore[union-attr]
        finally:
            self.submit(record, entry)

    @property
    def waiting(self) -> int:
        return len(self._pending)

    async def start(self) -> None:
        import asyncpg

        # Class 22 (data exception) and 23 (integrity), and a value the driver cannot even encode for its
        # column: the records, not the server (an out-of-range figure, say).
        self._refusals = (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError, OverflowError)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ledger writer")

    async def close(self, deadline_s: float = 5.0) -> None:
        """Write what is left (within `deadline_s`), spool the rest."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, deadline_s)
            except (TimeoutError, asyncio.CancelledError):
                pass
        if unjournaled := _unjournaled(self._take_all()):  # what the journal holds stays there, for any writer
            await self._spool(unjournaled)
        for spool in self.spools:
            await _maybe_await(spool.close())
        if self.journal is not None:
            await self.journal.close()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await asyncio.wait_for(pool.close(), 2.0)
            except (TimeoutError, OSError):
                pool.terminate()
        if self._retired is not None:
            try:
                await asyncio.wait_for(self._retired, 2.0)
            except Exception:  # noqa: BLE001 - a pool already replaced: how it ends is no loss
                pass

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self._turn()
            except asyncio.CancelledError:
                raise
            except Exception:  # a writer that stopped would leave every later record in memory, unwritten
                log.exception("ledger: a turn of the writer failed; it goes on")
            LEDGER_WAITING.set(len(self._pending))
            if self._closing:
                return

    async def _turn(self) -> None:
        if self.journal is not None:
            await self.journal.measure()  # once a turn, not per request: is it full?
        while self._pending:
            batch = self._pending[: self.batch_size]
            del self._pending[: self.batch_size]
            try:
                written = await self._write([record for record, _ in batch])
            except BaseException:  # cancelled by close() while PostgreSQL hangs: the batch goes to disk
                self._spool_now(_unjournaled(batch))
                raise
            entries = [entry for _, entry in batch if entry is not None]
            if written:
                if entries:
                    await self.journal.remove(entries)  # type: ignore[union-attr]
                continue
            # Journaled records wait in the journal (counted as spooled there): not spooled twice.
            if entries:
                LEDGER_RECORDS.labels("spooled").inc(len(entries))
            if unjournaled := _unjournaled(batch):
                await self._spool(unjournaled)
        if not self._closing:  # a backlog waits for the next start, not for shutdown
            await self._drain()

    async def _write(self, batch: list[UsageRecord]) -> bool:
        """COPY `batch` in, skipping request ids already there; False when PostgreSQL did not take it.
        A batch PostgreSQL refuses for what it holds (a value out of a column's range) is split
        until the records it refuses stand alone: those are set aside, counted and logged, and the
        others written, so one bad record never holds up the rest, nor the spool."""
        if time.monotonic() < self._down_until:
            return False
        try:
            pool = await self._connected()
            async with pool.acquire() as connection, connection.transaction():
                await connection.execute(_INCOMING)
                await connection.copy_records_to_table(
                    "ledger_incoming", records=[r.row() for r in batch], columns=COLUMNS, timeout=self.write_timeout_s
                )
                await connection.execute(_INSERT, timeout=self.write_timeout_s)
        except self._refusals as exc:
            if len(batch) == 1:
                LEDGER_RECORDS.labels("refused").inc()
                log.error(
                    "ledger: PostgreSQL refuses a usage record (%s: %s); it is set aside",
                    type(exc).__name__,
                    str(exc)[:200],
                    extra={"request_id": batch[0].request_id},
                )
                return True
            half = len(batch) // 2
            return await self._write(batch[:half]) and await self._write(batch[half:])
        except Exception as exc:  # PostgreSQL away, or unreachable as configured: the batch is spooled
            self._went_away(exc)
            return False
        LEDGER_RECORDS.labels("written").inc(len(batch))
        if self._away:
            self._away = False
            log.info("ledger: PostgreSQL takes records again")
        return True

    async def _connected(self) -> Any:
        if self._pool is None:
            import asyncpg

            url = self.database_url
            pool = await asyncpg.create_pool(
                url, min_size=1, max_size=2, timeout=self.write_timeout_s, command_timeout=self.write_timeout_s
            )
            try:
                async with pool.acquire() as connection:
                    await migrate(connection)
            except BaseException:
                pool.terminate()
                raise
            if url != self.database_url:  # a reload gave another URL while this one connected
                pool.terminate()
                return await self._connected()
            self._pool = pool
            log.info("ledger: PostgreSQL answers; records are written")
        return self._pool

    def _went_away(self, exc: BaseException) -> None:
        if not self._away:  # once an outage: the records' counter shows the rest
            self._away = True
            log.warning(
                "ledger: PostgreSQL did not take a batch (%s: %s); records are spooled until it does",
                type(exc).__name__,
                str(exc)[:200],
            )
        self._down_until = time.monotonic() + _RETRY_S
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.terminate()

    def _spool_now(self, batch: list[UsageRecord]) -> None:
        """Spool without waiting (into a file): for a writer being stopped."""
        files = [spool for spool in self.spools if not asyncio.iscoroutinefunction(spool.put)]
        if files and files[-1].put(batch):
            LEDGER_RECORDS.labels("spooled").inc(len(batch))
        else:
            LEDGER_RECORDS.labels("dropped").inc(len(batch))
            log.error("ledger: %d usage records dropped on stopping: the spool file refused them", len(batch))

    async def _spool(self, batch: list[UsageRecord]) -> None:
        for spool in self.spools:
            if await _maybe_await(spool.put(batch)):
                LEDGER_RECORDS.labels("spooled").inc(len(batch))
                return
        LEDGER_RECORDS.labels("dropped").inc(len(batch))
        log.error("ledger: %d usage records dropped: PostgreSQL and every spool refused them", len(batch))

    async def _drain(self) -> None:
        """Write what the spools hold while PostgreSQL takes it (a few batches a turn, so new
        records never wait long behind an old backlog)."""
        # The journal's orphans (left by a writer that died, or while PostgreSQL was away) last.
        for spool in (*self.spools, self.journal) if self.journal is not None else self.spools:
            for _ in range(4):
                if time.monotonic() < self._down_until:
                    return
                try:
                    taken = await _maybe_await(spool.take(self.batch_size))
                except Exception as exc:  # a spool that cannot be read now is tried next turn
                    log.warning("ledger: a spool could not be read: %s", type(exc).__name__)
                    break
                if taken is None:
                    break
                if taken.records and not await self._write(taken.records):
                    put_back = getattr(spool, "put_back", None)
                    if put_back is not None:
                        put_back(taken)
                    return
                try:
                    await _maybe_await(spool.done(taken))
                except Exception as exc:
                    log.warning(
                        "ledger: spooled records written but not removed (%s): they are written again, once",
                        type(exc).__name__,
                    )
                    break

    def _take_all(self) -> list[tuple[UsageRecord, bytes | None]]:
        batch, self._pending = self._pending, []
        return batch


def _unjournaled(batch: list[tuple[UsageRecord, bytes | None]]) -> list[UsageRecord]:
    """The records of `batch` the journal does not hold."""
    return [record for record, entry in batch if entry is None]


async def _maybe_await(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) else value
