"""Usage capture from JSON answers: input and output tokens as the upstream reported them."""

from __future__ import annotations

from proxy.exchange import Exchange, UpstreamResponse
from proxy.plugin import Plugin
from proxy.routes import Route


class UsageCapture(Plugin):
    name = "usage"
    order = 500

    @classmethod
    def default(cls, route: Route) -> bool:
        return route.number > 0 and route.format.reports_usage  # an endpoint of the spec, not a call around one

    async def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        if upstream.status >= 400 or not upstream.is_json:
            return
        usage = ex.format.usage_from_body(upstream.json())
        if usage is not None:
            ex.usage.update(usage)
