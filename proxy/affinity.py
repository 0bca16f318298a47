"""Affinity: a video task or response id leads back to the channel that created it.

The id the client holds is the upstream's own, unchanged; the gateway remembers which
channel issued it in the state store (memory, or Redis shared by every instance), so a
status poll, a download or a `previous_response_id` lands on the same channel from any
gateway instance.
"""

from __future__ import annotations

import logging
from typing import Any

from proxy.exchange import Exchange
from proxy.routes import Pin
from proxy.sse import SSEEvent
from proxy.state import StateStore

log = logging.getLogger("modelgate.affinity")

_MAX_ID_LENGTH = 512


class Affinity:
    __slots__ = ("_store", "_ttl_s")

    def __init__(self, store: StateStore, ttl_s: int) -> None:
        self._store = store
        self._ttl_s = ttl_s

    async def channel_for(self, ex: Exchange) -> str | None:
        """The channel that made the id this request follows, if it names one the gateway knows."""
        pin = ex.route.follows
        if pin is None:
            return None
        ref = followed_id(ex, pin)
        if not ref:
            return None
        try:
            return await self._store.get(_key(pin, ref))
        except Exception:
            # State unreachable: the request still goes to a channel that serves it.
            log.warning("could not read affinity; choosing a channel afresh", extra={"request_id": ex.request_id})
            return None

    async def remember(self, ex: Exchange, pin: Pin, ref: Any) -> None:
        if not isinstance(ref, str) or not ref or len(ref) > _MAX_ID_LENGTH or ex.channel is None:
            return
        try:
            await self._store.set(_key(pin, ref), ex.channel.name, self._ttl_s)
        except Exception:
            # The answer is already good; losing the pin costs a later poll, not this request.
            log.exception("could not record affinity", extra={"request_id": ex.request_id})

    async def remember_from_body(self, ex: Exchange, body: Any) -> None:
        pin = ex.route.creates
        if pin is None or not isinstance(body, dict):
            return
        ref = body.get("task_id") or body.get("id") if pin is Pin.VIDEO_TASK else body.get("id")
        await self.remember(ex, pin, ref)

    async def remember_from_event(self, ex: Exchange, event: SSEEvent) -> bool:
        """Record the response id of a `response.created` event; True once done."""
        if event.name != "response.created" and b'"response.created"' not in event.raw:
            return False
        data = event.json()
        response = data.get("response") if isinstance(data, dict) else None
        if isinstance(response, dict):
            await self.remember(ex, Pin.RESPONSE, response.get("id"))
        return True


def followed_id(ex: Exchange, pin: Pin) -> str | None:
    if pin is Pin.VIDEO_TASK:
        return ex.path_params.get("task_id")
    body = ex.json()
    ref = body.get("previous_response_id") if isinstance(body, dict) else None
    return ref if isinstance(ref, str) else None


def _key(pin: Pin, ref: str) -> str:
    return f"pin:{pin.value}:{ref}"
