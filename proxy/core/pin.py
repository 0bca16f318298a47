"""`PinRecord`: what the gateway remembers of an id it handed out (a video task, a response),
so a request that follows the id goes to the channel that made it, for its owner only."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class PinRecord:
    """What the gateway remembers of an id it handed out."""

    channel: str
    owner: str | None  # the tenant that made it; "" when no key did; None: recorded before owners were
    upstream_id: str | None = None  # the upstream's own id, when the client holds an alias of it
