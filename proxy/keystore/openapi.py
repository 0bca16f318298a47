"""The admin API (proxy/keystore/api.py) as an OpenAPI 3.1 document of its own: it is served on
the admin listener, not at the clients' base URL, and answers in its own error shape, so it is not
mixed into the interface's document (`modelgate openapi --admin` prints it; the admin listener
serves it at `/admin/v1/openapi.json`).

A key's settings are the config file's `keys[]` entry without its name and secret, so their
schema is KeyConfig's; plugins' own fields on a key pass as they do in the file.
"""

from __future__ import annotations

from typing import Any

from proxy import __version__
from proxy.config.model import KeyConfig, TenantLimits
from proxy.keystore.roles import ROLES

_REF = "#/components/schemas/{model}"
_NAME = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"}
_TIME = {"type": "string", "format": "date-time"}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_SET_BY_STORE = ("name", "key", "sha256")


def _ref(model: str) -> dict[str, Any]:
    return {"$ref": _REF.format(model=model)}


def _key_settings() -> tuple[dict[str, Any], dict[str, Any]]:
    """KeyConfig's schema without the fields the store sets, and the definitions it refers to."""
    schema = KeyConfig.model_json_schema(ref_template=_REF)
    definitions = schema.pop("$defs", {})
    for field in _SET_BY_STORE:
        schema["properties"].pop(field, None)
    schema["required"] = [f for f in schema.get("required", []) if f not in _SET_BY_STORE]
    if not schema["required"]:
        del schema["required"]
    schema["title"] = "KeySettings"
    schema["additionalProperties"] = True  # plugins' fields (a budget, say), checked by their plugins
    return schema, definitions


def _schemas() -> dict[str, Any]:
    settings, definitions = _key_settings()
    key_view = {
        "allOf": [
            _ref("KeySettings"),
            {
                "type": "object",
                "required": ["name", "source", "state"],
                "properties": {
                    "name": _NAME,
                    "source": {"enum": ["store", "config"]},
                    "tenant": {"type": ["string", "null"]},
                    "state": {"enum": ["active", "disabled", "expired"]},
                    "fingerprint": {"type": "string", "description": "the first 8 hex digits of the secret's SHA-256"},
                    "previous_valid_until": {
                        "type": ["string", "null"],
                        "format": "date-time",
                        "description": "until when the secret before a rotation still works",
                    },
                    "revision": {"type": "integer"},
                    "created_at": _TIME,
                    "created_by": {"type": "string"},
                    "updated_at": _TIME,
                    "updated_by": {"type": "string"},
                },
            },
        ]
    }
    with_secret = {
        "allOf": [
            _ref("Key"),
            {
                "type": "object",
                "properties": {
                    "secret": {
                        "type": ["string", "null"],
                        "description": "shown once, here; null when an Idempotency-Key replays a create",
                    },
                    "replayed": {"type": "boolean"},
                },
            },
        ]
    }
    tenant_settings = {
        "type": "object",
        "additionalProperties": True,  # plugins' tenant fields: a budget
        "properties": {"limits": TenantLimits.model_json_schema(ref_template=_REF)},
    }
    tenant = {
        "allOf": [
            _ref("TenantSettings"),
            {
                "type": "object",
                "required": ["name", "labels"],
                "properties": {
                    "name": _NAME,
                    "labels": _LABELS,
                    "created_at": _TIME,
                    "created_by": {"type": "string"},
                    "updated_at": _TIME,
                    "updated_by": {"type": "string"},
                },
            },
        ]
    }
    return {
        **definitions,
        "KeySettings": settings,
        "Key": key_view,
        "KeyWithSecret": with_secret,
        "NewKey": {
            "allOf": [
                _ref("KeySettings"),
                {"type": "object", "required": ["name"], "properties": {"name": _NAME, "tenant": _NAME}},
            ]
        },
        "Tenant": tenant,
        "TenantSettings": tenant_settings,
        "NewTenant": {
            "allOf": [
                _ref("TenantSettings"),
                {"type": "object", "required": ["name"], "properties": {"name": _NAME, "labels": _LABELS}},
            ]
        },
        "TenantChange": {"allOf": [_ref("TenantSettings"), {"type": "object", "properties": {"labels": _LABELS}}]},
        "Rotation": {
            "type": "object",
            "properties": {
                "grace_s": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 2_592_000,
                    "description": "seconds the old secret keeps working",
                }
            },
        },
        "AdminToken": {
            "type": "object",
            "required": ["name", "role"],
            "properties": {
                "name": _NAME,
                "role": {"enum": list(ROLES)},
                "tenant": {"type": ["string", "null"]},
                "expires_at": {"type": ["string", "null"], "format": "date-time"},
                "created_at": _TIME,
                "created_by": {"type": "string"},
            },
        },
        "NewAdminToken": {
            "type": "object",
            "required": ["name", "role"],
            "properties": {
                "name": _NAME,
                "role": {"enum": list(ROLES)},
                "tenant": {**_NAME, "description": "a tenant-admin's tenant; no other role names one"},
                "expires_at": _TIME,
            },
        },
        "AdminTokenWithSecret": {
            "allOf": [
                _ref("AdminToken"),
                {"type": "object", "properties": {"secret": {"type": "string", "description": "shown once, here"}}},
            ]
        },
        "Usage": {
            "type": "object",
            "required": ["name", "at", "reports"],
            "properties": {
                "name": {"type": "string"},
                "tenant": {"type": ["string", "null"]},
                "at": _TIME,
                "reports": {
                    "type": "object",
                    "description": "by plugin: `ledger` (today, this_month: requests, "
                    "tokens, cost ...), `budget` (windows: name, limit, spent, remaining, resets_at)",
                    "additionalProperties": {"type": "object"},
                },
            },
        },
        "Deleted": {
            "type": "object",
            "required": ["name", "deleted"],
            "properties": {"name": {"type": "string"}, "deleted": {"const": True}},
        },
        "AuditEntry": {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "at": _TIME,
                "actor": {"type": "string"},
                "role": {"type": "string"},
                "action": {"type": "string", "description": "key.create, key.disable, tenant.delete, ..."},
                "tenant_scope": {"type": ["string", "null"]},
                "outcome": {"type": "string", "description": "ok, or denied"},
                "target_kind": {"type": ["string", "null"]},
                "target": {"type": ["string", "null"]},
                "tenant": {"type": ["string", "null"]},
                "before": {},
                "after": {},
                "source_ip": {"type": ["string", "null"]},
                "request_id": {"type": ["string", "null"]},
            },
        },
        "RequestRecord": _RECORD,
        "RequestsPage": {
            "type": "object",
            "required": ["requests", "next"],
            "properties": {
                "requests": {"type": "array", "items": _RECORD},
                "next": {"type": ["string", "null"], "description": "`before` for the next (older) page"},
            },
        },
        "RequestFound": {"type": "object", "required": ["request"], "properties": {"request": _RECORD}},
        "Spend": {
            "type": "object",
            "required": ["rows"],
            "properties": {
                "by": {"type": "array", "items": {"type": "string"}},
                "since": {"type": ["string", "null"]},
                "until": {"type": ["string", "null"]},
                "cut": {"type": "boolean"},
                "rows": {"type": "array", "items": {"type": "object", "additionalProperties": True}},
            },
        },
        "Channels": {
            "type": "object",
            "required": ["channels"],
            "properties": {
                "at": _TIME,
                "channels": {
                    "type": "array",
                    "items": {"type": "object", "required": ["name", "breaker"], "additionalProperties": True},
                },
            },
        },
        "AdminError": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["code", "message", "field"],
                    "properties": {
                        "code": {"type": "string"},
                        "message": {"type": "string"},
                        "field": {"type": ["string", "null"], "description": "the path of the field at fault"},
                    },
                }
            },
        },
    }


