"""Usage capture from JSON answers: input and output tokens as the upstream reported them."""

from __future__ import annotations

from proxy.exchange import Exchange, UpstreamResponse
from proxy.pipeline import Plugin


class UsageCapture(Plugin):
    name = "usage"

    async def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        if upstream.status >= 400 or not upstream.is_json:
            return
        usage = ex.format.usage_from_body(upstream.json())
        if usage is not None:
            ex.usage.update(usage)
