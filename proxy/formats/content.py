"""The content-generation format (endpoints 9, 10): ?key=, google.rpc-style errors, usageMetadata."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from proxy.core import jsonutil
from proxy.formats.base import EmbeddedImage, Format, KeyLocation, Usage, items, token_count
from proxy.formats.counts import asked_count
from proxy.wire.sse import SSEEvent

STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "PAYLOAD_TOO_LARGE",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_DATA_URL = re.compile(r"data:(image/[A-Za-z0-9.+-]+);base64,([A-Za-z0-9+/=]+)")
# Status names a caller may ask for where the HTTP status alone is ambiguous (two 400s in 7.2).
_NAMED = frozenset(STATUS_NAMES.values()) | {"FAILED_PRECONDITION", "OUT_OF_RANGE", "ALREADY_EXISTS"}


class ContentFormat(Format):
    name = "content"
    reports_usage = True
    key_location = KeyLocation.QUERY
    sdk_key_locations = (KeyLocation.GOOG_API_KEY,)  # the content SDK cannot put its key in the query
    # The upstream reads a field by its JSON name or its proto (snake_case) name.
    output_field = (
        ("generationConfig", "maxOutputTokens"),
        ("generationConfig", "max_output_tokens"),
        ("generation_config", "max_output_tokens"),
        ("generation_config", "maxOutputTokens"),
    )
    asking_less = (
        "a lower generationConfig.maxOutputTokens (and no larger limit under another name), or fewer candidates"
    )

    def outputs(self, body: Any) -> int:
        """`candidateCount` answers, each up to the output limit: the most any spelling names (an
        upstream reads the JSON and the proto names alike)."""
        if not isinstance(body, dict):
            return 1
        return max(
            asked_count(body, config, name) or 1
            for config in ("generationConfig", "generation_config")
            for name in ("candidateCount", "candidate_count")
        )

    def versioned_path(self, path: str, version: str | None) -> str:
        if version is None:
            return path  # the client's own: `/v1/models/...` or `/v1beta/models/...`
        _, _, rest = path.partition("/models/")
        return f"/{version}/models/{rest}"

    def model_entry(self, model: str) -> dict[str, Any]:
        return {
            "name": f"models/{model}",
            "displayName": model,
            "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"],
        }

    def model_list(self, models: list[str]) -> dict[str, Any]:
        return {"models": [self.model_entry(m) for m in models]}

    def error_payload(
        self, status: int, message: str, code: str | None = None, param: str | None = None
    ) -> dict[str, Any]:
        name = code if code in _NAMED else STATUS_NAMES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
        error: dict[str, Any] = {"code": status, "message": message, "status": name}
        if code and code not in _NAMED:
            # google.rpc's place for a machine-readable reason (spec 7.3's codes among them)
            error["details"] = [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": code, "domain": "modelgate"}
            ]
        return {"error": error}

    def asks_for_image_urls(self, body: Any) -> bool:
        config = _either(body, "generationConfig", "generation_config")
        response_format = _either(config, "responseFormat", "response_format")
        image = response_format.get("image") if isinstance(response_format, dict) else None
        return isinstance(image, dict) and image.get("delivery") == "URI"

    def without_delivery_fields(self, body: Any) -> Any:
        """`generationConfig.responseFormat` is the gateway's field, never the upstream's."""
        if not isinstance(body, dict):
            return None
        key = "generationConfig" if "generationConfig" in body else "generation_config"
        config = {
            k: v
            for k, v in (_either(body, "generationConfig", "generation_config") or {}).items()
            if k not in ("responseFormat", "response_format")
        }
        return {**body, key: config}

    def embedded_images(self, answer: Any) -> list[EmbeddedImage]:
        """Inline image parts, and images some upstreams embed in text as Markdown data URLs."""
        found = []
        for candidate in items(answer, "candidates"):
            for part in items(candidate.get("content") if isinstance(candidate, dict) else None, "parts"):
                if not isinstance(part, dict):
                    continue
                inline = _either(part, "inlineData", "inline_data")
                if isinstance(inline, dict) and isinstance(inline.get("data"), str):
                    found.append(EmbeddedImage(inline["data"], _file_data_into(part)))
                elif isinstance(part.get("text"), str) and "data:image/" in part["text"]:
                    found.extend(
                        EmbeddedImage(match[2], _url_for_data_url(part, match[0]))
                        for match in _DATA_URL.finditer(part["text"])
                    )
        return found

    def response_id_of(self, answer: Any) -> str | None:
        found = answer.get("responseId") if isinstance(answer, dict) else None
        return found if isinstance(found, str) else None

    def usage_from_body(self, body: Any) -> Usage | None:
        if isinstance(body, list):  # a non-SSE stream answer is a JSON array of chunks
            body = body[-1] if body else None
        meta = body.get("usageMetadata") if isinstance(body, dict) else None
        if not isinstance(meta, dict):
            return None
        output = token_count(meta, "candidatesTokenCount")
        thoughts = token_count(meta, "thoughtsTokenCount")
        if thoughts is not None:
            output = (output or 0) + thoughts
        return Usage(
            token_count(meta, "promptTokenCount"),
            output,
            token_count(meta, "cachedContentTokenCount"),
            thoughts,
            final=True,
        )

    def usage_from_event(self, event: SSEEvent) -> Usage | None:
        """A stream's chunks carry a running count; only the one that finishes the answer (a
        candidate's `finishReason`) carries the last."""
        if b'"usageMetadata"' not in event.raw:
            return None
        chunk = event.json()
        usage = self.usage_from_body(chunk)
        if usage is not None:
            usage.final = any(
                isinstance(candidate, dict) and candidate.get("finishReason")
                for candidate in items(chunk, "candidates")
            )
        return usage

    def stream_error(self, status: int, message: str, code: str | None = None) -> bytes:
        return b"data: " + jsonutil.dumps(self.error_payload(status, message, code)) + b"\n\n"


def _either(mapping: Any, name: str, snake: str) -> Any:
    """A field by its JSON name or its proto (snake_case) name, both of which the upstream reads."""
    return (mapping.get(name) or mapping.get(snake)) if isinstance(mapping, dict) else None


def _file_data_into(part: dict[str, Any]) -> Callable[[str, str], None]:
    def place(url: str, media_type: str) -> None:
        part.pop("inlineData", None)
        part.pop("inline_data", None)
        part["fileData"] = {"mimeType": media_type, "fileUri": url}

    return place


def _url_for_data_url(part: dict[str, Any], data_url: str) -> Callable[[str, str], None]:
    def place(url: str, media_type: str) -> None:
        part["text"] = part["text"].replace(data_url, url, 1)

    return place
