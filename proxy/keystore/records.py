"""What the key store holds, as records: a stored key (never its secret: its SHA-256 digest, and
during a rotation's grace the previous one), a tenant, an admin token, an audit entry; and how a
stored key becomes the `GatewayKey` a request is checked against.

A stored key's settings (`spec`) are a `keys[]` entry of the config file without its name and
secret: the same fields (models, endpoints, labels, limits, expiry, enabled) and the same plugin
fields, validated by the same models, so a key behaves the same wherever it is kept.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from proxy.config.model import KeyConfig, TenantLimits
from proxy.policy.keys import TENANT_LABEL, GatewayKey, GatewayTenant, gateway_key
from proxy.registry import key_settings, key_settings_problems, tenant_settings

SECRET_PREFIX = "mg-"


def new_secret() -> tuple[str, bytes]:
    """A new key or admin token (256 random bits), and its digest: the only part kept."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    return secret, hashlib.sha256(secret.encode()).digest()


class SpecProblem(ValueError):
    """A key's settings that do not validate; `field` is the path of the first problem."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path
        self.message = message


def checked_spec(name: str, spec: dict[str, Any]) -> KeyConfig:
    """`spec` read as a `keys[]` entry named `name`, or SpecProblem."""
    if not isinstance(spec, dict):
        raise SpecProblem("", "the key's settings must be an object")
    for reserved in ("name", "key", "sha256"):
        if reserved in spec:
            raise SpecProblem(reserved, "set by the key store, not by a request")
    problems = key_settings_problems(spec, "key")
    if problems:
        where, _, message = problems[0].partition(": ")
        raise SpecProblem(where.removeprefix("key."), message)
    try:
        return KeyConfig.model_validate({"name": name, "sha256": "0" * 64, **spec})
    except ValidationError as exc:
        error = exc.errors()[0]
        raise SpecProblem(".".join(str(part) for part in error["loc"]), error["msg"]) from None


def checked_tenant_spec(spec: dict[str, Any]) -> GatewayTenant:
    """A tenant's settings (`limits`, plugins' tenant fields) as requests will meet them, or SpecProblem."""
    if not isinstance(spec, dict):
        raise SpecProblem("", "the tenant's settings must be an object")
    fields = dict(spec)
    limits = fields.pop("limits", None)
    try:
        read_limits = TenantLimits.model_validate(limits) if limits is not None else None
    except ValidationError as exc:
        error = exc.errors()[0]
        raise SpecProblem(".".join(["limits", *(str(part) for part in error["loc"])]), error["msg"]) from None
    settings, problems = tenant_settings(fields)
    if problems:
        where, _, message = problems[0].partition(": ")
        raise SpecProblem(where, message)
    return GatewayTenant("", read_limits, settings)


@dataclass(slots=True, frozen=True)
class StoredKey:
    name: str
    sha256: bytes
    previous_sha256: bytes | None
    previous_until: datetime | None
    tenant: str | None
    spec: dict[str, Any]
    revision: int
    created_at: datetime
    created_by: str
    updated_at: datetime
    updated_by: str
    deleted_at: datetime | None = None

    def gateway_key(self, digest: bytes | None = None) -> GatewayKey:
        """The key a request presenting this secret (or, with `digest`, the previous one) is
        checked against; the tenant is its `tenant` label, as for a configured key."""
        labels = dict(self.spec.get("labels") or {})
        if self.tenant:
            labels[TENANT_LABEL] = self.tenant
        entry = KeyConfig.model_validate(
            {**self.spec, "labels": labels, "name": self.name, "sha256": (digest or self.sha256).hex()}
        )
        if entry.model_extra:  # plugins' fields, as their models read them (as the config's keys are read)
            entry.model_extra.update(key_settings(entry.model_extra))
        return gateway_key(entry)

    def state(self, now: datetime) -> str:
        if self.deleted_at is not None:
            return "deleted"
        if not self.spec.get("enabled", True):
            return "disabled"
        expires = self.spec.get("expires_at")
        if expires and datetime.fromisoformat(expires) <= now:
            return "expired"
        return "active"

    def view(self, now: datetime) -> dict[str, Any]:
        """As the admin API shows it: everything but the secret (its digest's first 8 hex digits
        tell two secrets apart in a support ticket without revealing either)."""
        return {
            "name": self.name,
            "source": "store",
            "tenant": self.tenant,
            "state": self.state(now),
            **self.spec,
            "fingerprint": self.sha256.hex()[:8],
            "previous_valid_until": self.previous_until.isoformat()
            if self.previous_until and self.previous_until > now
            else None,
            "revision": self.revision,
            "created_at": self.created_at.isoformat(),
            "created_by": self.created_by,
            "updated_at": self.updated_at.isoformat(),
            "updated_by": self.updated_by,
        }


@dataclass(slots=True, frozen=True)
class Tenant:
    """A tenant: the name its keys' `tenant` label carries (ids one of its keys made can be
    followed by all of them; a tenant's budget holds for them together)."""

    name: str
    labels: dict[str, str]
    created_at: datetime
    created_by: str
    updated_at: datetime
    updated_by: str
    spec: dict[str, Any] = field(default_factory=dict)  # limits and plugins' fields, as written

    def gateway_tenant(self) -> GatewayTenant:
        read = checked_tenant_spec(self.spec)
        return GatewayTenant(self.name, read.limits, read.settings)

    def view(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "labels": self.labels,
            **self.spec,
            "created_at": self.created_at.isoformat(),
            "created_by": self.created_by,
            "updated_at": self.updated_at.isoformat(),
            "updated_by": self.updated_by,
        }


@dataclass(slots=True, frozen=True)
class Actor:
    """Who asks: an admin token's (or an OIDC subject's) name, its role, the one tenant a
    `tenant-admin` may touch, and where the request came from."""

    name: str
    role: str
    tenant: str | None = None
    source_ip: str | None = None
    request_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
