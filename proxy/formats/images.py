"""The images format (endpoints 6, 7): Bearer, usage in the result or the completed stream event."""

from __future__ import annotations


from proxy.formats.base import Format, KeyLocation, Usage
from proxy.sse import SSEEvent


class ImagesFormat(Format):
    name = "images"
    key_location = KeyLocation.BEARER

    def usage_from_event(self, event: SSEEvent) -> Usage | None:
        if b'"usage"' not in event.raw:
            return None
        return self.usage_from_body(event.json())
