"""The video task endpoints (1-5): Bearer; no token usage.

Endpoints 1-2 answer in the interface's shapes (2.2, 2.3). Endpoints 3-5 (`/v1/videos`), whose
shapes the interface leaves open, speak the video API the response SDK calls: a submission and a
status are both the SDK's video object, and `GET /v1/videos` lists them.
"""

from __future__ import annotations

from typing import Any

from proxy.formats.base import Format, KeyLocation
from proxy.formats.counts import asked_count

LONGEST_SECONDS = 8.0  # the interface's longest duration (section 8): what a submission naming none is taken at
# A normalised status (plugins/video.py) in the SDK's words.
_SDK_STATUS = {"queued": "queued", "in_progress": "in_progress", "succeeded": "completed", "failed": "failed"}


class VideoFormat(Format):
    name = "video"
    id_fields = ("task_id", "id")  # the spec's task_id, the video SDK's id
    key_location = KeyLocation.BEARER
    asking_less = "fewer or shorter videos (sampleCount, durationSeconds or seconds)"

    @staticmethod
    def seconds_asked(body: Any) -> float:
        """The seconds a submission asks for: spec 2.1's `metadata.durationSeconds`, or the video
        SDK's `seconds`; the larger when it names both, since an upstream may read either (0 when
        it names none)."""
        if not isinstance(body, dict):
            return 0.0
        metadata = body.get("metadata")
        found = 0.0
        for value in (metadata.get("durationSeconds") if isinstance(metadata, dict) else None, body.get("seconds")):
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                continue
            try:
                seconds = float(value)
            except ValueError:
                continue
            if 0 < seconds <= 3600:
                found = max(found, seconds)
        return found

    @staticmethod
    def seconds_made(body: Any) -> tuple[float, bool]:
        """The seconds of video a submission makes: those it asks for, times `metadata.sampleCount`
        videos; one that names no duration is taken at the interface's longest, and says it
        (True) was assumed."""
        asked = VideoFormat.seconds_asked(body)
        return (asked or LONGEST_SECONDS) * VideoFormat.videos_asked(body), not asked

    @staticmethod
    def videos_asked(body: Any) -> int:
        """`metadata.sampleCount` videos (1 when it names none), as the upstream reads the count: a
        count the schema refuses never gets this far, and one that did is charged as sent."""
        return asked_count(body, "metadata", "sampleCount") or 1

    def outputs(self, body: Any) -> int:
        return self.videos_asked(body)

    @staticmethod
    def video_object(
        task_id: str, task: dict[str, Any], normal: dict[str, Any] | None, filtered_message: str | None = None
    ) -> dict[str, Any]:
        """The SDK's video object for a task: what its submission said (`task`), and its last
        known status (`normal`, None: never polled, so queued). A filtered video has no content:
        to the SDK it is a failure, `content_filtered`."""
        normal = normal or {"status": "queued"}
        status = _SDK_STATUS.get(normal["status"], "queued")
        error = normal.get("error")
        if normal.get("filtered"):
            status, error = "failed", {"code": "content_filtered", "message": filtered_message or normal["message"]}
        progress = normal.get("progress")
        return {
            "id": task_id,
            "object": "video",
            "model": task.get("model"),
            "status": status,
            "progress": 100 if status == "completed" else progress if isinstance(progress, int) else 0,
            "created_at": task.get("created_at"),
            "completed_at": normal.get("completed_at"),
            "expires_at": None,
            "prompt": task.get("prompt"),
            "seconds": task.get("seconds"),
            "size": task.get("size"),
            "remixed_from_video_id": None,
            "error": error if status == "failed" else None,
        }

    @staticmethod
    def video_list(objects: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
        return {
            "object": "list",
            "data": objects,
            "has_more": has_more,
            "first_id": objects[0]["id"] if objects else None,
            "last_id": objects[-1]["id"] if objects else None,
        }
