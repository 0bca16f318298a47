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

import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field, field_validator

from plugins.ledger.record import record_of
from proxy.config import GatewayConfig
from proxy.observability.metrics import ModelLabels, child
from proxy.plugin import Joins, Plugin, PluginCommand
from proxy.formats.images import ImagesFormat
from proxy.formats.video import VideoTasks
from proxy.policy.prices import PriceTable
from proxy.request.exchange import Exchange, UpstreamResponse
from proxy.wire.sse import SSEEvent

if TYPE_CHECKING:
    from plugins.ledger.writer import LedgerWriter

COST = Counter("modelgate_cost", "What requests cost by the price table (in its currency), by key and model",
               ["key", "model"])
UNPRICED = Counter("modelgate_unpriced_requests", "Requests whose model no row of the price table matched, by model",
                   ["model"])

_IMAGES = "ledger.images"
_VIDEO_CREATES = frozenset({"video_generations", "videos"})
_RECORD_BYTES = 1024  # the most a record takes in a spool (its model name cut to 256): what bounds the Redis spool


class LedgerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    database_url: str | None = Field(default=None, repr=False)  # holds a password, often
    batch_size: int = Field(default=1000, ge=1, le=100_000)
    flush_interval_s: float = Field(default=1.0, gt=0, le=60)
    write_timeout_s: float = Field(default=3.0, gt=0, le=60)  # past it PostgreSQL counts as away: the batch is spooled
    spool_dir: str = "ledger-spool"
    spool_max_mb: float = Field(default=1024, gt=0)
    # With state in Redis, journal each record there before its answer ends, and spool there first
    # (any instance drains both).
    redis_spool: bool = True

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 (read for its check: a port that is no number raises)
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
            raise ValueError("a PostgreSQL URL: postgresql://user:password@host:5432/database")
        return value


class Ledger(Plugin):
    name = "ledger"
    Settings = LedgerSettings
    joins = Joins(keyed=True, endpoint=True)  # the spec's endpoints a key pays for
    order = 900  # after every plugin that shapes the answer
    before_owner_check = False
    reads_answers = False  # it counts the images of answers read whole anyway; never holds a stream

    @classmethod
    def commands(cls) -> Sequence[PluginCommand]:
        from plugins.ledger.report import arguments, run_command

        return (PluginCommand("usage", "report what the usage ledger holds", arguments, run_command),)

    def configure(self, config: GatewayConfig) -> None:
        self.config = config
        self.prices = PriceTable(config.prices)
        self.model_label = ModelLabels(config)
        self.writer: LedgerWriter | None = None
        # With a price table, cost is counted even without a database; with neither there is
        # nothing to do, and the core is told so (no hook of an idle ledger is called).
        if not self.prices and self.settings.database_url is None:
            self.idle("on_event", "on_response", "on_complete")

    async def start(self) -> None:
        settings: LedgerSettings = self.settings
        if settings.database_url is None:
            return
        slot = f"ledger:{settings.database_url}:{settings.spool_dir}"
        if slot not in self.resources:  # one writer for the gateway's life; a reload keeps it
            self.resources[slot] = await _writer(self.config, settings)
        self.writer = self.resources[slot]

    def on_event(self, ex: Exchange, event: SSEEvent) -> SSEEvent | None:
        if ex.format.name == "images" and (image := ImagesFormat.image_in_event(event)) is not None:
            ex.plugin_state.setdefault(_IMAGES, []).append(image)
        return event

    async def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        if upstream.status >= 400 or ex.format.name != "images" or not upstream.is_json:
            return
        ex.plugin_state[_IMAGES] = ImagesFormat.images_made(upstream.json(), ex.asked())

    async def on_complete(self, ex: Exchange) -> None:
        if ex.key is None:  # a request no key was found for is no key's to pay for
            return
        seconds, assumed = _video_seconds(ex)
        record = record_of(ex, self.prices, ex.plugin_state.get(_IMAGES, []), seconds, time.perf_counter(),
                           assumed)
        model = self.model_label(ex.model)
        if record.cost:
            child(COST, ex.key_name or "anonymous", model).inc(record.cost)
        if not record.priced and self.prices and ex.model is not None:  # a status poll names no model to price
            child(UNPRICED, model).inc()
        writer = self.writer
        if writer is None:
            return
        if writer.journal is not None and not self.state_away():
            # Awaited here, so the append rides the request's post-answer round trip (with its
            # settlements), and the record is in Redis before the answer ends (proxy/request/relay.py).
            await writer.journaled(record)
        else:
            writer.submit(record)


async def _writer(config: GatewayConfig, settings: LedgerSettings) -> LedgerWriter:
    from plugins.ledger.spool import FileSpool, RedisSpool
    from plugins.ledger.writer import LedgerWriter

    spools: list[Any] = []
    journal = None
    if settings.redis_spool and config.state.backend == "redis":
        from plugins.ledger.journal import Journal, orphan_age_s
        from proxy.state.shared import share

        records = max(1, int(settings.spool_max_mb * 1024 * 1024 / _RECORD_BYTES))
        batches = max(1, records // settings.batch_size)
        spools.append(RedisSpool(share(config.state.url), config.state.prefix + "ledger:spool", batches))
        # A stream of its own: an older release draining `ledger:spool` would delete entries it cannot read.
        journal = Journal(share(config.state.url), config.state.prefix + "ledger:journal", records,
                          orphan_age_s(settings.flush_interval_s, settings.write_timeout_s))
    spools.append(FileSpool(Path(settings.spool_dir), int(settings.spool_max_mb * 1024 * 1024)))
    assert settings.database_url is not None
    writer = LedgerWriter(settings.database_url, settings.batch_size, settings.flush_interval_s, spools,
                          settings.write_timeout_s, journal)
    await writer.start()
    return writer


def _video_seconds(ex: Exchange) -> tuple[float, bool]:
    """A video task made: its seconds, and whether they were assumed (it named none)."""
    if ex.route.name not in _VIDEO_CREATES or not 200 <= ex.outcome.status < 300:
        return 0.0, False
    return VideoTasks.seconds_made(ex.asked())
