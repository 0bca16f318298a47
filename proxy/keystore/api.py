"""The admin API over HTTP: `/admin/v1/...`, served on the admin listener (and on the main one
only to `server.admin_token`, proxy/process/admin.py). Unlike `/metrics`, every call names who
asks, on either listener: `Authorization: Bearer` with `server.admin_token` (an owner) or an
admin token from the key store (its role). Answers are JSON; errors are
`{"error": {"code", "message", "field"}}`, the field being the path of the one at fault.

    GET    /admin/v1/keys[?tenant=&label=k=v&state=]   POST /admin/v1/keys (Idempotency-Key: ...)
    GET    /admin/v1/keys/{name}      PATCH /admin/v1/keys/{name}      DELETE /admin/v1/keys/{name}
    POST   /admin/v1/keys/{name}/disable | /enable | /rotate {"grace_s": 3600}
    GET    /admin/v1/keys/{name}/usage    GET /admin/v1/tenants/{name}/usage  (spend, budgets' windows)
    GET    /admin/v1/tenants          POST /admin/v1/tenants
    GET    /admin/v1/tenants/{name}   PATCH /admin/v1/tenants/{name}   DELETE /admin/v1/tenants/{name}
    GET    /admin/v1/admin-tokens     POST /admin/v1/admin-tokens     DELETE /admin/v1/admin-tokens/{name}
    GET    /admin/v1/audit[?tenant=&target=&actor=&limit=&before=]
    GET    /admin/v1/requests[?key=&tenant=&model=&route=&status=&since=&until=&request_id=&limit=&before=]
    GET    /admin/v1/requests/{id}    GET /admin/v1/spend[?since=&until=&by=&tenant=&key=&model=]
    GET    /admin/v1/channels         (this instance's breakers and pools; the fleet's recent error rates)
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

from proxy.core import jsonutil
from proxy.keystore.oidc import OidcRefused, OidcVerifier
from proxy.keystore.operations import AdminError, AdminOps
from proxy.keystore.reads import AdminReads
from proxy.keystore.records import Actor
from proxy.observability.metrics import ADMIN_REQUESTS
from proxy.state.postgres import SchemaTooNew

log = logging.getLogger("modelgate.admin")

MAX_BODY = 64 * 1024
REQUEST_ID = web.RequestKey("admin_request_id", str)
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
PREFIX = "/admin/v1"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Route = tuple[str, str, Handler]


class AdminApi:
    """The routes, over one AdminOps; `is_admin_token(request)` says whether a request carries
    `server.admin_token` (True), another credential (False) or none (None)."""

    def __init__(
        self,
        ops: AdminOps,
        is_admin_token: Callable[[web.Request], bool | None],
        owner: str = "admin_token",
        oidc: OidcVerifier | None = None,
        reads: AdminReads | None = None,
    ) -> None:
        self.ops = ops
        self.reads = reads  # what the gateway did (None: no gateway runs here, as for the CLI's -c)
        self.oidc = oidc  # bearer JWTs from the configured issuer, when there is one
        self.is_admin_token = is_admin_token
        self.owner = owner  # the audit trail's name for whoever holds that token

    def routes(self) -> list[Route]:
        ops = self.ops
        return [
            (
                "GET",
                "/keys",
                self._call(
                    lambda a, r, b: ops.list_keys(a, r.query.get("tenant"), r.query.get("label"), r.query.get("state"))
                ),
            ),
            (
                "POST",
                "/keys",
                self._call(lambda a, r, b: ops.create_key(a, b, r.headers.get("Idempotency-Key")), created=True),
            ),
            ("GET", "/keys/{name}", self._call(lambda a, r, b: ops.get_key(a, r.match_info["name"]))),
            ("PATCH", "/keys/{name}", self._call(lambda a, r, b: ops.update_key(a, r.match_info["name"], b))),
            ("DELETE", "/keys/{name}", self._call(lambda a, r, b: ops.delete_key(a, r.match_info["name"]))),
            (
                "POST",
                "/keys/{name}/disable",
                self._call(lambda a, r, b: ops.set_enabled(a, r.match_info["name"], False)),
            ),
            ("POST", "/keys/{name}/enable", self._call(lambda a, r, b: ops.set_enabled(a, r.match_info["name"], True))),
            ("POST", "/keys/{name}/rotate", self._call(lambda a, r, b: ops.rotate_key(a, r.match_info["name"], b))),
            ("GET", "/keys/{name}/usage", self._call(lambda a, r, b: ops.key_usage(a, r.match_info["name"]))),
            ("GET", "/tenants", self._call(lambda a, r, b: ops.list_tenants(a))),
            ("POST", "/tenants", self._call(lambda a, r, b: ops.create_tenant(a, b), created=True)),
            ("GET", "/tenants/{name}", self._call(lambda a, r, b: ops.get_tenant(a, r.match_info["name"]))),
            ("PATCH", "/tenants/{name}", self._call(lambda a, r, b: ops.update_tenant(a, r.match_info["name"], b))),
            ("DELETE", "/tenants/{name}", self._call(lambda a, r, b: ops.delete_tenant(a, r.match_info["name"]))),
            ("GET", "/tenants/{name}/usage", self._call(lambda a, r, b: ops.tenant_usage(a, r.match_info["name"]))),
            ("GET", "/admin-tokens", self._call(lambda a, r, b: ops.list_admin_tokens(a))),
            ("POST", "/admin-tokens", self._call(lambda a, r, b: ops.create_admin_token(a, b), created=True)),
            (
                "DELETE",
                "/admin-tokens/{name}",
                self._call(lambda a, r, b: ops.delete_admin_token(a, r.match_info["name"])),
            ),
            (
                "GET",
                "/audit",
                self._call(
                    lambda a, r, b: ops.audit(
                        a,
                        r.query.get("tenant"),
                        r.query.get("target"),
                        r.query.get("actor"),
                        _int(r.query.get("limit", "100"), "limit"),
                        _int(r.query["before"], "before") if "before" in r.query else None,
                    )
                ),
            ),
            *self._read_routes(),
        ]

    def _read_routes(self) -> list[Route]:
        reads = self.reads
        if reads is None:
            return []
        return [
            ("GET", "/requests", self._call(lambda a, r, b: reads.requests(a, r.query))),
            ("GET", "/requests/{id}", self._call(lambda a, r, b: reads.request(a, r.match_info["id"]))),
            ("GET", "/spend", self._call(lambda a, r, b: reads.spend(a, r.query))),
            ("GET", "/channels", self._call(lambda a, r, b: reads.channels(a))),
        ]

    def _call(
        self, operation: Callable[[Actor, web.Request, Any], Awaitable[dict[str, Any]]], created: bool = False
    ) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            # An id for the audit trail and the answer: the caller's, when it is a plain one.
            given = request.headers.get("X-Request-Id", "")
            request[REQUEST_ID] = given if _REQUEST_ID.fullmatch(given) else secrets.token_hex(16)
            response = await answer_of(request)
            response.headers["X-Request-Id"] = request[REQUEST_ID]
            return response

        async def answer_of(request: web.Request) -> web.StreamResponse:
            actor: Actor | None = None
            try:
                actor = await self.actor(request)
                body = await _body(request) if request.method in ("POST", "PATCH") else None
                answer = await operation(actor, request, body)
            except AdminError as exc:
                ADMIN_REQUESTS.labels(actor.role if actor else "none", str(exc.status)).inc()
                return _json(exc.status, exc.body(), {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None)
            except asyncpg.UniqueViolationError:  # two creates of one name at once: the second is told
                ADMIN_REQUESTS.labels(actor.role if actor else "none", "409").inc()
                return _json(409, AdminError(409, "conflict", "taken by a change made at the same time").body())
            except asyncpg.DataError as exc:  # a value PostgreSQL cannot hold (a NUL, a time out of range)
                ADMIN_REQUESTS.labels(actor.role if actor else "none", "400").inc()
                return _json(
                    400,
                    AdminError(400, "invalid_field", f"a value the store cannot hold ({type(exc).__name__})").body(),
                )
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, SchemaTooNew) as exc:
                # The store away or failing: the keys each process holds keep working.
                ADMIN_REQUESTS.labels(actor.role if actor else "none", "503").inc()
                log.warning("the key store did not answer an admin request", extra={"error": type(exc).__name__})
                return _json(
                    503,
                    AdminError(
                        503, "key_store_unavailable", "the key store (PostgreSQL) does not answer; retry later"
                    ).body(),
                    {"Retry-After": "5"},
                )
            status = 201 if created and not answer.get("replayed") else 200
            ADMIN_REQUESTS.labels(actor.role, str(status)).inc()
            return _json(status, answer)

        return handle

    async def actor(self, request: web.Request) -> Actor:
        """Who asks, from `Authorization: Bearer`; AdminError 401 when no credential holds."""
        given = request.headers.get("Authorization", "")
        scheme, _, credential = given.partition(" ")
        source, request_id = request.remote, request[REQUEST_ID]
        if self.is_admin_token(request):
            return Actor(self.owner, "owner", None, source, request_id)
        if scheme.lower() != "bearer" or not credential.strip():
            raise AdminError(
                401, "admin_credential_required", "the admin API needs an admin token: Authorization: Bearer <token>"
            )
        token = credential.strip()
        if self.oidc is not None and token.count(".") == 2:  # a JWT: no admin token has two dots
            try:
                return await self.oidc.actor(token, source, request_id)
            except OidcRefused as exc:
                raise AdminError(401, "invalid_admin_credential", str(exc)) from None
            except (OSError, TimeoutError, aiohttp.ClientError):
                raise AdminError(
                    503, "identity_provider_unavailable", "the issuer's keys cannot be read; retry later"
                ) from None
        found = await self.ops.store.admin_token(
            hashlib.sha256(credential.strip().encode("utf-8", "surrogateescape")).digest()
        )
        if found is None:
            raise AdminError(401, "invalid_admin_credential", "unknown, expired or deleted admin token")
        name, role, tenant = found
        return Actor(f"token:{name}", role, tenant, source, request_id)


async def _body(request: web.Request) -> Any:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise AdminError(413, "body_too_large", f"an admin request's body is at most {MAX_BODY} bytes")
    raw = b""
    while chunk := await request.content.read(MAX_BODY + 1 - len(raw)):  # a read gives what has arrived
        raw += chunk
        if len(raw) > MAX_BODY:
            raise AdminError(413, "body_too_large", f"an admin request's body is at most {MAX_BODY} bytes")
    if not raw.strip():
        return None
    try:
        return jsonutil.loads(raw)
    except ValueError:
        raise AdminError(400, "invalid_json", "the body is not JSON") from None


def _int(value: str, field: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise AdminError(400, "invalid_field", "a whole number", field) from None


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=jsonutil.dumps(body),
        content_type="application/json",
        headers={"Cache-Control": "no-store", **(headers or {})},
    )
