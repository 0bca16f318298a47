"""Usage capture from JSON answers: input and output tokens as the upstream reported them, and what
an answer tells of a generation that may outlive it (a background response)."""

from __future__ import annotations

from proxy.core.exchange import Exchange
from proxy.core.plugin import Joins, Plugin
from proxy.core.upstream_response import UpstreamResponse


class UsageCapture(Plugin):
    name = "usage"
    provides = frozenset({"answer usage"})
    # The spec's endpoints whose answers report usage, and the calls that read what they made (a
    # stored response, its cancel), which report how a generation left running ended.
    joins = Joins(usage=True, metered=True)
    order = 500

    def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:  # never waits: no coroutine
        if upstream.status >= 400 or not upstream.is_json:
            return
        body = upstream.json()
        ex.outcome.identified(ex.format.response_id_of(body))
        generation = ex.format.generation_of(body)
        if generation is not None:
            ex.generation = generation
        if ex.route.follows is not None and ex.route.creates is None:
            return  # a follow-up's answer tells of the generation it reads, not of a cost of its own
        usage = ex.format.usage_from_body(body)
        if usage is not None:
            ex.usage.update(usage)
