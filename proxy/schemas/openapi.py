"""The gateway's interface as an OpenAPI 3.1 document, built from the request schemas.

Request bodies are the validation schemas themselves; answers are documented as their
formats frame them (JSON, or SSE for streams), and every error the gateway raises in its
endpoint's own shape.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from proxy import __version__
from proxy.formats.base import KeyLocation
from proxy.schemas import JSON_SCHEMAS
from proxy.schemas.images import ImageEditForm
from proxy.wire.routes import ROUTES, Body, Route

_REF = "#/components/schemas/{model}"
_SECURITY = {
    KeyLocation.BEARER: "bearer",
    KeyLocation.X_API_KEY: "apiKeyHeader",
    KeyLocation.QUERY: "apiKeyQuery",
    KeyLocation.GOOG_API_KEY: "googApiKeyHeader",
}
_ERRORS = {
    "MessageError": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {
                    "type": {"type": "string"},
                    "message": {"type": "string"},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    },
    "ContentError": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "status"],
                "properties": {
                    "code": {"type": "integer"},
                    "message": {"type": "string"},
                    "status": {"type": "string"},
                },
            }
        },
    },
    "GenericError": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    },
}
_ERROR_STATUSES = {
    "400": "The request breaks a rule of the interface",
    "401": "Missing or invalid key",
    "403": "The key may not use this endpoint or model",
    "404": "No channel serves the model",
    "413": "The body is over the size limit",
    "429": "Limit exceeded",
    "500": "Gateway error",
    "502": "Upstream unreachable",
    "503": "Temporarily unavailable",
    "504": "Upstream timed out",
}


def openapi_document() -> dict[str, Any]:
    models: list[type[BaseModel]] = sorted({*JSON_SCHEMAS.values(), ImageEditForm}, key=lambda m: m.__name__)
    _, definitions = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    schemas = _any_of(definitions.get("$defs", {}))
    schemas.update(_ERRORS)
    paths: dict[str, Any] = {}
    for route in ROUTES:
        paths.setdefault(_path(route), {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "modelgate",
            "version": __version__,
            "description": "One base URL for video tasks, images, three chat formats, a 2FA login and a payment "
            "webhook.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "x-api-key"},
                "apiKeyQuery": {"type": "apiKey", "in": "query", "name": "key"},
                "googApiKeyHeader": {"type": "apiKey", "in": "header", "name": "x-goog-api-key"},
            },
        },
    }


def _path(route: Route) -> str:
    return route.path  # aiohttp's {name} placeholders are OpenAPI's too


def _operation(route: Route) -> dict[str, Any]:
    error = {"messages": "MessageError", "content": "ContentError"}.get(route.format.name, "GenericError")
    operation: dict[str, Any] = {
        "operationId": route.name,
        "summary": f"Endpoint {route.number}",
        "parameters": [
            {
                "name": n,
                "in": "path",
                "required": True,
                "schema": {"type": "string", "minLength": 1, "pattern": "^[A-Za-z0-9._-]+$"},
            }
            for n in re.findall(r"\{(\w+)\}", route.path)
        ],
        "responses": {"200": _success(route)}
        | {
            status: {
                "description": why,
                "content": {"application/json": {"schema": {"$ref": _REF.format(model=error)}}},
            }
            for status, why in _ERROR_STATUSES.items()
        },
    }
    if route.name == "messages":
        operation["parameters"] += [
            {
                "name": "msgapi-version",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "example": "2023-06-01"},
                "description": "Required, or anthropic-version in its place (not with server.strict_interface); "
                "with both, this one is used",
            },
            {"name": "msgapi-beta", "in": "header", "required": False, "schema": {"type": "string"}},
        ]
    if route.always_streams:
        operation["parameters"].append({"name": "alt", "in": "query", "required": False, "schema": {"const": "sse"}})
    if route.format.key_location is not KeyLocation.NONE:
        # alternatives: the spec's place, then where the format's SDK sends the key
        operation["security"] = [{_SECURITY[location]: []} for location in route.format.key_locations(strict=False)]
    schema = JSON_SCHEMAS.get(route.name)
    if schema is not None:
        content: dict[str, Any] = {"application/json": {"schema": {"$ref": _REF.format(model=schema.__name__)}}}
        if route.body is Body.JSON_OR_MULTIPART:
            content["multipart/form-data"] = {"schema": _edit_form()}
        operation["requestBody"] = {"required": True, "content": content}
    elif route.body is Body.RAW:
        operation["requestBody"] = {"required": False, "content": {"*/*": {"schema": {}}}}
    return operation


def _success(route: Route) -> dict[str, Any]:
    if route.streams_bytes:
        return {
            "description": "The video, streamed (Range and HEAD supported)",
            "content": {"video/mp4": {"schema": {"type": "string", "format": "binary"}}},
        }
    content: dict[str, Any] = {"application/json": {"schema": {}}}
    if route.format.name in ("messages", "content", "responses", "chat", "images"):
        content["text/event-stream"] = {"schema": {}}  # each event's data is the format's own JSON
    return {"description": "The upstream's answer", "content": content}


def _edit_form() -> dict[str, Any]:
    return {
        "allOf": [
            {"$ref": _REF.format(model=ImageEditForm.__name__)},
            {
                "type": "object",
                "properties": {
                    "image": {"type": "string", "format": "binary"},
                    "image[]": {"type": "array", "maxItems": 16, "items": {"type": "string", "format": "binary"}},
                    "mask": {"type": "string", "format": "binary"},
                },
            },
        ]
    }


def _any_of(node: Any) -> Any:
    """oneOf -> anyOf: unions that let newer upstream types through overlap by design."""
    if isinstance(node, dict):
        return {("anyOf" if k == "oneOf" else k): _any_of(v) for k, v in node.items() if k != "discriminator"}
    if isinstance(node, list):
        return [_any_of(v) for v in node]
    return node
