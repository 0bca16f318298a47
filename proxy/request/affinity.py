"""Affinity: a video task or response id leads back to the channel, and the tenant, that made it.

The id the client holds is the upstream's own, unchanged; the gateway remembers which
channel issued it, and for which tenant (proxy.policy.keys.GatewayKey.tenant), in the state store
(memory, or Redis shared by every instance). So a status poll, a download or a
`previous_response_id` lands on the same channel from any gateway instance, and is refused to
any other tenant: every key shares the channel's credential, so the upstream alone cannot tell
them apart. The lookup starts before the plugins run, so it shares a round trip with the limit
check; the core checks the owner once the caller is known, before any plugin but those that
declare they read nothing of the id (`before_owner_check`), and before a channel is chosen. A
request refused there has been counted by the rate limits, like any other request of its key.

A record is written only where none is: an id never changes hands. A video task id goes into
follow-up paths, so it must keep to the task-id grammar (proxy/request/target.py) and be the gateway's
to give: an upstream id that breaks the grammar (`models/x/operations/1`), or that another
channel or request already holds, is never handed out. The client gets an alias of the
gateway's own, and follow-ups send the upstream's id, from the record, re-quoted as one path
segment. A response id that is already held stays with its first owner.

While the store is unreachable, a follow-up gets a retryable 503 (never a "not found": the id may
well exist), and the pins of ids handed out meanwhile are kept in this process (at most
`state.pending_pins`), followed from there, and written once the store answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from proxy.core import jsonutil
from proxy.core.exchange import Exchange
from proxy.core.pin import PinRecord
from proxy.observability.metrics import AUTH_REFUSALS, PENDING_PINS, PINS_DROPPED
from proxy.request.target import PARAM_GRAMMAR
from proxy.state import StateStore
from proxy.wire.routes import Pin
from proxy.wire.sse import SSEEvent

log = logging.getLogger("modelgate.affinity")

# What a tenant is told of an id that is not its own: exactly what it is told of one that never existed.
_NOT_FOUND = {
    Pin.VIDEO_TASK: ("no such video task", "task_not_found", None),
    Pin.RESPONSE: ("previous response not found", "previous_response_not_found", "previous_response_id"),
}

_MAX_ID_LENGTH = 512
_RETRY_S = 1.0  # between tries to write kept pins
_CLOSE_S = 1.0  # the last try, on shutdown


class StateUnavailable(Exception):
    """The state store could not say whether, or where, an id was made."""


class Affinity:
    __slots__ = ("_store", "_ttl_s", "_pending", "_max_pending", "_flusher", "_reachable")

    def __init__(
        self, store: StateStore, ttl_s: int, max_pending: int = 10_000, reachable: Callable[[], bool] = lambda: True
    ) -> None:
        self._store = store
        self._ttl_s = ttl_s
        # The store's probe: while it says the store is away, no request waits on the store's
        # timeouts (a hung Redis would hold each one for seconds).
        self._reachable = reachable
        # Pins of ids handed out while the store was away: followed from here meanwhile, and
        # written once it answers again (oldest dropped past `max_pending`, and counted).
        self._pending: OrderedDict[str, tuple[str, bool]] = OrderedDict()  # key -> (record, overwrite)
        self._max_pending = max_pending
        self._flusher: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def follow(self, ex: Exchange) -> None:
        """Find the id this request follows and start looking up what was recorded of it, as a
        task: it rides the request's first round trip with the plugins' calls (its limit check).
        What it finds is the request's only once `check_owner` has said the id is the caller's."""
        pin = ex.route.follows
        ref = followed_id(ex, pin) if pin is not None else None
        if pin is None or not ref:
            return
        ex.followed_id = ref
        ex.follow_lookup = asyncio.get_running_loop().create_task(self._record_of(pin, ref, ex.request_id))

    def check_owner(self, ex: Exchange) -> Awaitable[web.StreamResponse | None]:
        """The core's step among the plugins' on_request hooks (proxy/core/pipeline.py): the id this
        request follows must have been handed out to its caller's tenant. To every other tenant,
        and for an id never handed out, the format's own 404, as if it did not exist; a 503
        when the store cannot say."""
        return _check_owner(ex)

    async def _record_of(self, pin: Pin, ref: str, request_id: str) -> PinRecord | None:
        """What was recorded of `ref`; raises StateUnavailable when the store cannot answer
        (nobody may then say who owns the id)."""
        if len(ref) > _MAX_ID_LENGTH:  # never handed out (remember refuses them): not worth a look
            return None
        key = _key(pin, ref)
        if (held := self._pending.get(key)) is not None:  # made here during an outage, not yet written
            return _record(held[0])
        if not self._reachable():
            raise StateUnavailable("the state store is unreachable")
        try:
            raw = await self._store.get(key)
        except Exception as exc:
            log.warning("could not read affinity", extra={"request_id": request_id})
            raise StateUnavailable(type(exc).__name__) from None
        return _record(raw) if raw else None

    async def remember(self, ex: Exchange, pin: Pin, ref: Any) -> str | None:
        """Record who made `ref` and where; the id to hand out (an alias when `ref` could not be
        followed), or None when there is nothing to record."""
        if not isinstance(ref, str) or not ref or len(ref) > _MAX_ID_LENGTH or ex.channel is None:
            return None
        if ref in (".", ".."):  # as a path segment it is no id but a step up: never followed, never aliased
            return None
        record = {"channel": ex.channel.name, "owner": ex.tenant or ""}
        handed_out = ref
        if pin is Pin.VIDEO_TASK and (PARAM_GRAMMAR["task_id"][0].fullmatch(ref) is None or not self._reachable()):
            # (while the store is away, whether another request holds this id cannot be asked:
            # an alias, new by construction, is the task's own)
            handed_out = await self._alias(record, pin, ref)
        else:
            value = jsonutil.dumps(record).decode()
            try:
                if not self._reachable():
                    raise StateUnavailable("the state store is unreachable")
                added = await self._store.add(_key(pin, ref), value, self._ttl_s, then=ex.with_pin)
                ex.pinned_with = added and bool(ex.with_pin)
            except Exception:
                if pin is Pin.VIDEO_TASK:
                    handed_out = await self._alias(record, pin, ref)
                    added = True
                else:
                    # The answer is good; the pin is kept here until the store can take it.
                    self._keep(_key(pin, ref), value, overwrite=False, request_id=ex.request_id)
                    added = True
            if not added:
                if pin is Pin.VIDEO_TASK:
                    handed_out = await self._alias(record, pin, ref)
                else:
                    log.warning(
                        "a response id was made twice; it stays with its first owner",
                        extra={"request_id": ex.request_id},
                    )
        ex.created_id = handed_out
        return handed_out

    async def _alias(self, record: dict[str, str], pin: Pin, ref: str) -> str:
        alias = "task_mg_" + secrets.token_urlsafe(18)  # unguessable and new: nobody else can hold it
        value = jsonutil.dumps({**record, "upstream": ref}).decode()
        try:
            if not self._reachable():
                raise StateUnavailable("the state store is unreachable")
            await self._store.set(_key(pin, alias), value, self._ttl_s)
        except Exception:
            self._keep(_key(pin, alias), value, overwrite=True, request_id=None)
        return alias

    def _keep(self, key: str, value: str, overwrite: bool, request_id: str | None) -> None:
        if not self._pending:  # once an outage, not once an id (the gauge counts them)
            log.warning(
                "state store unreachable: pins of ids handed out are kept here until it returns",
                extra={"request_id": request_id},
            )
        self._pending[key] = (value, overwrite)
        while len(self._pending) > self._max_pending:
            self._pending.popitem(last=False)
            PINS_DROPPED.inc()
        PENDING_PINS.set(len(self._pending))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_when_back(), name="affinity pins")

    async def _flush_when_back(self) -> None:
        """Write the kept pins, oldest first, once the store answers; an id another instance
        recorded meanwhile keeps that record (`add`), an alias (new by construction) is set."""
        while self._pending:
            await asyncio.sleep(_RETRY_S)
            if not self._reachable():
                continue
            try:
                while self._pending:
                    key, (value, overwrite) = next(iter(self._pending.items()))
                    if overwrite:
                        await self._store.set(key, value, self._ttl_s)
                    else:
                        await self._store.add(key, value, self._ttl_s)
                    self._pending.pop(key, None)
                    PENDING_PINS.set(len(self._pending))
            except Exception:
                continue  # still away: try again later
            log.info("state store back: every kept pin is written")

    async def close(self) -> None:
        """One last try to write kept pins (on shutdown, within a second, and only to a store
        that answers its probe); what cannot be written is logged."""
        if self._flusher is not None:
            self._flusher.cancel()
        if self._pending and self._reachable():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_CLOSE_S):
                    for key, (value, overwrite) in list(self._pending.items()):
                        if overwrite:
                            await self._store.set(key, value, self._ttl_s)
                        else:
                            await self._store.add(key, value, self._ttl_s)
                        del self._pending[key]
        if self._pending:
            log.error(
                "stopping with pins the state store never took: their ids cannot be followed",
                extra={"pending": len(self._pending)},
            )

    async def remember_from_body(self, ex: Exchange, body: Any) -> bool:
        """Record the id an answer carries; True when the body now carries an alias in its place."""
        pin = ex.route.creates
        if pin is None or not isinstance(body, dict):
            return False
        fields = ex.format.id_fields
        ref = next((body[f] for f in fields if body.get(f)), None)
        handed_out = await self.remember(ex, pin, ref)
        if handed_out is None or handed_out == ref:
            return False
        for field in fields:
            if body.get(field) == ref:
                body[field] = handed_out
        return True

    async def remember_from_event(self, ex: Exchange, event: SSEEvent) -> bool:
        """Record the id the stream's event naming it carries; True once done."""
        found, ref = ex.format.created_id_event(event)
        if found and ref is not None and ex.route.creates is not None:
            await self.remember(ex, ex.route.creates, ref)
        return found


