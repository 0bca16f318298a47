"""The images format (endpoints 6, 7): Bearer, usage in the result or the completed stream event."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.formats.base import EmbeddedImage, Format, KeyLocation, Usage, items
from proxy.wire.sse import SSEEvent


class ImagesFormat(Format):
    name = "images"
    reports_usage = True
    key_location = KeyLocation.BEARER

    def asks_for_image_urls(self, body: Any) -> bool:
        return isinstance(body, dict) and body.get("response_format") == "url"

    def embedded_images(self, answer: Any) -> list[EmbeddedImage]:
        found = []
        for item in items(answer, "data"):
            if isinstance(item, dict) and isinstance(item.get("b64_json"), str):
                found.append(EmbeddedImage(item["b64_json"], _url_into(item)))
        return found

    def usage_from_event(self, event: SSEEvent) -> Usage | None:
        if b'"usage"' not in event.raw:
            return None
        return self.usage_from_body(event.json())


def _url_into(item: dict[str, Any]) -> Callable[[str, str], None]:
    def place(url: str, media_type: str) -> None:
        del item["b64_json"]
        item["url"] = url

    return place
