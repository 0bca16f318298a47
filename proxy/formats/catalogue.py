"""The interface's model names (section 8 of the spec): what `GET /v1/models` lists beside the
channels' own, and the names metrics keep as labels (any other is `other`, so a client cannot
grow the label set)."""

from __future__ import annotations

from proxy.schemas.images import IMAGE_MODELS
from proxy.schemas.video import VIDEO_MODELS

SPEC_MODELS = frozenset(
    {
        *IMAGE_MODELS,
        *VIDEO_MODELS,
        "msgmodel-haiku-4-5",
        "msgmodel-sonnet-4-5",
        "msgmodel-sonnet-4-6",
        "msgmodel-sonnet-5",
        "msgmodel-opus-4-5",
        "msgmodel-opus-4-6",
        "msgmodel-opus-4-7",
        "msgmodel-opus-4-8",
        "msgmodel-opus-5",
        "msgmodel-fable-5",
        "genmodel-2.0-flash",
        "genmodel-2.5-flash-image",
        "genmodel-3.1-flash-image-preview",
        "genmodel-3-pro-image-preview",
        "picmodel-4.0-fast-generate-001",
        "respmodel-3.5-turbo",
        "respmodel-3.5-turbo-16k",
        "respmodel-3.5-turbo-instruct",
        "respmodel-4",
        "respmodel-4-32k",
        "respmodel-4-turbo-preview",
        "respmodel-4-turbo",
        "respmodel-4-vision-preview",
        "respmodel-4o",
        "respmodel-4o-mini",
        "respmodel-4.5-preview",
        "respmodel-4.1",
        "respmodel-4.1-mini",
        "respmodel-4.1-nano",
        "respmodel-5",
        "respmodel-5-chat-latest",
        "respmodel-5-mini",
        "respmodel-5-nano",
    }
)
