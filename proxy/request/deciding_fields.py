"""The request fields the gateway decides by — the model, and the response a request follows —
read once, and sent so that the upstream reads them as the gateway did.

A key's model allow-list, the channel chosen and the tenant check all go by these fields. An
upstream's parser may read a body otherwise than the gateway's: the first of two equal names
(the gateway's JSON parser keeps the last), a name in other letter case (Unicode's too: `ſ`
folds to `s`), a name spelled with `\\u` escapes, a model with a trailing newline. Each of those
is refused, or the body is sent re-encoded from what the gateway parsed. (`stream` decides no route:
the relay follows the answer's own content type; but it and `stream_options.include_usage` decide
whether a chat stream is told its usage, so they are read alike too.)
"""

from __future__ import annotations

import re
import unicodedata

from aiohttp import web

from proxy.core.exchange import Exchange
from proxy.wire.routes import Body, ModelFrom

FIELDS = ("model", "previous_response_id")
_LENGTHS = frozenset(len(name) for name in FIELDS)
_MODEL_NAME, _PREVIOUS_NAME = (f'"{name}"'.encode() for name in FIELDS)
# A letter spelled as an escape: `"mod\u0065l"` is `"model"` to any JSON parser. A literal prefix,
# so the search runs at the speed of a byte scan (an alternation in front would not).
_ESCAPED_LETTER = re.compile(rb"\\u00[4-7][0-9a-fA-F]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def resolve_model(ex: Exchange) -> web.Response | None:
    """Set `ex.model` from the path, the form or the body; a 400 when there is none, or when the
    name is not exactly what an upstream would read (surrounding whitespace, control characters)."""
    source = ex.route.model_from
    if source is ModelFrom.NONE:
        return None
    if source is ModelFrom.PATH:
        model = ex.path_params.get("model", "")
    elif ex.multipart is not None:
        model = ex.multipart.field("model") or ""
    else:
        body = ex.json()
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str):
            model = ""
    stripped = model.strip()
    if not stripped:
        return ex.error_response(400, "the request names no model: 'model' is required", param="model")
    if model != stripped or _CONTROL.search(model):
        return ex.error_response(
            400, "model: must not have surrounding whitespace or control characters", param="model"
        )
    ex.model = model
    return None


def settle_json(ex: Exchange) -> web.Response | None:
    """A JSON body's deciding field given again in other letter case is a 400; a body where one
    may be given twice, or is spelled with escapes, goes upstream re-encoded from what was parsed."""
    raw = ex.body
    if ex.route.body is Body.RAW:  # forwarded byte for byte (a webhook's signature covers its bytes)
        return None
    body = ex.json() if raw else None
    if not isinstance(body, dict):
        return None
    for name in body:
        if name in FIELDS or name.isascii() and len(name) not in _LENGTHS:
            continue  # the field itself, or an ASCII name no case could make one
        if (folded := _fold(name)) in FIELDS:
            return ex.error_response(400, f"{folded}: given again in other letter case", param=folded)
    holding = _HOLDING_VIDEO if ex.route.name in ("video_generations", "videos") else _HOLDING
    refusal = _other_case(ex, body, "") or next(
        (
            found
            for inner in holding
            if isinstance(nested := body.get(inner), dict) and (found := _other_case(ex, nested, inner + "."))
        ),
        None,
    )
    if refusal is not None:
        return refusal
    if (
        _ESCAPED_LETTER.search(raw)
        or raw.count(_MODEL_NAME) > 1
        or raw.count(_PREVIOUS_NAME) > 1
        or any(raw.count(name) > 1 for name in ex.format.charged_by)
    ):
        ex.set_json(body)
    return None


# The counts a reservation goes by (proxy/formats/counts.py), by name at any depth.
_COUNT_NAMES = tuple(
    f'"{name}"'.encode()
    for name in (
        "max_tokens",
        "max_output_tokens",
        "max_completion_tokens",
        "maxOutputTokens",
        "candidateCount",
        "candidate_count",
        "sampleCount",
        "durationSeconds",
        "seconds",
        "n",
        "partial_images",
    )
)


def settle_counts(ex: Exchange) -> None:
    """A JSON body that may name a count twice (an output limit, `n`, `sampleCount`) goes upstream
    re-encoded from what was parsed, so the upstream honours the count the gateway reserved for,
    not the other one of two. (Any name in a JSON string counts too: a needless re-encode at worst.)"""
    raw = ex.body
    if raw and not ex.body_changed and any(raw.count(name) > 1 for name in _COUNT_NAMES):
        body = ex.json()
        if body is not None:
            ex.set_json(body)


# What reservations and prices go by besides FIELDS: the counts (proxy/formats/counts.py) and the
# closed fields (a tier, a quality, a size), at the top and in the objects that hold them. Named
# in another case, a case-insensitive upstream (Go's encoding/json) reads the value the gateway
# neither checked nor reserved for: `"N": 10` beside `"n": 1`, `"ſervice_tier"`. Only these objects
# are looked in: deeper, a tool's schema may well name a property `Size`, and a response's
# `metadata` holds whatever names its caller likes.
_CHECKED = (
    "n",
    "partial_images",
    "max_tokens",
    "max_output_tokens",
    "max_completion_tokens",
    "seconds",
    "service_tier",
    "quality",
    "size",
    "response_format",
    "maxOutputTokens",
    "candidateCount",
    "candidate_count",
    "sampleCount",
    "sample_count",
    "durationSeconds",
    "duration_seconds",
    # Whether a chat stream is told its usage: what it is charged by (proxy/formats/chat.py).
    "stream",
    "stream_options",
    "include_usage",
)
_CHECKED_FOLDED = {name.lower(): name for name in _CHECKED}
_HOLDING = ("generationConfig", "generation_config", "stream_options")
_HOLDING_VIDEO = ("metadata", "parameters")  # a video's; elsewhere `metadata` is the caller's own names


def _other_case(ex: Exchange, fields: dict[str, object], where: str) -> web.Response | None:
    for name in fields:
        folded = name.lower() if name.isascii() else _fold(name)
        wanted = _CHECKED_FOLDED.get(folded)
        if wanted is not None and name not in _CHECKED:
            return ex.error_response(
                400,
                f"{where}{wanted}: given in other letter case ('{where}{name}' is "
                f"not '{where}{wanted}'): send it as named",
                param=where + wanted,
            )
    return None


def _fold(name: str) -> str:
    """A name as a case-insensitive reader may match it: lower case for ASCII; compatibility-
    normalised and case-folded otherwise (`previouſ_response_id`, a Kelvin sign for `k`)."""
    return name.lower() if name.isascii() else unicodedata.normalize("NFKC", name).casefold()
