"""Video task requests: spec 2.1 (endpoint 1), and the video API of the response SDK (endpoint 3)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from proxy.schemas.common import Model
from proxy.schemas.enums import UPSTREAMS, open_enum

VIDEO_MODELS = (
    "videogen-3.0-generate-001",
    "videogen-3.0-fast-generate-001",
    "videogen-3.1-generate-preview",
    "videogen-3.1-fast-generate-preview",
)


MOST_SAMPLES = 4


class VideoMetadata(Model):
    aspectRatio: open_enum("metadata.aspectRatio", ("16:9", "9:16"), UPSTREAMS) | None = None
    # Closed: section 8's limit, and charges are by the video second.
    durationSeconds: Literal[4, 6, 8] | None = None
    negativePrompt: str | None = None
    personGeneration: open_enum("metadata.personGeneration", ("allow_all", "allow_adult"), UPSTREAMS) | None = None
    resolution: str | None = Field(default=None, pattern=r"^\d{3,4}p$")
    # The spec names no most; the video models make at most 4 a request, and every one is paid for:
    # a count past it is refused here, not charged as one video or sent upstream unchecked.
    sampleCount: int | None = Field(default=None, ge=1, le=MOST_SAMPLES)
    storageUri: str | None = None


class VideoRequest(Model):
    model: Literal[VIDEO_MODELS]  # type: ignore[valid-type]  # closed: routing and prices go by it
    prompt: str = Field(min_length=1)
    metadata: VideoMetadata | None = None


class VideosRequest(VideoRequest):
    """Endpoint 3, whose shape the interface leaves open: 2.1's fields, and the SDK's `seconds`
    and `size`. Sent as JSON or, as the SDK sends it, as multipart/form-data (values as text)."""

    # Closed: the interface's durations (section 8), as the SDK writes them; charges are by the second.
    seconds: Literal["4", "6", "8"] | None = None
    size: str | None = Field(default=None, pattern=r"^[1-9][0-9]{1,4}x[1-9][0-9]{1,4}$")
