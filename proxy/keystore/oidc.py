"""OIDC sign-in to the admin API: a bearer JWT from the configured issuer, checked against the
issuer's published keys (JWKS) with a maintained JOSE library (joserfc), the caller's role and
tenant read from claims the config names.

    key_store:
      oidc:
        issuer: https://login.example.com/realms/platform
        audience: modelgate-admin
        jwks_url: https://login.example.com/realms/platform/protocol/openid-connect/certs
        role_claim: modelgate_role        # owner, operator, viewer or tenant-admin
        tenant_claim: modelgate_tenant    # a tenant-admin's tenant

A token must be signed (by a key of the set, with one of `algorithms`: never `none`, never a
shared secret), name the issuer and the audience, carry an expiry still ahead (`leeway_s` of
clock skew allowed) and a role the gateway knows; anything else is 401. The key set is fetched
when first needed, kept `jwks_cache_s`, and fetched again at once (at most every 10 s) for a
token signed by a key it does not hold, so an issuer's key rotation needs nothing here.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet

from proxy.config.key_store import OidcConfig
from proxy.keystore.records import Actor
from proxy.keystore.roles import ROLES

MAX_JWKS_BYTES = 1024 * 1024
_REFETCH_S = 10.0  # the soonest the key set is fetched again for a key it lacks


class OidcRefused(Exception):
    """The token is not one to accept; the message says why (to the caller: no secret in it)."""


class OidcVerifier:
    def __init__(self, config: OidcConfig) -> None:
        self.config = config
        self._keys: KeySet | None = None
        self._fetched_at = -float("inf")
        self._lock = asyncio.Lock()
        self._claims = jwt.JWTClaimsRegistry(
            leeway=config.leeway_s,
            iss={"essential": True, "value": config.issuer},
            aud={"essential": True, "value": config.audience},
            exp={"essential": True},
            sub={"essential": True},
        )

    async def actor(self, token: str, source: str | None, request_id: str | None) -> Actor:
        return self.actor_of(await self.claims(token), source, request_id)

    async def claims(self, token: str) -> dict[str, Any]:
        """The claims of a token signed by the issuer for this audience, now; else OidcRefused."""
        return await self._verified(token)

    def actor_of(self, claims: dict[str, Any], source: str | None, request_id: str | None) -> Actor:
        """Who the verified `claims` name, with the role and tenant their claims give."""
        role = claims.get(self.config.role_claim)
        if role not in ROLES:
            raise OidcRefused(f"the token's '{self.config.role_claim}' claim names no role of {', '.join(ROLES)}")
        tenant = claims.get(self.config.tenant_claim) if role == "tenant-admin" else None
        if role == "tenant-admin" and not isinstance(tenant, str):
            raise OidcRefused(f"a tenant-admin's token names its tenant in '{self.config.tenant_claim}'")
        return Actor(f"oidc:{claims['sub']}", role, tenant, source, request_id)

    async def _verified(self, token: str) -> dict[str, Any]:
        for attempt in range(2):
            keys = await self._key_set(refresh=attempt > 0)
            try:
                decoded = jwt.decode(token, keys, algorithms=self.config.algorithms)
            except JoseError as exc:
                if attempt == 0 and isinstance(exc, InvalidKeyIdError):
                    continue  # signed by a key this set lacks: the issuer may have rotated
                raise OidcRefused(f"the token's signature does not verify ({exc.error})") from None
            except ValueError:
                raise OidcRefused("not a signed JWT") from None
            try:
                self._claims.validate(decoded.claims)
            except JoseError as exc:
                raise OidcRefused(f"the token is not for this gateway now ({exc.description or exc.error})") from None
            return decoded.claims
        raise OidcRefused("the token is signed by a key the issuer does not publish")

    async def _key_set(self, refresh: bool = False) -> KeySet:
        async with self._lock:
            age = time.monotonic() - self._fetched_at
            if self._keys is None or age > self.config.jwks_cache_s or (refresh and age > _REFETCH_S):
                self._keys = await self._fetch()
                self._fetched_at = time.monotonic()
            return self._keys

    async def _fetch(self) -> KeySet:
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            async with http.get(self.config.jwks_url) as answer:
                if answer.status != 200:
                    raise OSError(f"the issuer's key set answered {answer.status}")
                raw = await answer.content.read(MAX_JWKS_BYTES + 1)
        if len(raw) > MAX_JWKS_BYTES:
            raise OSError("the issuer's key set is over 1 MB")
        try:
            return KeySet.import_key_set(json.loads(raw))
        except (ValueError, JoseError, TypeError) as exc:
            raise OSError(f"the issuer's key set does not read ({type(exc).__name__})") from None
