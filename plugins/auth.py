"""Auth: the gateway key, read from the place the endpoint's format names (spec section 5) and,
unless `server.strict_interface`, where the format's official SDK sends it.

Missing, unknown, disabled or expired keys get 401; a key not allowed for the endpoint
or the model gets 403; both in the endpoint's own error shape. The key's name, never the
key, is what the exchange, and so every log line, carries.

Whether an id a request follows (a video task, a previous response) is its caller's tenant's
is the core's check, once this plugin has named the caller (proxy.request.affinity).
"""

from __future__ import annotations

from datetime import datetime, timezone

from aiohttp import web

from proxy.config import GatewayConfig
from proxy.core.exchange import Exchange
from proxy.core.plugin import STORED_KEYS, Joins, Plugin
from proxy.formats.base import KeyLocation
from proxy.observability.metrics import AUTH_REFUSALS
from proxy.policy.keys import KeyRing


class Auth(Plugin):
    name = "auth"
    provides = frozenset({"caller"})
    joins = Joins(keyed=True)
    order = 100
    before_owner_check = True  # reads nothing that belongs to a followed id

    @staticmethod
    def _refuse(ex: Exchange, status: int, message: str, code: str) -> web.Response:
        AUTH_REFUSALS.labels(ex.route.name, code).inc()
        return ex.error_response(status, message, code)

    def configure(self, config: GatewayConfig) -> None:
        self.keys = KeyRing.from_config(config, self.resources.get(STORED_KEYS))
        self.strict = config.server.strict_interface

    def on_request(self, ex: Exchange) -> web.StreamResponse | None:  # never waits: no coroutine
        fmt = ex.route.format  # its places, even where the answer speaks another format (`GET /v1/models`)
        if fmt.key_location is KeyLocation.NONE:
            return None
        assert ex.target is not None
        presented = fmt.client_keys(ex.request.headers, ex.target.key_values(), self.strict)
        if not presented:
            places = " or ".join(location.described for location in fmt.key_locations(self.strict))
            return self._refuse(ex, 401, f"no API key: send it in {places}", "missing_api_key")
        if len(presented) > 1:  # which one would be charged is not the gateway's guess to make
            return self._refuse(ex, 401, "two different API keys in one request: send one", "ambiguous_api_key")
        key = self.keys.find(presented[0])
        if key is None:
            return self._refuse(ex, 401, "invalid API key", "invalid_api_key")
        ex.key = key
        if not key.enabled:
            return self._refuse(ex, 401, f"API key '{key.name}' is disabled", "api_key_disabled")
        if key.expired(datetime.now(timezone.utc)):
            return self._refuse(ex, 401, f"API key '{key.name}' has expired", "api_key_expired")
        if not key.allows_route(ex.route.name):
            return self._refuse(
                ex, 403, f"API key '{key.name}' may not use {ex.route.method} {ex.route.path}", "endpoint_not_allowed"
            )
        if ex.model is not None and not key.allows_model(ex.model):
            return self._refuse(ex, 403, f"API key '{key.name}' may not use model '{ex.model}'", "model_not_allowed")
        return None
