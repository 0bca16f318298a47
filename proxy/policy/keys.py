"""Gateway API keys: who a request belongs to, and what it may use.

Keys are held only as SHA-256 digests. A presented key is hashed and looked up by digest,
then confirmed with a constant-time comparison, so lookup time says nothing about how
close a guess was. Only the key's name ever reaches logs, metrics and traces.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from prometheus_client import Gauge


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


KEYS_HELD = Gauge(
    "modelgate_keys",
    "Gateway keys a process holds, by where they come from (config, stored) and state (active, disabled, expired)",
    ["source", "state"],
    multiprocess_mode="livemax",
)
KEY_STATES = ("active", "disabled", "expired")


def count_keys(source: str, states: list[str]) -> None:
    """The gauge of one source's keys by state, from the state of each key it holds."""
    for state in KEY_STATES:
        KEYS_HELD.labels(source, state).set(states.count(state))


# The label that puts keys in one tenant: ids made with one of them can be followed by all.
TENANT_LABEL = "tenant"


@dataclass(slots=True, frozen=True)
class GatewayKey:
    name: str
    sha256: bytes
    enabled: bool = True
    expires_at: datetime | None = None
    models: tuple[str, ...] = ("*",)
    endpoints: frozenset[str] | None = None
    labels: dict[str, str] = field(default_factory=dict)
    _models: re.Pattern[str] | None = None
    limits_config: Any = None  # the key's KeyLimits (rates, concurrency, per-model rates)
    # Who owns what this key makes: its `tenant` label when it has one, else the key alone.
    tenant: str = ""
    settings: dict[str, Any] = field(default_factory=dict)  # plugins' own fields on this key (their KeySettings)

    @classmethod
    def build(
        cls,
        name: str,
        sha256: bytes,
        *,
        enabled: bool,
        expires_at: datetime | None,
        models: list[str],
        endpoints: list[str] | None,
        labels: dict[str, str],
        limits: Any = None,
        settings: dict[str, Any] | None = None,
    ) -> GatewayKey:
        pattern = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in models)) if models != ["*"] else None
        return cls(
            name,
            sha256,
            enabled,
            expires_at,
            tuple(models),
            frozenset(endpoints) if endpoints is not None else None,
            dict(labels),
            pattern,
            limits,
            f"tenant:{labels[TENANT_LABEL]}" if labels.get(TENANT_LABEL) else f"key:{name}",
            dict(settings or {}),
        )

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires_at is not None and (now or datetime.now(timezone.utc)) >= self.expires_at

    def state(self, now: datetime) -> str:
        return "disabled" if not self.enabled else "expired" if self.expired(now) else "active"

    def allows_model(self, model: str) -> bool:
        return self._models is None or self._models.fullmatch(model) is not None

    def allows_route(self, route: str) -> bool:
        return self.endpoints is None or route in self.endpoints


def gateway_key(entry: Any) -> GatewayKey:
    """The key a `keys[]` entry (a KeyConfig, from the config file or the key store) describes."""
    return GatewayKey.build(
        entry.name,
        bytes.fromhex(entry.digest_hex()),
        enabled=entry.enabled,
        expires_at=entry.expires_at,
        models=entry.models,
        endpoints=entry.endpoints,
        labels=entry.labels,
        limits=entry.limits,
        settings=entry.model_extra,
    )


@dataclass(slots=True, frozen=True)
class GatewayTenant:
    """A stored tenant as requests meet it: its limits (every key of it together) and its plugins'
    fields (a budget, say), read by their models."""

    name: str
    limits: Any = None  # a TenantLimits, or None
    settings: dict[str, Any] = field(default_factory=dict)


class StoredTenantLookup(Protocol):
    """Tenants managed at run time (proxy/keystore/directory.py), found by name (a key's `tenant` label)."""

    def tenant(self, name: str) -> GatewayTenant | None: ...


class StoredKeyLookup(Protocol):
    """Keys managed at run time (proxy/keystore/directory.py), found by digest."""

    def find_digest(self, wanted: bytes) -> GatewayKey | None: ...


class KeyRing:
    """The configured keys, then the stored ones, found by the digest of a presented key."""

    __slots__ = ("_by_digest", "_stored")

    def __init__(self, keys: list[GatewayKey], stored: StoredKeyLookup | None = None) -> None:
        self._by_digest = {k.sha256: k for k in keys}
        self._stored = stored

    @classmethod
    def from_config(cls, config: Any, stored: StoredKeyLookup | None = None) -> KeyRing:
        """The keys of a GatewayConfig, and those of the key store when it has one; the config's are
        counted by state as they are loaded (at start and at each reload)."""
        keys = [gateway_key(k) for k in config.keys]
        now = datetime.now(timezone.utc)
        count_keys("config", [key.state(now) for key in keys])
        return cls(keys, stored)

    def find(self, presented: str) -> GatewayKey | None:
        """The key presented, or None; a key that is not text (undecodable bytes) is no key."""
        try:
            wanted = digest(presented)
        except UnicodeEncodeError:
            return None
        found = self._by_digest.get(wanted)
        if found is None and self._stored is not None:
            return self._stored.find_digest(wanted)
        if found is None or not hmac.compare_digest(found.sha256, wanted):
            return None
        return found

    def is_key(self, presented: str) -> bool:
        return bool(presented) and self.find(presented) is not None

    def __len__(self) -> int:
        return len(self._by_digest)
