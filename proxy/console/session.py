"""The console's sessions: who signed in, held in a signed cookie, and the token every change
must carry (CSRF).

A session is a small JSON payload (who, their role and tenant, how they signed in, when it ends,
its CSRF token) and an HMAC-SHA256 over it with the key the key store keeps for every instance,
so any instance reads a session any other made. The cookie is HttpOnly (no script reads it),
SameSite=Lax (no other site's form or fetch carries it; a sign-in coming back from an OIDC
provider is a top-level navigation, which does), Secure when the console is reached over TLS,
and scoped to /console. A session made with an admin token names that token's digest and is
checked against the store on every page: a deleted or expired token ends its sessions at once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from aiohttp import web

COOKIE = "modelgate_console"
PRE_COOKIE = "modelgate_console_signin"  # the sign-in form's CSRF token, and an OIDC sign-in's state
PATH = "/console"


@dataclass(slots=True, frozen=True)
class Session:
    actor: str  # the audit trail's name for who signed in (token:NAME, oidc:SUBJECT, admin_token)
    role: str
    tenant: str | None
    via: str  # "owner" (server.admin_token), "token" (a stored admin token) or "oidc"
    token_sha256: str | None  # a stored admin token's digest (hex), checked on every page
    expires: float  # epoch seconds
    csrf: str


class Sessions:
    """Makes and reads session cookies with one key (`secret`, 32 bytes or more)."""

    def __init__(self, secret: bytes, hours: float) -> None:
        self._key = hashlib.sha256(b"modelgate console sessions\x00" + secret).digest()
        self.seconds = hours * 3600

    def make(
        self,
        actor: str,
        role: str,
        tenant: str | None,
        via: str,
        token_sha256: str | None = None,
        until: float | None = None,
    ) -> Session:
        expires = time.time() + self.seconds
        return Session(
            actor, role, tenant, via, token_sha256, min(expires, until or expires), secrets.token_urlsafe(24)
        )

    def sign(self, session: Session) -> str:
        return self.signed(asdict(session))

    def signed(self, data: dict[str, Any]) -> str:
        """`data` as JSON, with its MAC: readable by the browser, changeable by nobody."""
        payload = base64.urlsafe_b64encode(orjson.dumps(data)).rstrip(b"=")
        return f"{payload.decode()}.{self._mac(payload)}"

    def unsigned(self, value: str) -> dict[str, Any] | None:
        """What `signed` made of a dict, if this key made it; else None."""
        payload, _, mac = value.partition(".")
        if (
            not payload
            or len(value) > 4096
            or not value.isascii()
            or not hmac.compare_digest(mac.encode(), self._mac(payload.encode()).encode())
        ):
            return None
        try:
            data = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def read(self, request: web.Request) -> Session | None:
        """The request's session: signed by this key, whole and unexpired; else None."""
        fields = self.unsigned(request.cookies.get(COOKIE, ""))
        try:
            session = Session(**fields) if fields is not None else None
        except TypeError:
            return None
        return session if session is not None and session.expires > time.time() else None

    def set(self, response: web.StreamResponse, session: Session, secure: bool) -> None:
        response.set_cookie(
            COOKIE,
            self.sign(session),
            max_age=max(1, int(session.expires - time.time())),
            path=PATH,
            httponly=True,
            samesite="Lax",
            secure=secure,
        )

    @staticmethod
    def clear(response: web.StreamResponse) -> None:
        response.del_cookie(COOKIE, path=PATH)

    def owner_mark(self, digest: bytes | None) -> str | None:
        """What a session made with `server.admin_token` holds of it: a MAC of its digest, so the
        cookie (readable, if not changeable) offers nothing to guess a chosen token against."""
        return None if digest is None else self._mac(b"owner\x00" + digest)

    def _mac(self, payload: bytes) -> str:
        return base64.urlsafe_b64encode(hmac.new(self._key, payload, hashlib.sha256).digest()).rstrip(b"=").decode()


def csrf_holds(expected: str, given: str | None) -> bool:
    """The form's token is the session's (compared in constant time)."""
    return given is not None and hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogateescape"))
