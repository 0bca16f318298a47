"""One usage record per request: what it was, who made it, what the upstream reported, what it cost.

Token figures are the upstream's own counts; where it never said them all (a stream cut short, a
client that left first) the rest are estimated (proxy/request/usage_estimate.py) and the record
says so.
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any

from proxy.formats.images import ImageMade
from proxy.policy.prices import PriceTable
from proxy.request.exchange import Exchange
from proxy.request.usage_estimate import usage_or_estimate
from proxy.wire import jsonutil

_MODEL_CHARACTERS = 256  # the schemas' longest model name; a longer one is kept cut (it was refused anyway)
_MOST_COST = 1e11  # under the column's numeric(24, 12) bound: an upstream's absurd count is no unwritable record


@dataclass(slots=True)
class UsageRecord:
    request_id: str                 # the gateway's id for the request: unique, what makes a write idempotent
    at: datetime                    # when the request arrived (UTC)
    client_request_id: str | None   # the id the client sent, if it sent one
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

    def row(self) -> tuple[Any, ...]:
        """The record as COPY sends it, its cost in billionths: a float sent into a numeric column
        cost 4 us a record to encode, an integer almost nothing (PostgreSQL divides it back). And
        not dataclasses.astuple, which deep-copies every field: 25 us a record."""
        values = _ROW(self)
        return (*values[:_COST], round(self.cost * 1_000_000_000), *values[_COST + 1:])

    def encoded(self) -> bytes:
        """The record's JSON, as a spool and the journal keep it (`to_json`'s, encoded): orjson reads
        the dataclass itself, in under half the time of building the dict first."""
        return jsonutil.dumps(self)

    def to_json(self) -> dict[str, Any]:
        found = {f.name: getattr(self, f.name) for f in fields(self)}
        found["at"] = self.at.isoformat()
        return found

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UsageRecord:
        return cls(**{**data, "at": datetime.fromisoformat(data["at"])})


COLUMNS = tuple(f.name for f in fields(UsageRecord))
_ROW = operator.attrgetter(*COLUMNS)
_COST = COLUMNS.index("cost")


def record_of(ex: Exchange, prices: PriceTable, images: list[ImageMade], video_seconds: float,
              now: float, seconds_assumed: bool = False) -> UsageRecord:
    """The record of a finished exchange (`seconds_assumed`: the video seconds are the interface's
    longest, the submission naming none)."""
    usage, estimated = usage_or_estimate(ex)
    estimated = estimated or seconds_assumed
    charge = prices.charge(_clipped(ex.model), usage, images, video_seconds)
    duration_s = now - ex.started
    return UsageRecord(
        request_id=ex.gateway_id, at=_arrived(duration_s),
        client_request_id=ex.request_id if ex.request_id != ex.gateway_id else None,
        key_name=ex.key_name, tenant=ex.tenant, route=ex.route.name, model=_clipped(ex.model),
        upstream_model=_clipped(ex.upstream_model), channel=ex.channel.name if ex.channel is not None else None,
        status=ex.outcome.status, input_tokens=usage.input_tokens, cached_input_tokens=usage.cached_input_tokens,
        output_tokens=usage.output_tokens, reasoning_tokens=usage.reasoning_tokens, images=len(images),
        video_seconds=video_seconds, cost=min(charge.cost, _MOST_COST), priced=charge.priced,
        duration_ms=round(duration_s * 1000, 3), client_aborted=ex.outcome.client_aborted, estimated=estimated)


def _clipped(model: str | None) -> str | None:
    return model if model is None or len(model) <= _MODEL_CHARACTERS else model[:_MODEL_CHARACTERS]


def _arrived(duration_s: float) -> datetime:
    return datetime.fromtimestamp(time.time() - duration_s, timezone.utc)
