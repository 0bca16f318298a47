"""`console:`: the web console on the admin listener (proxy/console/), served whenever the key
store is configured (it works over the admin API's operations, and signs its sessions with a key
the store keeps for every instance).

    console:
      session_hours: 8
      public_url: https://gateway-admin.example.com   # behind a proxy that ends TLS (else unset)
      trace_url: https://grafana.example.com/explore?traceId={trace_id}   # a request's trace link
      oidc:                                   # sign-in through an OIDC provider (code flow, PKCE)
        issuer: https://login.example.com/realms/platform
        client_id: modelgate-console
        client_secret: ${file:/run/secrets/console-oidc}   # absent: a public client (PKCE alone)
        redirect_url: https://gateway-admin.example.com/console/oidc/callback
        role_claim: modelgate_role            # owner, operator, viewer or tenant-admin
        tenant_claim: modelgate_tenant
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

_HTTP_URL = re.compile(r"https?://[^\s/?#]+(/\S*)?")


class ConsoleOidcConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: str = Field(min_length=1)  # its discovery document is `{issuer}/.well-known/openid-configuration`
    client_id: str = Field(min_length=1)
    client_secret: str | None = Field(default=None, repr=False)
    redirect_url: str  # `/console/oidc/callback` on the admin listener, as the browser reaches it
    scopes: list[str] = Field(default_factory=lambda: ["openid", "profile", "email"], min_length=1)
    role_claim: str = "modelgate_role"
    tenant_claim: str = "modelgate_tenant"
    leeway_s: int = Field(default=30, ge=0, le=300)

    @field_validator("issuer", "redirect_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not _HTTP_URL.fullmatch(value):
            raise ValueError("an http(s) URL")
        return value.rstrip("/") if value.count("/") > 2 else value


class ConsoleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True  # with a key store; off: /console is not served
    # Where browsers reach the console, when a proxy in front of the admin listener ends TLS or
    # renames it (https://gateway-admin.example.com): changes must come from this origin, and its
    # cookies are Secure when it is https. Unset: the admin listener's own address.
    public_url: str | None = None
    session_hours: float = Field(default=8.0, gt=0, le=24 * 7)
    # A request's trace in the team's trace viewer: `{trace_id}` is replaced by its 32 hex digits.
    trace_url: str | None = None
    oidc: ConsoleOidcConfig | None = None

    @field_validator("public_url")
    @classmethod
    def _origin(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^\s/?#]+/?", value):
            raise ValueError("an origin: http(s)://HOST[:PORT], no path")
        return value

    @field_validator("trace_url")
    @classmethod
    def _trace_url(cls, value: str | None) -> str | None:
        if value is not None and (
            "{trace_id}" not in value or not _HTTP_URL.fullmatch(value.replace("{trace_id}", "x"))
        ):
            raise ValueError("an http(s) URL with {trace_id} in it")
        return value
