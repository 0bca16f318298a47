"""The response format (endpoint 11): Bearer, usage in the body or the terminal stream event."""

from __future__ import annotations

from proxy.formats.base import Format, KeyLocation, Usage
from proxy.wire import jsonutil
from proxy.wire.sse import SSEEvent

_TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponseFormat(Format):
    name = "responses"
    reports_usage = True
    key_location = KeyLocation.BEARER

    def usage_from_event(self, event: SSEEvent) -> Usage | None:
        if event.name not in _TERMINAL_EVENTS and b'"usage":{' not in event.raw:
            return None
        data = event.json()
        response = data.get("response") if isinstance(data, dict) else None
        return self.usage_from_body(response)

    def stream_error(self, status: int, message: str, code: str | None = None) -> bytes:
        payload = {"type": "error", "code": code or ("server_error" if status >= 500 else "invalid_request"),
                   "message": message, "param": None}
        return b"event: error\ndata: " + jsonutil.dumps(payload) + b"\n\n"
