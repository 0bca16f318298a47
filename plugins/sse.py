"""SSE passthrough: streams are framed event by event, and usage is read from the events that carry it.

Framing is what lets every other plugin see streams per event; the per-event cost here
is one substring test, and a JSON parse only for the one or two events with usage.
"""

from __future__ import annotations

from proxy.core.exchange import Exchange
from proxy.core.plugin import Joins, Plugin
from proxy.wire.sse import SSEEvent

_LOOKED_FOR_ID = 3  # the events that may name the answer: the first few


class SSEPassthrough(Plugin):
    name = "sse"
    provides = frozenset({"stream usage"})
    joins = Joins(usage=True, metered=True)  # the endpoints, and a stored response's stream resumed
    order = 600

    def on_event(self, ex: Exchange, event: SSEEvent) -> SSEEvent | None:
        usage = ex.format.usage_from_event(event)
        # The opening events name the answer (parsed for their usage already); a ping may come first.
        if not ex.outcome.response_id and ex.outcome.events < _LOOKED_FOR_ID:
            ex.outcome.identified(ex.format.response_id_of(event.json()))
        if usage is not None:
            if ex.route.creates is not None or ex.route.follows is None:  # a resumed stream costs nothing itself
                ex.usage.update(usage)
            if usage.final and (generation := ex.format.generation_in_event(event)) is not None:
                ex.generation = generation
        return event