async def _check_owner(ex: Exchange) -> web.StreamResponse | None:
    lookup, ex.follow_lookup = ex.follow_lookup, None
    if lookup is None:
        return None  # the request follows no id (or the check ran already)
    try:
        record = await lookup
    except StateUnavailable:
        return ex.error_response(
            503,
            "the gateway cannot look up this id right now; retry shortly",
            "state_unavailable",
            headers={"Retry-After": "2"},
        )
    # A request without a key (a pipeline without auth) is the tenant "": it follows only ids
    # made without one. A record without an owner predates owners, and is nobody's to follow.
    if record is None or record.owner is None or record.owner != (ex.tenant or ""):
        assert ex.route.follows is not None
        message, code, param = _NOT_FOUND[ex.route.follows]
        if "response_id" in ex.path_params:
            message, code, param = "no such response", "response_not_found", None
        AUTH_REFUSALS.labels(ex.route.name, "not_owner").inc()
        return ex.error_response(404, message, code, param=param)
    ex.followed = record
    return None


def followed_id(ex: Exchange, pin: Pin) -> str | None:
    if pin is Pin.VIDEO_TASK:
        return ex.path_params.get("task_id")
    if "response_id" in ex.path_params:  # a stored response, retrieved, deleted or cancelled
        return ex.path_params["response_id"]
    return ex.format.followed_in_body(ex.json())


def _record(raw: str) -> PinRecord:
    if not raw.startswith("{"):
        return PinRecord(raw, None)  # a channel name alone: recorded before ids had owners
    data = jsonutil.loads(raw)
    return PinRecord(str(data.get("channel", "")), data.get("owner"), data.get("upstream"))


def _key(pin: Pin, ref: str) -> str:
    return f"pin:{pin.value}:{ref}"
