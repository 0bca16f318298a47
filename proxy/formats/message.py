"""The message format (endpoint 8): x-api-key, `{error: {type, message, code}}`, usage in two events."""

from __future__ import annotations

from typing import Any

from proxy import jsonutil
from proxy.formats.base import Format, KeyLocation, Usage, token_count
from proxy.sse import SSEEvent

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error"}


class MessageFormat(Format):
    name = "messages"
    key_location = KeyLocation.X_API_KEY

    def error_payload(self, status: int, message: str, code: str | None = None,
                      param: str | None = None) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        return {"error": {"type": kind, "message": message, "code": code or kind}}

    def usage_from_event(self, event: SSEEvent) -> Usage | None:
        # Only message_start (input) and message_delta (output) carry usage; a substring
        # test spares parsing every text delta.
        if b'"usage"' not in event.raw:
            return None
        data = event.json()
        if not isinstance(data, dict):
            return None
        if data.get("type") == "message_start":
            return self.usage_from_body(data.get("message"))
        if data.get("type") == "message_delta":
            usage = data.get("usage")
            if not isinstance(usage, dict):
                delta = data.get("delta")
                usage = delta.get("usage") if isinstance(delta, dict) else None
            if isinstance(usage, dict):
                return Usage(token_count(usage, "input_tokens"), token_count(usage, "output_tokens"))
        return None

    def stream_error(self, status: int, message: str, code: str | None = None) -> bytes:
        payload = {"type": "error", **self.error_payload(status, message, code)}
        return b"event: error\ndata: " + jsonutil.dumps(payload) + b"\n\n"
