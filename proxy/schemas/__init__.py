"""Machine-readable request schemas, one per request type, and the routes they check.

Shapes and ranges live in the pydantic models; rules that tie fields together are their
validators. `modelgate openapi` exports them as the gateway's OpenAPI 3.1 document.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from proxy.schemas.chat import ChatCompletionRequest
from proxy.schemas.common import Violation, first_violation
from proxy.schemas.content import GenerateContentRequest
from proxy.schemas.enums import EnumCheck
from proxy.schemas.images import ImageEditForm, ImageEditRequest, ImageGenerationRequest
from proxy.schemas.message import MessageRequest
from proxy.schemas.response import ResponseRequest
from proxy.schemas.video import VideoRequest, VideosRequest

JSON_SCHEMAS: dict[str, type[BaseModel]] = {
    "video_generations": VideoRequest,
    "videos": VideosRequest,
    "image_generations": ImageGenerationRequest,
    "image_edits": ImageEditRequest,
    "messages": MessageRequest,
    "generate_content": GenerateContentRequest,
    "stream_generate_content": GenerateContentRequest,
    "responses": ResponseRequest,
    "chat_completions": ChatCompletionRequest,
}


def check(
    schema: type[BaseModel], body: Any, *, strict: bool = True, enums: EnumCheck | None = None
) -> tuple[BaseModel | None, Violation | None]:
    """The body against `schema` (`strict`: no type coercion); `enums` says whether open
    enumerations are closed, and gathers the unlisted values they let pass."""
    if not isinstance(body, dict):
        return None, Violation("", "the body must be a JSON object")
    try:
        return schema.model_validate(body, strict=strict, context=enums), None
    except ValidationError as exc:
        return None, first_violation(exc)


__all__ = [
    "JSON_SCHEMAS",
    "ChatCompletionRequest",
    "EnumCheck",
    "GenerateContentRequest",
    "ImageEditForm",
    "Violation",
    "VideosRequest",
    "check",
]
