"""One usage record per request: what it was, who made it, what the upstream reported, what it cost.

Token figures are the upstream's own counts; where it never said them all (a stream cut short, a
client that left first) the rest are estimated (proxy/request/usage_estimate.py) and the record
says so.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from datetime import datetime, timezone
from typing import Any

from proxy.core import jsonutil
from proxy.core.exchange import Exchange
from proxy.formats import Generation, Usage
from proxy.formats.images import ImageMade
from proxy.observability.tracing import exported_ids
from proxy.policy.prices import PriceTable
from proxy.request.charges import Most, ended
from proxy.request.usage_estimate import usage_or_estimate

_ERROR_CHARACTERS = 500  # enough to say why; an upstream's long answer is not kept whole
_MODEL_CHARACTERS = 256  # the schemas' longest model name; a longer one is kept cut (it was refused anyway)
_MOST_COST = 1e11  # under the column's numeric(24, 12) bound: an upstream's absurd count is no unwritable record
_MOST_TOKENS = 2**63 - 1  # the bigint columns' bound, and what JSON encodes as a number (the journal, the spool)


@dataclass(slots=True)
class UsageRecord:
    request_id: str  # the gateway's id for the request: unique, what makes a write idempotent
    at: datetime  # when the request arrived (UTC)
    client_request_id: str | None  # the id the client sent, if it sent one
    key_name: str | None
    tenant: str | None
    route: str
    model: str | None
    upstream_model: str | None
    channel: str | None
    status: int
    input_tokens: int | None
    cached_input_tokens: int | None
    output_tokens: int | None
    reasoning_tokens: int | None
    images: int
    video_seconds: float
    cost: float
    priced: bool
    duration_ms: float
    client_aborted: bool
    estimated: bool
    # Who ended the answer before its end, once the upstream had the request: client, upstream, gateway.
    cut_by: str | None = None
    # The generation went on after its answer (a background response, a video task): the figures
    # are what is held for it, until a follow-up reads how it ended and the row is settled.
    pending: bool = False
    settled_at: datetime | None = None  # when a pending row was settled
    # Its time in parts (`Server-Timing`'s): the gateway's own, and the upstreams' (every attempt's).
    gateway_ms: float | None = None
    upstream_ms: float | None = None
    trace_id: str | None = None  # the request's trace, when it was traced
    attempts: int | None = None  # upstream attempts (failovers and resends each count)
    error_code: str | None = None  # the code of an error the gateway answered itself
    error: str | None = None  # what went wrong, as the access line says it (its first 500 characters)
    # The format the upstream that answered was asked in, where it was not the client's (translated).
    upstream_format: str | None = None

    def row(self) -> tuple[Any, ...]:
        """The record as COPY sends it, its cost in billionths: a float sent into a numeric column
        cost 4 us a record to encode, an integer almost nothing (PostgreSQL divides it back). And
        not dataclasses.astuple, which deep-copies every field: 25 us a record."""
        values = _ROW(self)
        return (*values[:_COST], round(self.cost * 1_000_000_000), *values[_COST + 1 :])

    def encoded(self) -> bytes:
        """The record's JSON, as a spool and the journal keep it (`to_json`'s, encoded): orjson reads
        the dataclass itself, in under half the time of building the dict first."""
        return jsonutil.dumps(self)

    def to_json(self) -> dict[str, Any]:
        found = {f.name: getattr(self, f.name) for f in fields(self)}
        found["at"] = self.at.isoformat()
        if self.settled_at is not None:
            found["settled_at"] = self.settled_at.isoformat()
        return found

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UsageRecord:
        """A record as `to_json` wrote it (an older release's, without the later fields, too)."""
        settled = data.get("settled_at")
        return cls(
            **{
                **data,
                "at": datetime.fromisoformat(data["at"]),
                "settled_at": datetime.fromisoformat(settled) if settled else None,
            }
        )


COLUMNS = tuple(f.name for f in fields(UsageRecord))
_ROW = operator.attrgetter(*COLUMNS)
_COST = COLUMNS.index("cost")


def record_of(
    ex: Exchange,
    prices: PriceTable,
    images: list[ImageMade],
    video_seconds: float,
    now: float,
    seconds_assumed: bool = False,
    held: Callable[[], Usage] | None = None,
) -> UsageRecord:
    """The record of a finished exchange (`seconds_assumed`: the video seconds are the interface's
    longest, the submission naming none; `held`: what a budget held for it)."""
    usage, estimated = usage_or_estimate(ex, held)
    estimated = estimated or seconds_assumed
    charge = prices.charge(_clipped(ex.model), usage, images, video_seconds)
    duration_s = now - ex.started
    trace = exported_ids(ex, duration_s)  # a record links only to a trace the viewer will have
    return UsageRecord(
        request_id=ex.gateway_id,
        at=_arrived(duration_s),
        client_request_id=ex.request_id if ex.request_id != ex.gateway_id else None,
        key_name=ex.key_name,
        tenant=ex.tenant,
        route=ex.route.name,
        model=_clipped(ex.model),
        upstream_model=_clipped(ex.upstream_model),
        channel=ex.channel.name if ex.channel is not None else None,
        upstream_format=ex.upstream_format if ex.translation is not None else None,
        status=ex.outcome.status,
        input_tokens=_bounded(usage.input_tokens),
        cached_input_tokens=_bounded(usage.cached_input_tokens),
        output_tokens=_bounded(usage.output_tokens),
        reasoning_tokens=_bounded(usage.reasoning_tokens),
        images=len(images),
        video_seconds=video_seconds,
        cost=min(charge.cost, _MOST_COST),
        priced=charge.priced,
        duration_ms=round(duration_s * 1000, 3),
        client_aborted=ex.outcome.client_aborted,
        estimated=estimated,
        cut_by=ex.outcome.cut_by,
        gateway_ms=round(ex.overhead_seconds(now) * 1000, 3),
        upstream_ms=round(ex.outcome.upstream_seconds() * 1000, 3),
        trace_id=trace[0] if trace else None,
        attempts=ex.outcome.attempts,
        error_code=ex.outcome.error_code,
        error=ex.outcome.error[:_ERROR_CHARACTERS] if ex.outcome.error else None,
    )


def held(record: UsageRecord, most: Most, prices: PriceTable, counts_tokens: bool) -> UsageRecord:
    """The record of a generation left running: what is held for it (its most: the prompt estimated,
    all the output it may make, its video seconds), pending until a follow-up reads how it ended."""
    charge = prices.charge(record.model, most.usage(), (), most.video_seconds)
    tokens: dict[str, Any] = (
        {
            "input_tokens": most.input_tokens,
            "output_tokens": most.output_tokens,
            "cached_input_tokens": None,
            "reasoning_tokens": None,
        }
        if counts_tokens
        else {}
    )
    return replace(
        record,
        **tokens,
        video_seconds=most.video_seconds,
        cost=min(charge.cost, _MOST_COST),
        priced=charge.priced,
        estimated=record.estimated or counts_tokens,
        pending=True,
    )


def settled(record: UsageRecord, generation: Generation, prices: PriceTable) -> UsageRecord:
    """A pending record once its generation ended: what it spent, as the upstream said (or, when it
    did not, what was held, still estimated), priced again."""
    counts_tokens = record.input_tokens is not None
    usage, seconds, estimated = ended(
        generation, Usage(record.input_tokens, record.output_tokens), record.video_seconds, counts_tokens
    )
    charge = prices.charge(record.model, usage, (), seconds)
    return replace(
        record,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_input_tokens=usage.cached_input_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        video_seconds=seconds,
        cost=min(charge.cost, _MOST_COST),
        priced=charge.priced,
        estimated=estimated if counts_tokens else record.estimated and seconds > 0,
        pending=False,
        settled_at=datetime.now(timezone.utc),
    )


def _bounded(count: int | None) -> int | None:
    """An upstream's token count within what a row (and a record's JSON) can hold."""
    return (
        count
        if count is None or -_MOST_TOKENS <= count <= _MOST_TOKENS
        else max(-_MOST_TOKENS, min(count, _MOST_TOKENS))
    )


def _clipped(model: str | None) -> str | None:
    return model if model is None or len(model) <= _MODEL_CHARACTERS else model[:_MODEL_CHARACTERS]


def _arrived(duration_s: float) -> datetime:
    return datetime.fromtimestamp(time.time() - duration_s, timezone.utc)
