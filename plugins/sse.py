"""SSE passthrough: streams are framed event by event, and usage is read from the events that carry it.

Framing is what lets every other plugin see streams per event; the per-event cost here
is one substring test, and a JSON parse only for the one or two events with usage.
"""

from __future__ import annotations

from proxy.plugin import Joins, Plugin
from proxy.request.exchange import Exchange
from proxy.wire.sse import SSEEvent


class SSEPassthrough(Plugin):
    name = "sse"
    joins = Joins(endpoint=True, usage=True)
    order = 600

    def on_event(self, ex: Exchange, event: SSEEvent) -> SSEEvent | None:
        usage = ex.format.usage_from_event(event)
        if usage is not None:
            ex.usage.update(usage)
        return event
