"""Signing in to the console: with an admin token (`server.admin_token`, or one the key store
made), or through the configured OIDC provider with the authorization code flow and PKCE.

The OIDC flow's protocol parts are authlib's (the authorization URL, the PKCE challenge, the
token request, the callback's parameters); the ID token is checked as the admin API checks a
bearer JWT (proxy/keystore/oidc.py: the issuer's keys, its issuer, this client as audience,
expiry), and its nonce against the one this browser was given. The state, nonce and PKCE
verifier ride in a signed cookie of ten minutes' life, so any instance can finish a sign-in
another began.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from authlib.common.errors import AuthlibBaseError
from authlib.oauth2.rfc6749.parameters import parse_authorization_code_response, prepare_grant_uri
from authlib.oauth2.rfc7636 import create_s256_code_challenge

from proxy.config.key_store import OidcConfig
from proxy.console.answers import pre_token, read_form, same_origin, see_other
from proxy.console.session import COOKIE, PATH, PRE_COOKIE, Sessions, csrf_holds
from proxy.core import jsonutil
from proxy.keystore.oidc import OidcRefused, OidcVerifier

if TYPE_CHECKING:
    from proxy.console import Console


log = logging.getLogger("modelgate.console")

FLOW_S = 600  # a sign-in through the provider must come back within this
MAX_DOCUMENT = 1024 * 1024
_DISCOVERY_S = 300.0  # the provider's discovery document is read again after this


class SignInFailures:
    """Wrong tokens from one address: past `most` within `window_s`, that address is turned away
    until the window has passed (an operator-chosen `server.admin_token` must not be guessed
    online). Each process counts its own; at most `addresses` are remembered, the oldest let go."""

    def __init__(
        self,
        most: int = 10,
        window_s: float = 60.0,
        addresses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.most, self.window_s, self.addresses, self.clock = most, window_s, addresses, clock
        self._seen: OrderedDict[str, list[float]] = OrderedDict()

    def barred(self, source: str) -> bool:
        times = self._seen.get(source)
        if not times:
            return False
        now = self.clock()
        times[:] = [t for t in times if now - t < self.window_s]
        return len(times) >= self.most

    def failed(self, source: str) -> None:
        times = self._seen.pop(source, [])
        times.append(self.clock())
        self._seen[source] = times[-self.most :]
        if len(times) == self.most:
            log.warning(
                "console sign-in: wrong tokens from one address; it is turned away for a while",
                extra={"source_ip": source, "failures": self.most, "window_s": self.window_s},
            )
        while len(self._seen) > self.addresses:
            self._seen.popitem(last=False)


FAILURES = SignInFailures()


async def signin_page(console: Console, request: web.Request) -> web.StreamResponse:
    if await console.session(request) is not None:
        return see_other(f"{PATH}/keys")
    return await _form(console, request, pre_token(request))


async def _form(
    console: Console, request: web.Request, token: str, status: int = 200, problem: str | None = None
) -> web.StreamResponse:
    response = console.render(
        request, "signin.html", status, token=token, problem=problem, oidc=console.config().oidc is not None
    )
    response.set_cookie(
        PRE_COOKIE,
        token,
        max_age=FLOW_S,
        path=PATH,
        httponly=True,
        samesite="Strict",
        secure=console.secure_cookies(request),
    )
    return response


async def signin_with_token(console: Console, request: web.Request) -> web.StreamResponse:
    form = await read_form(request)
    expected = request.cookies.get(PRE_COOKIE, "")
    if (
        not expected
        or not csrf_holds(expected, form.get("csrf"))
        or not same_origin(request, console.config().public_url)
    ):
        return await _form(
            console,
            request,
            pre_token(request),
            403,
            "The sign-in form had expired or did not come from this console. Try again.",
        )
    source = request.remote or ""
    if FAILURES.barred(source):
        return await _form(
            console,
            request,
            pre_token(request),
            429,
            f"Too many wrong tokens from this address: try again in {FAILURES.window_s:g} s.",
        )
    credential = form.get("token", "").strip()
    sessions = await console.sessions()
    digest = hashlib.sha256(credential.encode("utf-8", "surrogateescape")).digest()
    owner = console.owner_digest()
    if credential and owner is not None and secrets.compare_digest(digest, owner):
        session = sessions.make("admin_token", "owner", None, "owner", sessions.owner_mark(digest))
    else:
        found = await console.ops.store.admin_token(digest) if credential else None
        if found is None:
            FAILURES.failed(source)
            return await _form(console, request, pre_token(request), 401, "Unknown, expired or deleted admin token.")
        name, role, tenant = found
        session = sessions.make(f"token:{name}", role, tenant, "token", digest.hex())
    log.info("console sign-in", extra={"actor": session.actor, "role": session.role, "via": session.via})
    return _signed_in(sessions, session, console.secure_cookies(request))


async def signout(console: Console, request: web.Request) -> web.StreamResponse:
    sessions = await console.sessions()
    session = sessions.read(request)
    form = await read_form(request)
    response = see_other(f"{PATH}/signin")
    if session is None:
        return response  # nothing to end (and another site's form may not clear a cookie it never saw)
    if not csrf_holds(session.csrf, form.get("csrf")) or not same_origin(request, console.config().public_url):
        return console.error(request, session, 403, "This sign-out did not come from a console page.")
    response.del_cookie(COOKIE, path=PATH)
    return response


async def oidc_start(console: Console, request: web.Request) -> web.StreamResponse:
    config = console.config().oidc
    if config is None:
        return console.error(request, None, 404, "Sign-in through an OIDC provider is not configured.")
    try:
        provider = await _discovered(console, config.issuer)
    except (OSError, TimeoutError, aiohttp.ClientError, ValueError) as exc:
        log.warning("the OIDC provider's discovery document could not be read", extra={"error": str(exc)})
        return console.error(request, None, 503, "The sign-in provider does not answer; try again shortly.")
    state, nonce, verifier = secrets.token_urlsafe(24), secrets.token_urlsafe(24), secrets.token_urlsafe(48)
    url = prepare_grant_uri(
        provider["authorization_endpoint"],
        config.client_id,
        "code",
        config.redirect_url,
        " ".join(config.scopes),
        state,
        nonce=nonce,
        code_challenge=create_s256_code_challenge(verifier),
        code_challenge_method="S256",
    )
    response = see_other(url)
    flow = (await console.sessions()).signed(
        {"state": state, "nonce": nonce, "verifier": verifier, "until": time.time() + FLOW_S}
    )
    # Lax: the provider sends the browser back with a top-level GET, which must carry it.
    response.set_cookie(
        PRE_COOKIE,
        flow,
        max_age=FLOW_S,
        path=PATH,
        httponly=True,
        samesite="Lax",
        secure=console.secure_cookies(request),
    )
    return response


async def oidc_callback(console: Console, request: web.Request) -> web.StreamResponse:
    config = console.config().oidc
    if config is None:
        return console.error(request, None, 404, "Sign-in through an OIDC provider is not configured.")
    sessions = await console.sessions()
    flow = sessions.unsigned(request.cookies.get(PRE_COOKIE, ""))
    if flow is None or not isinstance(flow.get("until"), (int, float)) or flow["until"] < time.time():
        return console.error(request, None, 400, "This sign-in was not started here, or took too long. Start again.")
    try:
        given = parse_authorization_code_response(str(request.rel_url), flow["state"])
    except (AuthlibBaseError, KeyError, ValueError) as exc:
        error = getattr(exc, "error", None) or request.query.get("error") or "invalid_response"
        return console.error(request, None, 401, f"The sign-in provider did not sign you in ({_plain(error)}).")
    try:
        provider = await _discovered(console, config.issuer)
        tokens = await _token(
            config.client_id,
            config.client_secret,
            provider["token_endpoint"],
            given["code"],
            config.redirect_url,
            flow["verifier"],
        )
        verifier = _verifier(console, config, provider["jwks_uri"])
        claims = await verifier.claims(tokens["id_token"])
        if not secrets.compare_digest(str(claims.get("nonce", "")), flow["nonce"]):
            raise OidcRefused("the ID token was not issued for this sign-in (its nonce differs)")
        actor = verifier.actor_of(claims, request.remote, None)
    except OidcRefused as exc:
        return console.error(request, None, 401, f"The sign-in was refused: {exc}")
    except (OSError, TimeoutError, aiohttp.ClientError, ValueError, KeyError, TypeError) as exc:
        log.warning("an OIDC sign-in could not be finished", extra={"error": type(exc).__name__})
        return console.error(request, None, 502, "The sign-in provider's answer could not be used; try again.")
    session = sessions.make(actor.name, actor.role, actor.tenant, "oidc")
    log.info("console sign-in", extra={"actor": session.actor, "role": session.role, "via": session.via})
    response = _signed_in(sessions, session, console.secure_cookies(request))
    response.del_cookie(PRE_COOKIE, path=PATH)
    return response


ROUTES = [
    ("GET", "/signin", signin_page),
    ("POST", "/signin", signin_with_token),
    ("POST", "/signout", signout),
    ("GET", "/oidc/start", oidc_start),
    ("GET", "/oidc/callback", oidc_callback),
]


def _signed_in(sessions: Sessions, session: Any, secure: bool) -> web.StreamResponse:
    response = see_other(f"{PATH}/keys")
    sessions.set(response, session, secure)
    return response


async def _discovered(console: Console, issuer: str) -> dict[str, Any]:
    cached = console.oidc_cache.get("provider")
    if cached is not None and cached[0] == issuer and time.monotonic() - cached[1] < _DISCOVERY_S:
        return cached[2]
    document = await _get_json(f"{issuer}/.well-known/openid-configuration")
    for field in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
        if not isinstance(document.get(field), str) or not document[field].startswith(("https://", "http://")):
            raise ValueError(f"the discovery document has no usable {field}")
    if document.get("issuer") != issuer:
        raise ValueError("the discovery document names another issuer")
    console.oidc_cache["provider"] = (issuer, time.monotonic(), document)
    return document


def _verifier(console: Console, config: Any, jwks_uri: str) -> OidcVerifier:
    """One per provider key set, kept: it caches the keys and fetches them again on rotation."""
    cached = console.oidc_cache.get("verifier")
    if cached is not None and cached.config.jwks_url == jwks_uri and cached.config.audience == config.client_id:
        return cached
    verifier = OidcVerifier(
        OidcConfig(
            issuer=config.issuer,
            audience=config.client_id,
            jwks_url=jwks_uri,
            role_claim=config.role_claim,
            tenant_claim=config.tenant_claim,
            leeway_s=config.leeway_s,
        )
    )
    console.oidc_cache["verifier"] = verifier
    return verifier


async def _get_json(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        async with http.get(url) as answer:
            if answer.status != 200:
                raise OSError(f"{answer.status} from the provider")
            raw = await answer.content.read(MAX_DOCUMENT + 1)
    if len(raw) > MAX_DOCUMENT:
        raise ValueError("the provider's document is over 1 MB")
    found = jsonutil.loads(raw)
    if not isinstance(found, dict):
        raise ValueError("the provider's document is not a JSON object")
    return found


async def _token(
    client_id: str, client_secret: str | None, endpoint: str, code: str, redirect_url: str, verifier: str
) -> dict[str, Any]:
    """The authorization code exchanged, with the PKCE verifier (and the client's secret, by HTTP
    Basic, when it has one)."""
    from authlib.oauth2.rfc6749.parameters import prepare_token_request

    body = prepare_token_request(
        "authorization_code", code=code, redirect_uri=redirect_url, client_id=client_id, code_verifier=verifier
    )
    auth = aiohttp.BasicAuth(client_id, client_secret) if client_secret else None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        async with http.post(
            endpoint,
            data=body,
            auth=auth,
            headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"},
        ) as answer:
            raw = await answer.content.read(MAX_DOCUMENT + 1)
            if answer.status != 200:
                raise OSError(f"the token endpoint answered {answer.status}")
    found = jsonutil.loads(raw[:MAX_DOCUMENT])
    if not isinstance(found, dict) or not isinstance(found.get("id_token"), str):
        raise ValueError("the token endpoint's answer has no ID token")
    return found


def _plain(text: str) -> str:
    return "".join(c for c in str(text)[:80] if c.isalnum() or c in "_-. ")
