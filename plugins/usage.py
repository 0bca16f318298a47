"""Usage capture from JSON answers: input and output tokens as the upstream reported them."""

from __future__ import annotations

from proxy.plugin import Joins, Plugin
from proxy.request.exchange import Exchange, UpstreamResponse


class UsageCapture(Plugin):
    name = "usage"
    joins = Joins(endpoint=True, usage=True)  # the spec's endpoints, not the calls around them
    order = 500

    async def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        if upstream.status >= 400 or not upstream.is_json:
            return
        usage = ex.format.usage_from_body(upstream.json())
        if usage is not None:
            ex.usage.update(usage)
