"""An OIDC provider of the tests' own, for the console's sign-in: discovery, an authorization
endpoint that signs in whoever `claims` names at once (no login form), a token endpoint that
checks the PKCE verifier, the redirect and the client's secret, and its key set."""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from bench.procs import free_port

CLIENT_ID = "modelgate-console"
CLIENT_SECRET = "console-client-secret-4f3e2d1c"


@dataclass
class Provider:
    url: str = ""
    claims: dict[str, Any] = field(default_factory=lambda: {"sub": "alice", "modelgate_role": "operator"})
    signing_key: Any = None  # None: the published key; set to another to sign with a key nobody publishes
    codes: dict[str, dict[str, Any]] = field(default_factory=dict)
    token_requests: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        from joserfc.jwk import RSAKey

        self.key = RSAKey.generate_key(2048, private=True, parameters={"kid": "console-test"})

    def id_token(self, nonce: str) -> str:
        from joserfc import jwt

        key = self.signing_key or self.key
        body = {
            "iss": self.url,
            "aud": CLIENT_ID,
            "exp": int(time.time()) + 300,
            "iat": int(time.time()),
            "nonce": nonce,
            **self.claims,
        }
        return jwt.encode({"alg": "RS256", "kid": key.kid}, body, key)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", self._discovery)
        app.router.add_get("/authorize", self._authorize)
        app.router.add_post("/token", self._token)
        app.router.add_get("/jwks", lambda _: web.json_response({"keys": [self.key.as_dict(private=False)]}))
        return app

    async def _discovery(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "issuer": self.url,
                "authorization_endpoint": f"{self.url}/authorize",
                "token_endpoint": f"{self.url}/token",
                "jwks_uri": f"{self.url}/jwks",
                "code_challenge_methods_supported": ["S256"],
            }
        )

    async def _authorize(self, request: web.Request) -> web.Response:
        asked = request.query
        if (
            asked.get("client_id") != CLIENT_ID
            or asked.get("response_type") != "code"
            or asked.get("code_challenge_method") != "S256"
            or not asked.get("code_challenge")
        ):
            return web.Response(status=400, text="not a PKCE code request from the console")
        code = secrets.token_urlsafe(16)
        self.codes[code] = {
            "challenge": asked["code_challenge"],
            "redirect_uri": asked["redirect_uri"],
            "nonce": asked.get("nonce", ""),
        }
        raise web.HTTPFound(f"{asked['redirect_uri']}?{urlencode({'code': code, 'state': asked.get('state', '')})}")

    async def _token(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        self.token_requests.append(form)  # type: ignore[arg-type]
        expected = "Basic " + base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
        if request.headers.get("Authorization") != expected:
            return web.json_response({"error": "invalid_client"}, status=401)
        grant = self.codes.pop(str(form.get("code", "")), None)
        verifier = str(form.get("code_verifier", ""))
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        if grant is None or challenge != grant["challenge"] or form.get("redirect_uri") != grant["redirect_uri"]:
            return web.json_response({"error": "invalid_grant"}, status=400)
        return web.json_response(
            {
                "access_token": secrets.token_urlsafe(16),
                "token_type": "Bearer",
                "expires_in": 300,
                "id_token": self.id_token(grant["nonce"]),
            }
        )


@asynccontextmanager
async def running_provider() -> AsyncIterator[Provider]:
    provider = Provider()
    runner = web.AppRunner(provider.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    provider.url = f"http://127.0.0.1:{port}"
    try:
        yield provider
    finally:
        await runner.cleanup()
