"""Validation: every rule of the spec that a request can be checked against, before it costs
upstream money. A violation is a 400 in the endpoint's shape naming the field's path and the rule.

JSON bodies are checked against the route's schema (proxy.schemas). Multipart edits have
their leading fields checked at once and their files (count, size, PNG/WEBP/JPG by magic
bytes, mask size and dimensions) as they stream; unknown fields are forwarded.

A value an open enumeration does not list (proxy/schemas/enums.py) passes to the upstream and
is counted by its field, and logged once per field and value while the process runs (a few new
ones a request, a bounded number a field); `validation.strict_enums` refuses it instead, and a
body with more than `MOST_UNLISTED` of them is refused in every mode.
"""

from __future__ import annotations

import functools
import logging
import re
import typing

from aiohttp import web
from prometheus_client import Counter
from pydantic import BaseModel, ValidationError

from proxy.config import GatewayConfig
from proxy.core.exchange import Exchange
from proxy.core.headers import content_codings
from proxy.core.plugin import Joins, Plugin
from proxy.observability.metrics import child, rule_label
from proxy.request.body import MultipartBody
from proxy.schemas import (
    JSON_SCHEMAS,
    EnumCheck,
    GenerateContentRequest,
    ImageEditForm,
    VideosRequest,
    Violation,
    check,
)
from proxy.schemas.common import first_violation, violation_of
from proxy.schemas.enums import MOST_UNLISTED
from proxy.schemas.imagefiles import sniff
from proxy.schemas.images import MAX_EDIT_IMAGES, MAX_IMAGE_BYTES, MAX_MASK_BYTES
from proxy.wire.multipart import MultipartObserver
from proxy.wire.routes import Body

VALIDATION_FAILURES = Counter(
    "modelgate_validation_failures", "Requests refused by a validation rule", ["route", "rule"]
)
# The field is an open enumeration's label (a bounded set: proxy.schemas.enums.OPEN_FIELDS), never the value.
UNKNOWN_VALUES = Counter(
    "modelgate_validation_unknown_values",
    "Values of an open enumeration the interface does not list, passed to the upstream, by route and field",
    ["route", "field"],
)
log = logging.getLogger("modelgate.validation")

SHOWN_CHARS = 80  # of a value, in its log line (the whole value goes upstream)
LOGGED_PER_REQUEST = 4  # new (field, value) pairs one request may log: one request cannot fill a field's room


class FirstSeen:
    """Which (field, value) pairs were logged already in this process: the first of each is, up
    to `most` values a field, so a client sending a new value each time neither grows the process
    nor floods the log, and a flood in one field leaves the others' new values logged (past it,
    that field's values are only counted, and the log says so once). Fields are the schemas'
    labels (proxy.schemas.enums.OPEN_FIELDS): the whole is bounded by their number times `most`."""

    __slots__ = ("seen", "most", "full")

    def __init__(self, most: int = 64) -> None:
        self.seen: dict[str, set[str]] = {}
        self.most = most
        self.full: set[str] = set()

    def first(self, field: str, value: str) -> bool:
        values = self.seen.setdefault(field, set())
        if value in values:
            return False
        if len(values) >= self.most:
            if field not in self.full:
                self.full.add(field)
                log.info(
                    "unlisted enumeration values: %d logged for this field, the rest only counted "
                    "(modelgate_validation_unknown_values_total)",
                    self.most,
                    extra={"field": field},
                )
            return False
        values.add(value)
        return True


LOGGED = FirstSeen()

_IMAGE_FIELDS = ("image", "image[]")
# The closed enumerations' names (proxy/schemas: the gateway goes by their values), as they appear
# in a JSON body; under `strict_enums` every checked name counts, and every body is sent re-encoded.
_CHECKED_NAMES = tuple(
    f'"{name}"'.encode()
    for name in ("quality", "size", "response_format", "service_tier", "delivery", "seconds", "durationSeconds")
)


class Validation(Plugin):
    name = "validation"
    joins = Joins(keyed=True, local=False)  # a list the gateway answers has no body to check
    order = 200
    before_owner_check = True  # reads nothing that belongs to a followed id

    def configure(self, config: GatewayConfig) -> None:
        self.strict = config.server.strict_interface
        self.strict_enums = config.validation.strict_enums

    def on_request(self, ex: Exchange) -> web.StreamResponse | None:  # never waits: no coroutine
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
        enums = EnumCheck(strict=self.strict_enums)
        enums.betas = ex.format.betas(ex.request.headers)
        parsed, violation = check(schema, ex.json(), enums=enums)
        if violation is not None:
            return refuse(ex, violation)
        if (field := enums.over_bound()) is not None:
            return refuse(ex, Violation(field, too_many()))
        note_unknown(enums, ex.route.name, ex.request_id, ex.key_name)
        raw = ex.body or b""
        if (
            not ex.body_changed
            and parsed is not None
            and (self.strict_enums or content_codings(ex.headers) or any(raw.count(n) > 1 for n in _CHECKED_NAMES))
        ):
            # What was checked is what goes: a name given twice in one object is read by this
            # parser at its last value, by some upstreams at its first.
            ex.set_json(ex.json())
        if route.always_streams and isinstance(parsed, GenerateContentRequest) and parsed.asks_for_image_urls():
            return refuse(
                ex,
                Violation(
                    "generationConfig.responseFormat.image.delivery", "URL delivery needs a non-streaming request"
                ),
            )
        return None

    def _check_form(self, ex: Exchange, body: MultipartBody) -> web.StreamResponse | None:
        videos = ex.route.name == "videos"
        fields = FormFields(VideosRequest if videos else ImageEditForm, self.strict_enums, ex)

        def check(observer: MultipartObserver, finished: bool) -> Violation | None:
            return (check_video_form if videos else check_edit_form)(observer, finished, fields)

        body.checks.append(check)
        violation = check(body.observer, body.observer.done)
        return refuse(ex, violation) if violation is not None else None


