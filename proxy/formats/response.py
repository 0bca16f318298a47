"""The response format (endpoint 11): Bearer, usage in the body or the terminal stream event."""

from __future__ import annotations

from typing import Any

from proxy.core import jsonutil
from proxy.formats.base import Format, Generation, KeyLocation, Usage
from proxy.wire.sse import SSEEvent

_TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# A response's status once it has ended, and while it runs (a background response is answered
# queued, and reads as in progress until it ends).
_ENDED = frozenset({"completed", "incomplete", "failed", "cancelled"})
_RUNNING = frozenset({"queued", "in_progress"})


class ResponseFormat(Format):
    name = "responses"
    reports_usage = True
    key_location = KeyLocation.BEARER
    output_field = (("max_output_tokens",),)
    asking_less = "a lower max_output_tokens (and no larger limit under another name)"

    def created_id_event(self, event: SSEEvent) -> tuple[bool, Any]:
        if event.name != "response.created" and b'"response.created"' not in event.raw:
            return False, None
        data = event.json()
        response = data.get("response") if isinstance(data, dict) else None
        return True, response.get("id") if isinstance(response, dict) else None

    def followed_in_body(self, body: Any) -> str | None:
        ref = body.get("previous_response_id") if isinstance(body, dict) else None
        return ref if isinstance(ref, str) else None

    def in_background(self, body: Any) -> bool:
        return isinstance(body, dict) and body.get("background") is True

    def generation_of(self, answer: Any) -> Generation | None:
        """A response object: ended (with its usage, when it says it) or still running."""
        status = answer.get("status") if isinstance(answer, dict) else None
        if status in _ENDED:
            return Generation(True, self.usage_from_body(answer))
        if status in _RUNNING:
            return Generation(False)
        return None

    def generation_in_event(self, event: SSEEvent) -> Generation | None:
        if event.name not in _TERMINAL_EVENTS:
            return None
        data = event.json()
        return self.generation_of(data.get("response") if isinstance(data, dict) else None)

    def usage_from_event(self, event: SSEEvent) -> Usage | None:
        if event.name not in _TERMINAL_EVENTS and b'"usage":{' not in event.raw:
            return None
        data = event.json()
        response = data.get("response") if isinstance(data, dict) else None
        usage = self.usage_from_body(response)
        if usage is not None:
            usage.final = event.name in _TERMINAL_EVENTS
        return usage

    def stream_error(self, status: int, message: str, code: str | None = None) -> bytes:
        code = code or ("server_error" if status >= 500 else "invalid_request")
        # The response format's error event, and the same again under `error`: the openai SDKs raise
        # an APIError with its message only for an event that carries one (else the stream just ends,
        # and a client learns no more than that no response.completed came).
        payload = {
            "type": "error",
            "code": code,
            "message": message,
            "param": None,
            "error": {
                "type": "server_error" if status >= 500 else "invalid_request_error",
                "code": code,
                "message": message,
            },
        }
        return b"event: error\ndata: " + jsonutil.dumps(payload) + b"\n\n"
