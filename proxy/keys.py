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
from typing import Any


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(slots=True, frozen=True)
class GatewayKey:
    name: str
    sha256: bytes
    enabled: bool = True
    expires_at: datetime | None = None
    models: tuple[str, ...] = ("*",)
    endpoints: frozenset[str] | None = None
    url_delivery: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    _models: re.Pattern[str] | None = None
    limits_config: Any = None  # the key's KeyLimits (rates, concurrency, per-model rates)

    @classmethod
    def build(cls, name: str, sha256: bytes, *, enabled: bool, expires_at: datetime | None,
              models: list[str], endpoints: list[str] | None, url_delivery: bool,
              labels: dict[str, str], limits: Any = None) -> GatewayKey:
        pattern = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in models)) if models != ["*"] else None
        return cls(name, sha256, enabled, expires_at, tuple(models),
                   frozenset(endpoints) if endpoints is not None else None, url_delivery, dict(labels), pattern,
                   limits)

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires_at is not None and (now or datetime.now(timezone.utc)) >= self.expires_at

    def allows_model(self, model: str) -> bool:
        return self._models is None or self._models.fullmatch(model) is not None

    def allows_route(self, route: str) -> bool:
        return self.endpoints is None or route in self.endpoints


class KeyRing:
    """The configured keys, found by the digest of a presented key."""

    __slots__ = ("_by_digest",)

    def __init__(self, keys: list[GatewayKey]) -> None:
        self._by_digest = {k.sha256: k for k in keys}

    def find(self, presented: str) -> GatewayKey | None:
        wanted = digest(presented)
        found = self._by_digest.get(wanted)
        if found is None or not hmac.compare_digest(found.sha256, wanted):
            return None
        return found

    def __len__(self) -> int:
        return len(self._by_digest)
