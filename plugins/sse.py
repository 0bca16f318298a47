"""SSE passthrough: streams are framed event by event, and usage is read from the events that carry it.

Framing is what lets every other plugin see streams per event; the per-event cost here
is one substring test, and a JSON parse only for the one or two events with usage.
"""

from __future__ import annotations

from proxy.exchange import Exchange
from proxy.pipeline import Plugin
from proxy.sse import SSEEvent


class SSEPassthrough(Plugin):
    name = "sse"

    def on_event(self, ex: Exchange, event: SSEEvent) -> SSEEvent | None:
        usage = ex.format.usage_from_event(event)
        if usage is not None:
            ex.usage.update(usage)
        return event