def refuse(ex: Exchange, violation: Violation) -> web.Response:
    VALIDATION_FAILURES.labels(ex.route.name, rule_label(violation.path)).inc()
    return ex.error_response(400, str(violation), param=violation.path or None)


def too_many() -> str:
    return (
        f"the body carries more than {MOST_UNLISTED} values that the interface's enumerations do not "
        "list (all fields together); no more are taken in one request"
    )


def note_unknown(enums: EnumCheck, route: str, request_id: str, key_name: str | None) -> None:
    """Count the values open enumerations let pass, once a field for the request; log the first
    few of them this process has not logged yet, each with the request's id and key."""
    for field, count in enums.counts.items():
        child(UNKNOWN_VALUES, route, field).inc(count)
    logged = 0
    for field, value in enums.kept:
        if logged == LOGGED_PER_REQUEST:
            break
        if not LOGGED.first(field, value[:SHOWN_CHARS]):  # the part shown is the part remembered
            continue
        logged += 1
        more = "..." if len(value) > SHOWN_CHARS else ""
        # The value is client text: the log's own processor shows it safely (proxy/observability/
        # access_log.py), once; escaping it here too doubled every backslash.
        log.info(
            "a value the interface does not list went to the upstream",
            extra={
                "request_id": request_id,
                "key_name": key_name,
                "route": route,
                "field": field,
                "value": value[:SHOWN_CHARS] + more,
            },
        )


class FormFields:
    """A form's text fields against `schema` for one request: open enumerations as configured,
    and the values they let pass noted once, when the whole form has passed."""

    __slots__ = ("schema", "strict_enums", "who", "noted")

    def __init__(self, schema: type[BaseModel], strict_enums: bool, ex: Exchange) -> None:
        self.schema, self.strict_enums, self.noted = schema, strict_enums, False
        # What the log line names, not the exchange: the body holding this check is the exchange's.
        self.who = (ex.route.name, ex.request_id, ex.key_name)

    def __call__(self, observer: MultipartObserver, finished: bool) -> Violation | None:
        enums = EnumCheck(strict=self.strict_enums)
        violation = _lax_fields(self.schema, observer, finished, enums)
        if violation is None and finished and not self.noted:
            self.noted = True
            note_unknown(enums, *self.who)  # each field is given once: a form never nears the bound
        return violation


def check_edit_form(observer: MultipartObserver, finished: bool, fields: FormFields) -> Violation | None:
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
        if (
            info
            and first_info
            and info.width
            and first_info.width
            and ((info.width, info.height) != (first_info.width, first_info.height))
        ):
            return Violation(
                "mask",
                f"must have the image's size ({first_info.width}x{first_info.height}), not {info.width}x{info.height}",
            )
    if finished and not any(p.name in _IMAGE_FIELDS for p in observer.files()):
        return Violation("image", "is required: one file, or up to 16 as image[]")
    return fields(observer, finished)


def check_video_form(observer: MultipartObserver, finished: bool, fields: FormFields) -> Violation | None:
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
    return fields(observer, finished)


_PLAIN_NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?")  # a field's value, as its bytes


@functools.cache
def _numeric_fields(schema: type[BaseModel]) -> frozenset[str]:
    """The fields of `schema` (by name and alias) a number may fill."""
    found = set()
    for name, info in schema.model_fields.items():
        if any(t in (int, float) for t in typing.get_args(info.annotation) or (info.annotation,)):
            found.add(name)
            if isinstance(info.validation_alias, str):
                found.add(info.validation_alias)
            elif info.validation_alias is not None:
                found.update(a for a in info.validation_alias.choices if isinstance(a, str))
    return frozenset(found)


def _lax_fields(
    schema: type[BaseModel], observer: MultipartObserver, finished: bool, enums: EnumCheck
) -> Violation | None:
    """A form's text fields against `schema`: each given once (readers differ on which of two
    counts) and within the field limit (a longer one is no parameter the gateway can check)."""
    seen: set[str] = set()
    numeric = _numeric_fields(schema)
    for part in observer.parts:
        if part.is_file:
            continue
        if part.value is None:
            return Violation(part.name, f"a form field holds at most {observer.field_limit} bytes")
        if part.name in seen:
            return Violation(part.name, "is given twice")
        seen.add(part.name)
        # A number in plain ASCII digits: pydantic reads "1_0" as 10 where a count reader may not
        # (the budget reserved for one image and ten were made), and upstreams differ again.
        if part.name in numeric and not _PLAIN_NUMBER.fullmatch(part.value):
            return Violation(part.name, "a number written in plain digits (0-9, one '.')")
    try:
        # whole values only (one still arriving reads short); lax: form values are text ("3", "true")
        schema.model_validate(observer.fields(), context=enums)
    except ValidationError as exc:
        if finished:
            return first_violation(exc)
        # Fields may still follow the files: only what was sent can be wrong yet.
        for error in exc.errors(include_url=False, include_context=False):
            if error["type"] != "missing":
                return violation_of(error)
    return None
