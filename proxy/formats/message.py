"""The message format (endpoint 8): x-api-key, `{error: {type, message, code}}`, usage in two events."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core import jsonutil
from proxy.formats.base import Format, KeyLocation, Usage, token_count
from proxy.wire.sse import SSEEvent

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


class MessageFormat(Format):
    name = "messages"
    reports_usage = True
    key_location = KeyLocation.X_API_KEY
    output_field = (("max_tokens",),)
    asking_less = "a lower max_tokens (and no larger limit under another name)"
    sdk_key_locations = (KeyLocation.BEARER,)  # the message SDK's `api_key` travels as a Bearer token
    # The version header the spec names, and the one the format's SDKs send; either satisfies
    # endpoint 8 (the second unless `server.strict_interface`). When both come, the spec's is the
    # client's version and the other is dropped (`place_version`): an SDK sends its own on every
    # call, whatever version the client set in the spec's header, so two that differ are no
    # mistake of the client's to refuse (the SDK upgrade that changes its value breaks nothing).
    version_header = "msgapi-version"
    sdk_version_header = "anthropic-version"

    def betas(self, headers: CIMultiDictProxy[str]) -> str:
        return ",".join((*headers.getall("msgapi-beta", ()), *headers.getall("anthropic-beta", ())))

    def missing_version(self, headers: Mapping[str, str], strict: bool) -> tuple[str, str] | None:
        for header in (self.version_header, self.sdk_version_header):
            if len(set(_values(headers, header))) > 1:  # which would an upstream read? Not the gateway's guess
                return header, "given more than once, with different values: send one"
        spec, sdk = _version(headers, self.version_header), _version(headers, self.sdk_version_header)
        if spec or not strict and sdk:
            return None
        also = "" if strict else f" ({self.sdk_version_header} is read in its place)"
        return self.version_header, f"this header is required (for example 2023-06-01){also}"

    def place_version(self, headers: CIMultiDict[str], name: str | None, sent: CIMultiDictProxy[str]) -> None:
        """Send the client's API version under the header a channel asks for (`version_header`),
        and only there; None: under the header the client sent it in (both, when both came with
        one value: an upstream reading either finds it; the spec's alone when they differ). Set
        afresh for every attempt, from what the client sent, so a channel failed over from leaves
        no choice of its own behind."""
        for header in (self.version_header, self.sdk_version_header):
            headers.popall(header, None)
        spec, sdk = _version(sent, self.version_header), _version(sent, self.sdk_version_header)
        if name is None:
            if spec:
                headers[self.version_header] = spec
            if sdk and (not spec or sdk == spec):
                headers[self.sdk_version_header] = sdk
            return
        if spec or sdk:
            headers[name] = spec or sdk  # type: ignore[assignment]

    def model_entry(self, model: str) -> dict[str, Any]:
        return {"type": "model", "id": model, "display_name": model, "created_at": "1970-01-01T00:00:00Z"}

    def model_list(self, models: list[str]) -> dict[str, Any]:
        return {
            "data": [self.model_entry(m) for m in models],
            "has_more": False,
            "first_id": models[0] if models else None,
            "last_id": models[-1] if models else None,
        }

    def error_payload(
        self, status: int, message: str, code: str | None = None, param: str | None = None
    ) -> dict[str, Any]:
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
        if data.get("type") == "message_start":  # the prompt, and a placeholder for the output
            message = data.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            return _usage(usage, final=False) if isinstance(usage, dict) else None
        if data.get("type") == "message_delta":  # the closing counts
            usage = data.get("usage")
            if not isinstance(usage, dict):
                delta = data.get("delta")
                usage = delta.get("usage") if isinstance(delta, dict) else None
            if isinstance(usage, dict):
                return _usage(usage)
        return None

    def usage_from_body(self, body: Any) -> Usage | None:
        usage = body.get("usage") if isinstance(body, dict) else None
        return _usage(usage) if isinstance(usage, dict) else None

    def stream_error(self, status: int, message: str, code: str | None = None) -> bytes:
        payload = {"type": "error", **self.error_payload(status, message, code)}
        return b"event: error\ndata: " + jsonutil.dumps(payload) + b"\n\n"


def _usage(usage: dict[str, Any], final: bool = True) -> Usage:
    """This format counts the prompt's cached parts beside `input_tokens`, not among them: the
    gateway's Usage counts the whole prompt, what was read from the cache among it."""
    fresh = token_count(usage, "input_tokens")
    read = token_count(usage, "cache_read_input_tokens")
    written = token_count(usage, "cache_creation_input_tokens")
    whole = None if fresh is None else fresh + (read or 0) + (written or 0)
    return Usage(whole, token_count(usage, "output_tokens"), read, final=final)


def _values(headers: Mapping[str, str], name: str) -> list[str]:
    """A header's values, each line's own and each of a comma-joined line's, blank ones left out."""
    lines = headers.getall(name, []) if hasattr(headers, "getall") else [headers[name]] if name in headers else []
    return [value.strip() for line in lines for value in line.split(",") if value.strip()]


def _version(headers: Mapping[str, str], name: str) -> str | None:
    """The one version a header carries (an empty one is none), once it is known to be one."""
    found = _values(headers, name)
    return found[0] if found else None
