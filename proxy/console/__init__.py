"""The web console: keys, tenants, spend, requests, channels and the audit trail in a browser,
served on the admin listener at `/console` (docs/console.md).

It has no powers of its own. Each page calls the admin API's operations (proxy/keystore/
operations.py, reads.py) as the signed-in admin, so the API's roles decide what each person
sees and may change, and every change lands in the audit trail under their name. Pages are
rendered on the server (Jinja2, every value escaped); the one script and one stylesheet are
files of this package, served from `/console/static/`, and the Content-Security-Policy lets the
page load nothing else, from nowhere else: no inline script, no third-party origin, no
internet needed.

`Console.routes()` lists what the app adds to the admin surface; each page handler gets a `Page`
(proxy/console/answers.py): the request, the signed-in admin as an `Actor`, and their session.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import jinja2
from aiohttp import web

from proxy.config.console import ConsoleConfig
from proxy.console import pages, signin
from proxy.console.answers import (
    SECURITY_HEADERS,
    FormProblem,
    Page,
    origin_of,
    read_form,
    same_origin,
    secure,
    see_other,
)
from proxy.console.session import COOKIE, PATH, Session, Sessions, csrf_holds
from proxy.keystore.operations import AdminError, AdminOps
from proxy.keystore.reads import AdminReads
from proxy.keystore.records import Actor
from proxy.state.postgres import SchemaTooNew

log = logging.getLogger("modelgate.console")

HERE = Path(__file__).parent
_STATIC = {"console.css": "text/css", "console.js": "text/javascript"}
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")  # as the admin API takes a caller's id for the audit trail

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


PageHandler = Callable[["Console", Page], Awaitable[web.StreamResponse]]


class Console:
    """The console over one AdminOps and AdminReads. `sessions()` gives the session signer (its
    key the key store's); `owner_digest()` is `server.admin_token`'s SHA-256 (None: none set)."""

    def __init__(
        self,
        config: Callable[[], ConsoleConfig],
        ops: AdminOps,
        reads: AdminReads,
        owner_digest: Callable[[], bytes | None],
        gateway_url: Callable[[], str],
        example_model: Callable[[list[str]], str | None] = lambda globs: None,
    ) -> None:
        self.config = config
        self.example_model = example_model  # a model a key's `models` allow, for the snippets
        self.ops = ops
        self.reads = reads
        self.owner_digest = owner_digest
        self.gateway_url = gateway_url
        self._sessions: Sessions | None = None
        self.oidc_cache: dict[str, Any] = {}  # the provider's discovery document, and its keys' verifier
        self.templates = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)

    def routes(self) -> list[tuple[str, str, Handler]]:
        found: list[tuple[str, str, Handler]] = [
            ("GET", PATH, self._redirect_home),
            ("GET", PATH + "/", self._redirect_home),
            ("GET", PATH + "/static/{file}", self._static),
            *((method, PATH + path, self._public(handler)) for method, path, handler in signin.ROUTES),
        ]
        for method, path, handler in pages.ROUTES:
            found.append((method, PATH + path, self._signed_in(handler, method != "GET")))
        return found

    async def sessions(self) -> Sessions:
        if self._sessions is None:
            self._sessions = Sessions(await self.ops.store.console_secret(), self.config().session_hours)
        return self._sessions

    # --- answering ---

    def secure_cookies(self, request: web.Request) -> bool:
        """Cookies only over TLS when browsers reach the console over TLS (`console.public_url`
        says so behind a proxy that ends TLS)."""
        return origin_of(request, self.config().public_url).startswith("https:")

    def render(self, request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
        session: Session | None = context.pop("session", None)
        body = self.templates.get_template(template).render(
            session=session, csrf=session.csrf if session else "", path=request.path, **context
        )
        return secure(web.Response(status=status, text=body, content_type="text/html", charset="utf-8"))

    def error(self, request: web.Request, session: Session | None, status: int, message: str) -> web.Response:
        return self.render(request, "error.html", status, session=session, status_code=status, message=message)

    # --- the guards ---

    def _public(self, handler: Callable[[Console, web.Request], Awaitable[web.StreamResponse]]) -> Handler:
        async def public(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(self, request)
            except FormProblem as exc:  # a sign-in or sign-out form too large or not UTF-8
                return self.error(request, None, 400, str(exc))
            except _STORE_AWAY as exc:
                return self._store_away(request, None, exc)

        return public

    def _signed_in(self, handler: PageHandler, changes: bool) -> Handler:
        async def page(request: web.Request) -> web.StreamResponse:
            session: Session | None = None
            try:
                session = await self.session(request)
                if session is None:
                    gone = see_other(f"{PATH}/signin")
                    gone.del_cookie(COOKIE, path=PATH)  # one that no longer holds: not sent again
                    return gone
                if changes:
                    form = await read_form(request)
                    if not csrf_holds(session.csrf, form.get("csrf")) or not same_origin(
                        request, self.config().public_url
                    ):
                        return self.error(
                            request,
                            session,
                            403,
                            "This change did not come from a console page "
                            "(its CSRF token is missing or wrong, or another site sent it). Reload "
                            "the page and try again.",
                        )
                given = request.headers.get("X-Request-Id", "")
                actor = Actor(
                    session.actor,
                    session.role,
                    session.tenant,
                    request.remote,
                    given if _REQUEST_ID.fullmatch(given) else secrets.token_hex(16),
                )
                return await handler(self, Page(request, actor, session))
            except AdminError as exc:
                return self.error(
                    request, session, exc.status, f"{exc.field}: {exc.message}" if exc.field else exc.message
                )
            except FormProblem as exc:
                return self.error(request, session, 400, str(exc))
            except asyncpg.DataError:  # a value PostgreSQL cannot hold (a NUL): the asker's, not an outage
                return self.error(request, session, 400, "A value the store cannot hold (a NUL character?).")
            except asyncpg.UniqueViolationError:
                return self.error(request, session, 409, "Taken by a change made at the same time.")
            except _STORE_AWAY as exc:
                return self._store_away(request, session, exc)

        return page

    async def session(self, request: web.Request) -> Session | None:
        """The request's session, signed, unexpired, and made with a credential that still holds."""
        session = (await self.sessions()).read(request)
        if session is None:
            return None
        if session.via == "owner" and session.token_sha256 != (await self.sessions()).owner_mark(self.owner_digest()):
            return None  # server.admin_token changed by a reload, or taken away
        if session.via == "token":  # a deleted or expired admin token ends its sessions at once
            found = await self.ops.store.admin_token(bytes.fromhex(session.token_sha256 or ""))
            if found is None or found[1] != session.role:
                return None
        return session

    def _store_away(self, request: web.Request, session: Session | None, exc: BaseException) -> web.Response:
        log.warning("the console could not reach the key store", extra={"error": type(exc).__name__})
        return self.error(request, session, 503, "The key store (PostgreSQL) does not answer; try again shortly.")

    async def _redirect_home(self, request: web.Request) -> web.StreamResponse:
        return see_other(f"{PATH}/keys")

    async def _static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["file"]
        if name not in _STATIC:
            return web.Response(status=404, text="not found")
        response = web.Response(body=(HERE / "static" / name).read_bytes(), content_type=_STATIC[name])
        response.headers.update({**SECURITY_HEADERS, "Cache-Control": "max-age=300"})
        return response


_STORE_AWAY = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, SchemaTooNew)