def _list(field: str, model: str, **more: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "required": [field],
        "properties": {field: {"type": "array", "items": _ref(model)}, **more},
    }


# (method, path, summary, request body's schema, answer's schema, query parameters)
OPERATIONS: list[tuple[str, str, str, str | None, dict[str, Any], list[str]]] = [
    (
        "GET",
        "/keys",
        "List keys, stored and configured (a tenant-admin sees its tenant's stored keys)",
        None,
        _list("keys", "Key"),
        ["tenant", "label", "state"],
    ),
    ("POST", "/keys", "Create a key; its secret is in this answer only", "NewKey", _ref("KeyWithSecret"), []),
    ("GET", "/keys/{name}", "A key", None, _ref("Key"), []),
    (
        "PATCH",
        "/keys/{name}",
        "Change a stored key's settings (objects merged field by field; null resets a field)",
        "KeySettings",
        _ref("Key"),
        [],
    ),
    ("DELETE", "/keys/{name}", "Delete a stored key", None, _ref("Deleted"), []),
    ("POST", "/keys/{name}/disable", "Disable a stored key", None, _ref("Key"), []),
    ("POST", "/keys/{name}/enable", "Enable a stored key", None, _ref("Key"), []),
    (
        "POST",
        "/keys/{name}/rotate",
        "A new secret; the old one works for grace_s more",
        "Rotation",
        _ref("KeyWithSecret"),
        [],
    ),
    (
        "GET",
        "/keys/{name}/usage",
        "What the running gateway's plugins know of a key now: its spend today and "
        "this month (the ledger), its budgets' windows (the budget)",
        None,
        _ref("Usage"),
        [],
    ),
    ("GET", "/tenants", "List tenants", None, _list("tenants", "Tenant"), []),
    ("POST", "/tenants", "Create a tenant", "NewTenant", _ref("Tenant"), []),
    ("GET", "/tenants/{name}", "A tenant", None, _ref("Tenant"), []),
    (
        "PATCH",
        "/tenants/{name}",
        "Change a tenant's labels (given whole) and settings (merged; null resets one)",
        "TenantChange",
        _ref("Tenant"),
        [],
    ),
    ("DELETE", "/tenants/{name}", "Delete a tenant with no keys", None, _ref("Deleted"), []),
    ("GET", "/tenants/{name}/usage", "A tenant's spend and budgets, every key of it together", None, _ref("Usage"), []),
    ("GET", "/admin-tokens", "List admin tokens (never their secrets)", None, _list("admin_tokens", "AdminToken"), []),
    (
        "POST",
        "/admin-tokens",
        "Create an admin token; its secret is in this answer only",
        "NewAdminToken",
        _ref("AdminTokenWithSecret"),
        [],
    ),
    ("DELETE", "/admin-tokens/{name}", "Delete an admin token", None, _ref("Deleted"), []),
    (
        "GET",
        "/audit",
        "The audit trail, newest first",
        None,
        _list("entries", "AuditEntry", next_before={"type": ["integer", "null"]}),
        ["tenant", "target", "actor", "limit", "before"],
    ),
    (
        "GET",
        "/requests",
        "The requests recorded (the usage ledger), newest first; a tenant-admin's are its tenant's",
        None,
        _ref("RequestsPage"),
        ["key", "tenant", "model", "route", "status", "since", "until", "request_id", "limit", "before"],
    ),
    (
        "GET",
        "/requests/{id}",
        "One request's record: tokens, cost, time split, channel, attempts, error, trace",
        None,
        _ref("RequestFound"),
        [],
    ),
    (
        "GET",
        "/spend",
        "Spend summed over a span, grouped",
        None,
        _ref("Spend"),
        ["since", "until", "by", "tenant", "key", "model"],
    ),
    (
        "GET",
        "/channels",
        "This instance's breakers and pools, and the fleet's recent error rates",
        None,
        _ref("Channels"),
        [],
    ),
]
# A recorded request (plugins/ledger/record.py): its columns, open to more.
_RECORD = {
    "type": ["object", "null"],
    "additionalProperties": True,
    "properties": {
        "request_id": {"type": "string"},
        "at": _TIME,
        "status": {"type": "integer"},
        "cost": {"type": "number"},
    },
}

