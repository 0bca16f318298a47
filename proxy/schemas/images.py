"""Image generation and edit requests (spec 2.4-2.6, 4 rules 2-3, 8), with their cross-field rules."""

from __future__ import annotations

import base64
import re
from typing import Literal

from pydantic import Field, model_validator

from proxy.schemas.common import Model
from proxy.schemas.enums import UPSTREAMS, open_enum
from proxy.schemas.imagefiles import sniff

CUSTOM_SIZE_MODELS = (
    "imagegen-2",
    "imagegen-2.5-sunburst",
    "imagegen-2.5-flare",
    "imagegen-2.5-sunburst-2026-09-08",
    "imagegen-2.5-flare-2026-09-08",
)
TOP_QUALITY_MODELS = CUSTOM_SIZE_MODELS[1:]
IMAGE_MODELS = ("imagegen-1", "imagegen-1.5", *CUSTOM_SIZE_MODELS)
STANDARD_SIZES = ("1024x1024", "1536x1024", "1024x1536", "auto")
MAX_EDIT_IMAGES = 16
MAX_IMAGE_BYTES = 25 * 1024 * 1024
MAX_MASK_BYTES = 4 * 1024 * 1024
# ASCII digits, no leading zero, nothing after: prices match the size as written (`\d` took
# fullwidth and Arabic-Indic digits, `$` a trailing newline).
_SIZE = re.compile(r"([1-9][0-9]{0,5})x([1-9][0-9]{0,5})")
# 2.4's qualities, and those the images SDK also sends (`standard`, `hd`): a closed list, since
# charges read it (proxy/config/prices.py prices by size and quality), tracking the SDK's.
QUALITIES = ("low", "medium", "high", "auto", "xhigh", "max", "standard", "hd")


def custom_size_problem(size: str) -> str | None:
    """Why WIDTHxHEIGHT breaks spec 2.6 (all limits inclusive), or None."""
    match = _SIZE.fullmatch(size)
    if not match:
        return f"must be one of {', '.join(STANDARD_SIZES)} or WIDTHxHEIGHT"
    width, height = int(match[1]), int(match[2])
    if width % 16 or height % 16:
        return "custom width and height must be multiples of 16"
    if max(width, height) > 3840:
        return "custom edges may not exceed 3840 pixels"
    if not (width <= 3 * height and height <= 3 * width):
        return "custom aspect ratio must be between 1:3 and 3:1"
    if not 655_360 <= width * height <= 8_294_400:
        return "custom sizes must have between 655,360 and 8,294,400 pixels"
    return None


class ImageOptions(Model):
    """The parameters generations and edits share (2.4, 2.5)."""

    prompt: str = Field(min_length=1, max_length=32000)
    # Closed: routing, prices and the size and quality rules below go by the model.
    model: Literal[IMAGE_MODELS]  # type: ignore[valid-type]
    n: int | None = Field(default=None, ge=1, le=10)
    size: str | None = None  # 2.4's sizes, or 2.6's custom ones: the cross-field rules below
    quality: Literal[QUALITIES] | None = None  # type: ignore[valid-type]
    background: open_enum("background", ("transparent", "opaque", "auto"), UPSTREAMS) | None = None
    # Open: URL delivery stores what the image's own bytes say it is (plugins/url_delivery), never this.
    output_format: open_enum("output_format", ("png", "jpeg", "webp"), UPSTREAMS) | None = None
    output_compression: int | None = Field(default=None, ge=0, le=100)
    moderation: open_enum("moderation", ("low", "auto"), UPSTREAMS) | None = None
    # Closed: `url` switches URL delivery on, which rewrites the answer (2.4, 7.3: lowercase only).
    response_format: Literal["url", "b64_json"] | None = None
    stream: bool | None = None
    partial_images: int | None = Field(default=None, ge=0, le=3)
    user: str | None = None

    @model_validator(mode="after")
    def _cross_field_rules(self) -> ImageOptions:
        if self.size is not None and self.size not in STANDARD_SIZES:
            if self.model not in CUSTOM_SIZE_MODELS:
                raise ValueError(f"size: {self.model} takes only {', '.join(STANDARD_SIZES)}")
            problem = custom_size_problem(self.size)
            if problem:
                raise ValueError(f"size: {problem}")
        if self.quality in ("xhigh", "max") and self.model not in TOP_QUALITY_MODELS:
            raise ValueError(f"quality: '{self.quality}' needs an imagegen-2.5 model")
        if self.background == "transparent" and self.output_format == "jpeg":
            raise ValueError("background: 'transparent' needs output_format png or webp")
        if self.partial_images is not None and self.stream is not True:
            raise ValueError("partial_images: only valid with stream true")
        if self.response_format == "url" and self.stream is True:
            raise ValueError("response_format: 'url' cannot be combined with stream true")
        return self


class ImageGenerationRequest(ImageOptions):
    pass


class ImageReference(Model):
    """An input image or mask of the JSON edit variant: a URL / data URL, or a file id."""

    image_url: str | None = None
    file_id: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ImageReference:
        if (self.image_url is None) == (self.file_id is None):
            raise ValueError("give exactly one of image_url and file_id")
        return self


class ImageEditOptions(ImageOptions):
    """What edits add to the shared parameters, in either variant of endpoint 7 (2.5)."""

    input_fidelity: open_enum("input_fidelity", ("high", "low"), UPSTREAMS) | None = None


class ImageEditRequest(ImageEditOptions):
    """The JSON variant of endpoint 7."""

    images: list[ImageReference] = Field(min_length=1, max_length=MAX_EDIT_IMAGES)
    mask: ImageReference | None = None

    @model_validator(mode="after")
    def _data_urls_are_images(self) -> ImageEditRequest:
        for index, ref in enumerate(self.images):
            problem = data_url_problem(ref.image_url, MAX_IMAGE_BYTES, ("png", "webp", "jpeg"))
            if problem:
                raise ValueError(f"images[{index}].image_url: {problem}")
        if self.mask is not None:
            problem = data_url_problem(self.mask.image_url, MAX_MASK_BYTES, ("png",))
            if problem:
                raise ValueError(f"mask.image_url: {problem}")
        return self


class ImageEditForm(ImageEditOptions):
    """The fields of the multipart variant of endpoint 7 (the files are checked as they stream)."""


def data_url_problem(url: str | None, limit: int, kinds: tuple[str, ...]) -> str | None:
    if not url or not url.startswith("data:"):
        return None
    header, _, payload = url.partition(",")
    if ";base64" not in header:
        return "a data URL must be Base64"
    if len(payload) * 3 // 4 >= limit:
        return f"must be under {limit // (1024 * 1024)} MB"
    try:
        head = base64.b64decode(payload[:44], validate=False)
    except ValueError:
        return "is not valid Base64"
    info = sniff(head)
    if info is None or info.kind not in kinds:
        return f"must be {'/'.join(k.upper() for k in kinds)} image data"
    return None
