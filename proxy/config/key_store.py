"""`key_store:`: where keys, tenants and admin tokens managed at run time live (PostgreSQL), and
how each process keeps its copy of them current (proxy/keystore/).

    key_store:
      database_url: ${MODELGATE_DATABASE_URL}   # the ledger's database serves as well
      resync_s: 30                              # a full re-read now and then heals a missed notice
      revoked_streams: end                      # streams open under a revoked key: end, or finish

Off until `database_url` is set: the keys are then the config file's alone.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from proxy.state.postgres import postgres_url


class OidcConfig(BaseModel):
    """OIDC sign-in to the admin API (proxy/keystore/oidc.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: str = Field(min_length=1)
    audience: str = Field(min_length=1)
    jwks_url: str  # the issuer's published keys (its discovery document's `jwks_uri`)
    role_claim: str = "modelgate_role"
    tenant_claim: str = "modelgate_tenant"
    # Asymmetric only: a shared-secret algorithm would let anyone holding the "public" key sign.
    algorithms: list[
        Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
    ] = Field(default_factory=lambda: ["RS256", "ES256", "PS256", "EdDSA"], min_length=1)
    jwks_cache_s: float = Field(default=300.0, ge=1, le=86_400)
    leeway_s: int = Field(default=30, ge=0, le=300)  # clock skew allowed on exp and nbf

    @field_validator("jwks_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s/?#]+(/\S*)?", value):
            raise ValueError("an http(s) URL")
        return value


class KeyStoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    database_url: str | None = Field(default=None, repr=False)  # holds a password, often
    # Each process is told of a change at once (LISTEN/NOTIFY); this often it reads everything
    # changed since its last revision all the same, so a notice lost with a connection heals.
    resync_s: float = Field(default=30.0, ge=1, le=3600)
    # How long a call to the store may take before the admin API answers 503.
    timeout_s: float = Field(default=5.0, gt=0, le=60)
    oidc: OidcConfig | None = None  # bearer JWTs from an issuer, beside admin tokens
    # A stream already open under a key that is disabled, deleted or expires: ended with the
    # format's error event (401 api_key_revoked) within a second, or let run to its end.
    revoked_streams: Literal["end", "finish"] = "end"

    @model_validator(mode="after")
    def _oidc_needs_the_store(self) -> KeyStoreConfig:
        if self.oidc is not None and self.database_url is None:
            raise ValueError("oidc signs in to the admin API, which needs database_url")
        return self

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        return postgres_url(value)
