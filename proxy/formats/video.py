"""The video task endpoints (1-5): Bearer; no token usage."""

from __future__ import annotations

from proxy.formats.base import Format, KeyLocation


class VideoTasks(Format):
    name = "video"
    key_location = KeyLocation.BEARER
