"""Rate limits: exact sliding windows for requests and tokens, leases for concurrency.

A request's limits are checked together and recorded only if all of them pass, in one
step (one Lua call on Redis), so instances sharing a Redis agree exactly.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class Kind(enum.Enum):
    REQUESTS = 1  # at most `limit` requests in any `window_s`
    TOKENS = 2  # at most `limit` tokens in any `window_s` (reserved, then settled)
    CONCURRENT = 3  # at most `limit` at once (a lease per request)


@dataclass(slots=True, frozen=True)
class Check:
    """One limit to check for one request."""

    key: str  # the counter's identity, e.g. "key:demo:rpm"
    policy: str  # its name in headers and metrics, e.g. "key-rpm"
    kind: Kind
    limit: int
    window_s: float
    cost: int = 1  # tokens to reserve (TOKENS); 1 otherwise
    subject: str = ""  # what is limited, e.g. "key:demo": a shared store keeps a subject's counters together


@dataclass(slots=True, frozen=True)
class Decision:
    allowed: bool
    check: Check | None = None  # the refusing check, or the tightest window when allowed (a lease has none to tell)
    remaining: int = 0
    retry_after_s: float = 0.0
    reset_s: float = 0.0


class LimiterUnavailable(Exception):
    """The shared state behind the limiter cannot be reached."""


class Limiter(Protocol):
    async def acquire(self, checks: list[Check], request_id: str) -> Decision: ...

    async def finish(self, checks: list[Check], request_id: str, tokens: int | None) -> None:
        """After the answer: release leases, and settle token reservations to `tokens` (None: keep them).
        Raises LimiterUnavailable when the shared state cannot take it now; it is then taken later."""

    def finish_later(self, checks: list[Check], request_id: str, tokens: int | None) -> None:
        """`finish`, once the shared state can take it (it is away now): a lease is never left
        to hold a slot until it lapses."""

    async def close(self) -> None: ...
