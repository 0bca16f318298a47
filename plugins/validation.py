"""Validation: every rule of the spec that a request can be checked against, before it costs
upstream money. A violation is a 400 in the endpoint's shape naming the field's path and the rule.

JSON bodies are checked against the route's schema (proxy.schemas). Multipart edits have
their leading fields checked at once and their files (count, size, PNG/WEBP/JPG by magic
bytes, mask size and dimensions) as they stream; unknown fields are forwarded.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import Counter
from pydantic import BaseModel, ValidationError

from proxy.config import GatewayConfig
from proxy.observability.metrics import rule_label
from proxy.plugin import Joins, Plugin
from proxy.request.body import MultipartBody
from proxy.request.exchange import Exchange
from proxy.schemas import JSON_SCHEMAS, GenerateContentRequest, ImageEditForm, VideosRequest, Violation, check
from proxy.schemas.common import first_violation, violation_of
from proxy.schemas.imagefiles import sniff
from proxy.schemas.images import MAX_EDIT_IMAGES, MAX_IMAGE_BYTES, MAX_MASK_BYTES
from proxy.wire.multipart import MultipartObserver
from proxy.wire.routes import Body

VALIDATION_FAILURES = Counter("modelgate_validation_failures", "Requests refused by a validation rule",
                              ["route", "rule"])

_IMAGE_FIELDS = ("image", "image[]")


class Validation(Plugin):
    name = "validation"
    joins = Joins(keyed=True, local=False)  # a list the gateway answers has no body to check
    order = 200
    before_owner_check = True  # reads nothing that belongs to a followed id

    def configure(self, config: GatewayConfig) -> None:
        self.strict = config.server.strict_interface

    async def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        route = ex.route
        if (missing := ex.format.missing_version(ex.request.headers, self.strict)) is not None:
            return refuse(ex, Violation(*missing))
        if route.body is Body.NONE or route.body is Body.RAW:
            return None
        if isinstance(ex.body_stream, MultipartBody):
            return self._check_form(ex, ex.body_stream)
        schema = JSON_SCHEMAS.get(route.name)
        if schema is None:
            return None
        parsed, violation = check(schema, ex.json())
        if violation is not None:
            return refuse(ex, violation)
        if route.always_streams and isinstance(parsed, GenerateContentRequest) and parsed.asks_for_image_urls():
            return refuse(ex, Violation("generationConfig.responseFormat.image.delivery",
                                        "URL delivery needs a non-streaming request"))
        return None

    def _check_form(self, ex: Exchange, body: MultipartBody) -> web.StreamResponse | None:
        check = check_video_form if ex.route.name == "videos" else check_edit_form
        body.checks.append(check)
        violation = check(body.observer, body.observer.done)
        return refuse(ex, violation) if violation is not None else None


def refuse(ex: Exchange, violation: Violation) -> web.Response:
    VALIDATION_FAILURES.labels(ex.route.name, rule_label(violation.path)).inc()
    return ex.error_response(400, str(violation), param=violation.path or None)


def check_edit_form(observer: MultipartObserver, finished: bool) -> Violation | None:
    """Endpoint 7's multipart rules over what has been read so far (all of it when `finished`)."""
    images = [p for p in observer.files() if p.name in _IMAGE_FIELDS]
    if len(images) > MAX_EDIT_IMAGES:
        return Violation("image[]", f"at most {MAX_EDIT_IMAGES} images")
    first_info = None
    for index, part in enumerate(images):
        path = f"{part.name}[{index}]" if part.name == "image[]" else part.name
        if part.size >= MAX_IMAGE_BYTES:
            return Violation(path, "each image must be under 25 MB")
        info = sniff(part.head) if len(part.head) >= 12 or finished else None
        if (len(part.head) >= 12 or finished) and (info is None or info.kind not in ("png", "webp", "jpeg")):
            return Violation(path, "must be a PNG, WEBP or JPG image")
        if index == 0:
            first_info = info
    mask = next((p for p in observer.files() if p.name == "mask"), None)
    if mask is not None:
        if mask.size >= MAX_MASK_BYTES:
            return Violation("mask", "must be under 4 MB")
        info = sniff(mask.head) if len(mask.head) >= 24 or finished else None
        if (len(mask.head) >= 24 or finished) and (info is None or info.kind != "png"):
            return Violation("mask", "must be a PNG image")
        if info and first_info and info.width and first_info.width and (
                (info.width, info.height) != (first_info.width, first_info.height)):
            return Violation("mask", f"must have the image's size ({first_info.width}x{first_info.height}), "
                                     f"not {info.width}x{info.height}")
    return _form_fields(observer, finished)


def check_video_form(observer: MultipartObserver, finished: bool) -> Violation | None:
    """Endpoint 3 as the SDK sends it: its text fields, and an optional reference image."""
    for part in observer.files():
        if part.name != "input_reference":
            return Violation(part.name, "is not a file this endpoint takes (only input_reference)")
        if part.size >= MAX_IMAGE_BYTES:
            return Violation("input_reference", "must be under 25 MB")
        if len(part.head) >= 12 or finished:
            info = sniff(part.head)
            if info is None or info.kind not in ("png", "webp", "jpeg"):
                return Violation("input_reference", "must be a PNG, WEBP or JPG image")
    return _lax_fields(VideosRequest, observer, finished)


def _form_fields(observer: MultipartObserver, finished: bool) -> Violation | None:
    if finished and not any(p.name in _IMAGE_FIELDS for p in observer.files()):
        return Violation("image", "is required: one file, or up to 16 as image[]")
    return _lax_fields(ImageEditForm, observer, finished)


def _lax_fields(schema: type[BaseModel], observer: MultipartObserver, finished: bool) -> Violation | None:
    """A form's text fields against `schema`: each given once (readers differ on which of two
    counts) and within the field limit (a longer one is no parameter the gateway can check)."""
    seen: set[str] = set()
    for part in observer.parts:
        if part.is_file:
            continue
        if part.value is None:
            return Violation(part.name, f"a form field holds at most {observer.field_limit} bytes")
        if part.name in seen:
            return Violation(part.name, "is given twice")
        seen.add(part.name)
    try:
        # whole values only (one still arriving reads short); lax: form values are text ("3", "true")
        schema.model_validate(observer.fields())
    except ValidationError as exc:
        if finished:
            return first_violation(exc)
        # Fields may still follow the files: only what was sent can be wrong yet.
        for error in exc.errors(include_url=False, include_context=False):
            if error["type"] != "missing":
                return violation_of(error)
    return None