_QUERY = {
    "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
    "before": {"type": "integer", "minimum": 1},
    "status": {"type": "string", "pattern": "^[1-5]([0-9][0-9]|xx)$", "description": "404, or a class: 5xx"},
    "since": {"type": "string", "description": "a span back from now (30m, 12h, 7d) or an ISO date/time"},
    "until": {"type": "string", "description": "an ISO date/time"},
    "by": {"type": "string", "description": "one to three of key, tenant, model, route, channel, status, day"},
    "state": {"enum": ["active", "disabled", "expired"]},
    "label": {"type": "string", "description": "name=value"},
}
_ERRORS = {
    "400": "A field breaks a rule (`field` names it)",
    "401": "No admin credential, or an unknown one",
    "403": "The caller's role may not do this",
    "404": "No such record",
    "409": "A name taken, a configured key, or a tenant with keys",
    "413": "The body is over 64 KB",
    "503": "The key store (PostgreSQL) does not answer",
}


def _done(method: str, path: str) -> list[tuple[str, str]]:
    if method != "POST" or path.count("/") != 1:
        return [("200", "Done")]
    if path == "/keys":
        return [("201", "Created"), ("200", "A create made before under this Idempotency-Key (no secret)")]
    return [("201", "Created")]


def admin_openapi_document(prefix: str = "/admin/v1") -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for method, path, summary, body, answer, query in OPERATIONS:
        operation: dict[str, Any] = {
            "operationId": f"{method.lower()}{path.replace('/', '_').replace('{', '').replace('}', '')}",
            "summary": summary,
            "parameters": [{"name": "name", "in": "path", "required": True, "schema": _NAME}]
            if "{name}" in path
            else [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
            if "{id}" in path
            else [],
            "responses": {
                status: {"description": why, "content": {"application/json": {"schema": answer}}}
                for status, why in _done(method, path)
            }
            | {
                status: {"description": why, "content": {"application/json": {"schema": _ref("AdminError")}}}
                for status, why in _ERRORS.items()
            },
        }
        operation["parameters"] += [
            {
                "name": q,
                "in": "query",
                "required": False,
                "schema": _QUERY.get(q, {"type": "string"})
                if path != "/requests" or q != "before"
                else {"type": "string", "description": "the last page's `next`"},
            }
            for q in query
        ]
        if path == "/keys" and method == "POST":
            operation["parameters"].append(
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,200}$"},
                    "description": "a create repeated with it makes one key",
                }
            )
        if body is not None:
            operation["requestBody"] = {
                "required": path != "/keys/{name}/rotate",
                "content": {"application/json": {"schema": _ref(body)}},
            }
        paths.setdefault(prefix + path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "modelgate admin API",
            "version": __version__,
            "description": "Keys, tenants, admin tokens, the audit trail, the requests recorded, spend and "
            "channels, on the admin listener "
            "(server.admin_listen). Every call names who asks: server.admin_token, an admin "
            "token of the key store, or an OIDC bearer JWT.",
        },
        "paths": paths,
        "security": [{"bearer": []}],
        "components": {"schemas": _schemas(), "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
