"""Auth: the gateway key, read only from the place the endpoint's format names (spec section 5).

Missing, unknown, disabled or expired keys get 401; a key not allowed for the endpoint
or the model gets 403; both in the endpoint's own error shape. The key's name, never the
key, is what the exchange, and so every log line, carries.
"""

from __future__ import annotations

from datetime import datetime, timezone

from aiohttp import web

from proxy.config import GatewayConfig
from proxy.exchange import Exchange
from proxy.formats.base import KeyLocation
from proxy.keys import GatewayKey, KeyRing
from proxy.observability.metrics import AUTH_REFUSALS
from proxy.pipeline import Plugin

_WHERE = {
    KeyLocation.BEARER: "an 'Authorization: Bearer <key>' header",
    KeyLocation.X_API_KEY: "an 'x-api-key' header",
    KeyLocation.QUERY: "the 'key' query parameter",
}


def key_ring(config: GatewayConfig) -> KeyRing:
    return KeyRing([
        GatewayKey.build(k.name, bytes.fromhex(k.digest_hex()), enabled=k.enabled, expires_at=k.expires_at,
                         models=k.models, endpoints=k.endpoints, url_delivery=k.url_delivery, labels=k.labels,
                         limits=k.limits)
        for k in config.keys])


class Auth(Plugin):
    name = "auth"

    @staticmethod
    def _refuse(ex: Exchange, status: int, message: str, code: str) -> web.Response:
        AUTH_REFUSALS.labels(ex.route.name, code).inc()
        return ex.error_response(status, message, code)

    def configure(self, config: GatewayConfig) -> None:
        self.keys = key_ring(config)

    async def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        location = ex.format.key_location
        if location is KeyLocation.NONE:
            return None
        presented = ex.format.client_key(ex.request)
        if not presented:
            return self._refuse(ex, 401, f"no API key: send it in {_WHERE[location]}", "missing_api_key")
        key = self.keys.find(presented)
        if key is None:
            return self._refuse(ex, 401, "invalid API key", "invalid_api_key")
        ex.key, ex.key_name = key, key.name
        if not key.enabled:
            return self._refuse(ex, 401, f"API key '{key.name}' is disabled", "api_key_disabled")
        if key.expired(datetime.now(timezone.utc)):
            return self._refuse(ex, 401, f"API key '{key.name}' has expired", "api_key_expired")
        if not key.allows_route(ex.route.name):
            return self._refuse(ex, 403, f"API key '{key.name}' may not use {ex.route.method} {ex.request.path}",
                                     "endpoint_not_allowed")
        if ex.model is not None and not key.allows_model(ex.model):
            return self._refuse(ex, 403, f"API key '{key.name}' may not use model '{ex.model}'", "model_not_allowed")
        return None
