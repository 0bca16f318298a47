"""The images format (endpoints 6, 7): Bearer, usage in the result or the completed stream event."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.formats.base import EmbeddedImage, Format, KeyLocation, Usage, items
from proxy.formats.counts import asked_count
from proxy.wire.sse import SSEEvent


@dataclass(slots=True, frozen=True)
class ImageMade:
    """One image an answer holds, as the answer names its size and quality (else as the request asked)."""

    size: str | None
    quality: str | None


class ImagesFormat(Format):
    name = "images"
    reports_usage = True
    key_location = KeyLocation.BEARER
    asking_less = "fewer images (n, partial_images)"

    def asks_for_image_urls(self, body: Any) -> bool:
        return isinstance(body, dict) and body.get("response_format") == "url"

    def outputs(self, body: Any) -> int:
        """`n` images and `partial_images` previews (a preview costs no more than an image)."""
        return (asked_count(body, "n") or 1) + (asked_count(body, "partial_images") or 0)

    def embedded_images(self, answer: Any) -> list[EmbeddedImage]:
        found = []
        for item in items(answer, "data"):
            if isinstance(item, dict) and isinstance(item.get("b64_json"), str):
                found.append(EmbeddedImage(item["b64_json"], _url_into(item)))
        return found

    @staticmethod
    def images_made(answer: Any, asked: Any) -> list[ImageMade]:
        """The images of a (JSON) answer, each with the size and quality they were made at."""
        made = items(answer, "data")
        size, quality = _said(answer, asked, "size"), _said(answer, asked, "quality")
        return [ImageMade(size, quality) for _ in made]

    @staticmethod
    def image_in_event(event: SSEEvent) -> ImageMade | None:
        """The image a stream's `*.completed` event carries (partial images are previews, not images made)."""
        if not (event.name or "").endswith(".completed") and b'.completed"' not in event.raw[:200]:
            return None
        data = event.json()
        if not isinstance(data, dict) or not str(data.get("type", "")).endswith(".completed"):
            return None
        return ImageMade(_said(data, None, "size"), _said(data, None, "quality"))

    def usage_from_event(self, event: SSEEvent) -> Usage | None:
        if b'"usage"' not in event.raw:
            return None
        return self.usage_from_body(event.json())


def _url_into(item: dict[str, Any]) -> Callable[[str, str], None]:
    def place(url: str, media_type: str) -> None:
        del item["b64_json"]
        item["url"] = url

    return place


def _said(answer: Any, asked: Any, field: str) -> str | None:
    for source in (answer, asked):
        value = source.get(field) if isinstance(source, dict) else None
        if isinstance(value, str) and len(value) <= 32:
            return value
    return None
