"""What every console answer shares: the security headers, redirects, the forms it reads (whole,
bounded) and the checks that a change came from a console page."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from aiohttp import web

from proxy.console.session import PRE_COOKIE, Session
from proxy.keystore.records import Actor

MAX_FORM = 64 * 1024
SECURITY_HEADERS = {
    # Nothing but this gateway's own files: no inline script or style, no other origin, no frames.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # no-referrer would make browsers send `Origin: null` with a form
    "Cache-Control": "no-store",
}


@dataclass(slots=True, frozen=True)
class Page:
    """What each page handler gets: the request, the signed-in admin as an `Actor`, their session."""

    request: web.Request
    actor: Actor
    session: Session


class FormProblem(ValueError):
    """A form a console page cannot take: said on the page, as a 400."""


def secure(response: web.StreamResponse) -> web.StreamResponse:
    response.headers.update(SECURITY_HEADERS)
    return response


def see_other(location: str) -> web.Response:
    """Where to go after a change or a sign-in (a GET: reloading it changes nothing)."""
    return secure(web.Response(status=303, headers={"Location": location}))  # type: ignore[return-value]


async def read_form(request: web.Request) -> dict[str, str]:
    """A page's form, at most MAX_FORM bytes (read once: kept on the request for its handler)."""
    if "console_form" in request:
        return request["console_form"]
    if request.content_length is not None and request.content_length > MAX_FORM:
        raise FormProblem(f"A form is at most {MAX_FORM // 1024} KB.")
    raw = b""
    while chunk := await request.content.read(MAX_FORM + 1 - len(raw)):  # a read gives what has arrived
        raw += chunk
        if len(raw) > MAX_FORM:
            raise FormProblem(f"A form is at most {MAX_FORM // 1024} KB.")
    try:
        form = dict(parse_qsl(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=200))
    except (UnicodeDecodeError, ValueError):
        raise FormProblem("The form could not be read.") from None
    request["console_form"] = form
    return form


def origin_of(request: web.Request, public_url: str | None) -> str:
    """Where browsers reach the console: `console.public_url` (behind a TLS proxy), else this
    connection's own scheme and Host."""
    if public_url:
        parts = urlsplit(public_url)
        return f"{parts.scheme}://{parts.netloc}"
    return f"{request.scheme}://{request.host}"


def same_origin(request: web.Request, public_url: str | None) -> bool:
    """A change names this console as its origin (browsers send Origin with every form POST);
    one with no Origin at all (an older client) rests on its CSRF token alone."""
    origin = request.headers.get("Origin")
    return origin is None or origin == origin_of(request, public_url)


def pre_token(request: web.Request) -> str:
    """The sign-in form's CSRF token: the one its cookie holds, or a new one."""
    given = request.cookies.get(PRE_COOKIE, "")
    return given if 20 <= len(given) <= 64 and given.isascii() else secrets.token_urlsafe(24)
