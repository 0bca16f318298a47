"""The usage ledger: one record per request (who, what, the upstream's token counts, images,
video seconds, what it cost by the price table) written durably to PostgreSQL.

    plugins:
      ledger:
        database_url: postgresql://modelgate@db/modelgate   # ${LEDGER_DATABASE_URL} works too
        spool_dir: /var/lib/modelgate/ledger-spool          # on a volume that outlives the process

Off until `database_url` is set. The gateway creates and migrates its tables
(plugins/ledger/schema.py). Records are written in batches off the request path
(plugins/ledger/writer.py); while PostgreSQL is slow or away they wait in a bounded spool (a
Redis stream when the state is in Redis, and a local file) and are written once it answers.
With the state in Redis, each record is also appended to a journal there before the client's
answer ends (plugins/ledger/journal.py), so a process killed without warning loses none.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter

from plugins.ledger.record import UsageRecord, held, record_of, settled
from plugins.ledger.settings import LedgerSettings
from proxy.config import GatewayConfig
from proxy.core import jsonutil
from proxy.core.exchange import Exchange
from proxy.core.plugin import QUERIES, STATE_STORE, Joins, Plugin, PluginCommand, Subject
from proxy.core.upstream_response import UpstreamResponse
from proxy.formats import Generation
from proxy.formats.images import ImagesFormat
from proxy.formats.video import VideoFormat
from proxy.observability.metrics import ModelLabels, child
from proxy.policy.prices import PriceTable
from proxy.registry import configured_without
from proxy.request.charges import DEFAULT_OUTPUT_TOKENS, left_open, most_of, read_ended
from proxy.state import StateStore, make_store
from proxy.wire.routes import ROUTES
from proxy.wire.sse import SSEEvent

if TYPE_CHECKING:
    from plugins.ledger.queries import LedgerQueries
    from plugins.ledger.writer import LedgerWriter

log = logging.getLogger("modelgate.ledger")

COST = Counter(
    "modelgate_cost", "What requests cost by the price table (in its currency), by key and model", ["key", "model"]
)
UNPRICED = Counter(
    "modelgate_unpriced_requests", "Requests whose model no row of the price table matched, by model", ["model"]
)

_IMAGES = "images"
_VIDEO_CREATES = frozenset({"video_generations", "videos"})
_PENDING = "ledger:pending:"
_SETTLED_HERE = 10_000  # ids of ended generations this process settled: not taken again


class Ledger(Plugin):
    name = "ledger"
    Settings = LedgerSettings
    # The spec's endpoints a key pays for (a row each), and the calls around them that read what a
    # generation made (a stored response, its cancel): they settle a pending row.
    joins = Joins(keyed=True, local=False, metered=True)
    uses = frozenset({"answer usage", "stream usage"})  # what it records
    order = 900  # after every plugin that shapes the answer
    before_owner_check = False
    reads_answers = False  # it counts the images of answers read whole anyway; never holds a stream

    @classmethod
    def commands(cls) -> Sequence[PluginCommand]:
        from plugins.ledger.report import arguments, run_command

        return (PluginCommand("usage", "report what the usage ledger holds", arguments, run_command),)

    @classmethod
    def config_problems(cls, config: GatewayConfig, workers: int) -> list[str]:
        """A route whose configured pipeline leaves the ledger out escapes the price table and the records."""
        settings = config.plugins.get(cls.name, {})
        recorded = isinstance(settings, dict) and settings.get("database_url")
        if not config.prices and not recorded:
            return []
        what = "prices" if config.prices else f"plugins.{cls.name}.database_url"
        metered = [route for route in ROUTES if route.metered and route.takes_key and not route.local]
        return [
            f"routes.{name}.plugins: leaves out {cls.name}, so its requests are neither priced nor recorded, "
            f"nor pending rows settled ({what} is set): add {cls.name}"
            for name in configured_without(config, cls, metered)
        ]

    def configure(self, config: GatewayConfig) -> None:
        self.config = config
        self.prices = PriceTable(config.prices)
        self.model_label = ModelLabels(config)
        self.writer: LedgerWriter | None = None
        budget = config.plugins.get("budget")  # a pending row holds what the budgets reserve for it
        self.default_output = (
            budget.get("default_reserve_tokens", DEFAULT_OUTPUT_TOKENS)
            if isinstance(budget, dict)
            else DEFAULT_OUTPUT_TOKENS
        )
        # With a Redis state store, the gateway's own (pending rows are kept beside the pins); in
        # memory, a store of the ledger's own, for the gateway's life, so it never pushes pins out.
        gateways = self.resources.get(STATE_STORE)
        if config.state.backend == "redis" and gateways is not None:
            self.pending: StateStore = gateways()
        else:
            self.pending = self.resources.setdefault("ledger.pending", make_store(config.state))
        self._settled: dict[str, None] = self.resources.setdefault("ledger.settled", {})  # oldest first
        # With a price table, cost is counted even without a database; with neither there is
        # nothing to do, and the core is told so (no hook of an idle ledger is called).
        if not self.prices and self.settings.database_url is None:
            self.idle("on_event", "on_response", "on_complete")

    async def start(self) -> None:
        settings: LedgerSettings = self.settings
        if settings.database_url is None:
            return
        # One writer per spool folder for the gateway's life (two would share its files); a reload
        # keeps it, and one that names another database URL (a rotated password) points it there.
        slot = f"ledger:{settings.spool_dir}"
        if slot not in self.resources:
            self.resources[slot] = await _writer(self.config, settings)
        self.writer = self.resources[slot]
        self.writer.use_database(settings.database_url)

    async def report(self, subject: Subject) -> dict[str, Any] | None:
        """What the ledger has recorded of the key or tenant today and this month (UTC)."""
        if self.settings.database_url is None:
            return None
        from datetime import datetime, timezone

        column, value = ("key", subject.name) if subject.key is not None else ("tenant", subject.tenant)
        today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
        found: dict[str, Any] = {}
        try:
            for period, since in (("today", today), ("this_month", today.replace(day=1))):
                found[period] = {**await self._queries().totals(column, value, since), "since": since.isoformat()}
        except (OSError, TimeoutError) as exc:
            return {"unavailable": f"the ledger's database does not answer ({type(exc).__name__})"}
        return found

    async def query(self, name: str, tenant: str | None, params: Mapping[str, str]) -> dict[str, Any] | None:
        """The requests recorded, one of them, or spend over a span (plugins/ledger/queries.py)."""
        database_url = self.settings.database_url
        if database_url is None or name not in QUERIES:
            return None
        return await self._queries().run(name, tenant, params)

    def _queries(self) -> LedgerQueries:
        from plugins.ledger.queries import LedgerQueries

        database_url = self.settings.database_url
        slot = f"ledger.queries:{database_url}"  # kept across reloads; the gateway closes it at the end
        if slot not in self.resources:
            self.resources[slot] = LedgerQueries(database_url)
        return self.resources[slot]

    def on_event(self, ex: Exchange, event: SSEEvent) -> SSEEvent | None:
        if ex.format.name == "images" and (image := ImagesFormat.image_in_event(event)) is not None:
            ex.state(self).setdefault(_IMAGES, []).append(image)
        return event

    async def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        if upstream.status >= 400 or ex.format.name != "images" or not upstream.is_json:
            return
        ex.state(self)[_IMAGES] = ImagesFormat.images_made(upstream.json(), ex.asked())

    async def on_complete(self, ex: Exchange) -> None:
        if ex.key is None:  # a request no key was found for is no key's to pay for
            return
        generation = read_ended(ex)
        if generation is not None:
            await self._settle(ex.followed_id, generation)  # type: ignore[arg-type]
        if not ex.route.number:
            return  # a call around the endpoints: no row of its own
        seconds, assumed = _video_seconds(ex)
        record = record_of(
            ex,
            self.prices,
            ex.state(self).get(_IMAGES, []),
            seconds,
            time.perf_counter(),
            assumed,
            lambda: most_of(ex, self.prices, self.default_output).usage(),
        )
        if left_open(ex):  # it goes on: the row holds what the budgets hold, until a follow-up settles it
            record = held(record, most_of(ex, self.prices, self.default_output), self.prices, ex.format.reports_usage)
            await asyncio.gather(self._keep_pending(ex.created_id, record), self._submit(record))  # type: ignore[arg-type]
            return
        self._count(record, ex.key_name)
        await self._submit(record)

    def _count(self, record: UsageRecord, key_name: str | None) -> None:
        """The cost metrics, once a record's cost is known (a pending row's, when it is settled: a
        counter never goes down)."""
        model = self.model_label(record.model)
        if record.cost:
            child(COST, key_name or "anonymous", model).inc(record.cost)
        if not record.priced and self.prices and record.model is not None:  # a status poll names no model to price
            child(UNPRICED, model).inc()

    async def _submit(self, record: UsageRecord) -> None:
        writer = self.writer
        if writer is None:
            return
        if writer.journal is not None and not self.state_away():
            # Awaited here, so the append rides the request's post-answer round trip (with its
            # settlements), and the record is in Redis before the answer ends (proxy/request/relay.py).
            await writer.journaled(record)
        else:
            writer.submit(record)

    async def _keep_pending(self, generation_id: str, record: UsageRecord) -> None:
        if self.state_away():
            log.warning("state store unreachable: a pending usage record keeps what was held for it")
            return
        try:
            # Never in place of another's: an upstream that gave one id twice leaves the first its own.
            await self.pending.add(_PENDING + generation_id, record.encoded().decode(), self.settings.pending_for_s)
        except Exception as exc:  # the row stands at what was held: nothing is lost but its settlement
            log.warning("a pending usage record could not be kept for its settlement: %s", type(exc).__name__)

    async def _settle(self, generation_id: str, generation: Generation) -> None:
        """A follow-up read how a generation left running ended: its pending row is written again,
        settled, by whichever request takes it first."""
        if generation_id in self._settled or self.state_away():
            return
        try:
            raw = await self.pending.take(_PENDING + generation_id)
        except Exception as exc:  # a later follow-up settles it, or it keeps what was held
            log.warning("a pending usage record could not be read for its settlement: %s", type(exc).__name__)
            return
        if raw is None:
            return  # settled already, never pending, or not pending yet (its stream still running)
        self._settled[generation_id] = None  # settled here: later reads of it need not ask
        while len(self._settled) > _SETTLED_HERE:
            del self._settled[next(iter(self._settled))]
        record = settled(UsageRecord.from_json(jsonutil.loads(raw)), generation, self.prices)
        self._count(record, record.key_name)
        await self._submit(record)


async def _writer(config: GatewayConfig, settings: LedgerSettings) -> LedgerWriter:
    from plugins.ledger.spool import FileSpool, RedisSpool
    from plugins.ledger.writer import LedgerWriter

    spools: list[Any] = []
    journal = None
    spool_bytes = int(settings.spool_max_mb * 1024 * 1024)
    if settings.redis_spool and config.state.backend == "redis":
        from plugins.ledger.journal import Journal, orphan_age_s
        from proxy.state.shared import share

        # Each stream holds at most spool_max_mb, in bytes as written, as the file spool does on disk.
        spools.append(RedisSpool(share(config.state.url), config.state.prefix + "ledger:spool", spool_bytes))
        # A stream of its own: an older release draining `ledger:spool` would delete entries it cannot read.
        journal = Journal(
            share(config.state.url),
            config.state.prefix + "ledger:journal",
            spool_bytes,
            orphan_age_s(settings.flush_interval_s, settings.write_timeout_s),
        )
    spools.append(FileSpool(Path(settings.spool_dir), spool_bytes))
    assert settings.database_url is not None
    writer = LedgerWriter(
        settings.database_url, settings.batch_size, settings.flush_interval_s, spools, settings.write_timeout_s, journal
    )
    await writer.start()
    return writer


def _video_seconds(ex: Exchange) -> tuple[float, bool]:
    """A video task made: its seconds, and whether they were assumed (it named none)."""
    if ex.route.name not in _VIDEO_CREATES or not 200 <= ex.outcome.status < 300:
        return 0.0, False
    return VideoFormat.seconds_made(ex.asked())
