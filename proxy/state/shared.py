"""One Redis client per state URL in a process, shared by everything that keeps state there.

The affinity records, the limiter, the video cache and the image store each used a client of
their own, so a request's calls to them went over several connections, one round trip each.
Sharing the client, and its gathering of the calls made in one turn (proxy/state/gathering.py),
lets a request's limit check ride with the record of the id it follows, and its settlement
with its pin. Each user takes the client with `share` and gives it back with `unshare`; the last
one closes it. A config reload takes it before the old config gives it back, so it lives on.

The client never resends on its own (a pipeline may hold a script); the gathering resends what
may run twice. Its timeouts are the slowest user's; a user that must answer sooner (the limiter,
whose fail mode decides when Redis is slow) waits on its call with a deadline of its own.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from proxy.state.connect import Mode, connect, mode_of, no_retry
from proxy.state.gathering import Gatherer

TIMEOUT_S = 2.0


@dataclass(slots=True)
class SharedRedis:
    url: str
    client: Any
    calls: Gatherer
    users: int = 0


# By URL and event loop: a client's connections belong to one loop (tests run gateways on several).
_held: dict[tuple[str, asyncio.AbstractEventLoop | None], SharedRedis] = {}


def share(url: str) -> SharedRedis:
    """The client for `url` (made on first use), counted as used once more."""
    for place in [p for p in _held if p[1] is not None and p[1].is_closed()]:
        del _held[place]  # its loop is gone, and with it every connection (users that never gave it back)
    place = (url, _loop())
    shared = _held.get(place)
    if shared is None:
        client = connect(
            url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S, retry=no_retry(), health_check_interval=30
        )
        shared = _held[place] = SharedRedis(url, client, Gatherer(client, gathers=mode_of(url) is not Mode.CLUSTER))
    shared.users += 1
    return shared


async def unshare(shared: SharedRedis) -> None:
    """Give the client back; the last user closes it."""
    shared.users -= 1
    if shared.users > 0:
        return
    for place, held in list(_held.items()):
        if held is shared:
            del _held[place]
    await shared.client.aclose()


def _loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
