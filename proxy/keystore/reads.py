"""The admin API's reads of what the gateway did, beside the key store's records: the requests
recorded (and one request's story), spend over a span, and the channels as this process sees them.

Requests and spend are kept by a plugin (the usage ledger), asked through `Plugin.query` without
being named; a tenant-admin's reads are confined to its own tenant there, whatever it asks.
Channels are this process's own: each instance has its breakers and pools (the recent error
rates come from the recorded requests, so they are the fleet's).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from proxy.core.plugin import Plugin, QueryProblem
from proxy.keystore.access import READ
from proxy.keystore.operations import AdminError, AdminOps
from proxy.keystore.records import Actor

if TYPE_CHECKING:
    from proxy.policy.channels import Channel

_TENANT = re.compile(r"[^\x00-\x1f\x7f]{1,200}")
RECENT_S = 900  # the span the channels' error rates are counted over


class AdminReads:
    """`plugins()` are the running config's plugins; `channels()` this process's channels."""

    def __init__(
        self, ops: AdminOps, plugins: Callable[[], list[Plugin]], channels: Callable[[], list[Channel]]
    ) -> None:
        self.ops = ops
        self.plugins = plugins
        self.channels_of = channels

    async def requests(self, actor: Actor, params: Mapping[str, str]) -> dict[str, Any]:
        return await self._query(actor, "requests", params, "requests.search")

    async def request(self, actor: Actor, request_id: str) -> dict[str, Any]:
        found = await self._query(actor, "request", {"id": request_id}, "requests.read", request_id)
        if found.get("request") is None:
            raise AdminError(
                404,
                "not_found",
                "no request recorded with that id" + (" in your tenant" if actor.role == "tenant-admin" else ""),
            )
        return found

    async def spend(self, actor: Actor, params: Mapping[str, str]) -> dict[str, Any]:
        return await self._query(actor, "spend", params, "spend.read")

    async def channels(self, actor: Actor) -> dict[str, Any]:
        await self.ops.check(actor, "channel", READ, None, "channels.read")
        recent: dict[str, Any] = {}
        try:
            found = await self._ask("spend", None, {"since": f"{RECENT_S // 60}m", "by": "channel,status"})
        except AdminError:
            found = None
        for row in (found or {}).get("rows", []):
            counts = recent.setdefault(row["channel"], {"requests": 0, "errors": 0})
            counts["requests"] += row["requests"]
            if row["status"] >= 500 or row["status"] == 429:
                counts["errors"] += row["requests"]
        shown = []
        for channel in self.channels_of():
            health = channel.health
            state, left = health.state()
            counts = recent.get(channel.name, {"requests": 0, "errors": 0})
            pool = channel.pool
            shown.append(
                {
                    "name": channel.name,
                    "breaker": state,
                    "retry_in_s": round(left, 3) if state == "open" else None,
                    "failures_in_a_row": health.failures,
                    "health_check": None if channel.config.health_check is None else "down" if health.down else "up",
                    "pool": None
                    if pool is None
                    else {
                        "open": pool.connections,
                        "idle": pool.idle,
                        "waiting": pool.waiting,
                        "max": pool.max_connections,
                    },
                    "recent": {
                        **counts,
                        "error_rate": round(counts["errors"] / counts["requests"], 4) if counts["requests"] else None,
                        "span_s": RECENT_S if found is not None else None,
                    },
                }
            )
        return {"at": datetime.now(timezone.utc).isoformat(), "channels": shown}

    async def _query(
        self, actor: Actor, name: str, params: Mapping[str, str], action: str, target: str | None = None
    ) -> dict[str, Any]:
        asked = params.get("tenant")
        if asked is not None:
            asked = asked.removeprefix("tenant:")  # as the records name it, or as the tenant is named
        if asked is not None and not _TENANT.fullmatch(asked):
            raise AdminError(400, "invalid_field", "1-200 characters, no control characters", "tenant")
        tenant = actor.tenant if actor.role == "tenant-admin" else asked
        await self.ops.check(actor, "usage", READ, tenant, action, target)
        # A tenant-admin's reads are its tenant's, whatever it names (a key of another tenant finds nothing).
        scope = f"tenant:{actor.tenant}" if actor.role == "tenant-admin" else None
        query = {k: v for k, v in params.items() if k != "tenant"}
        if tenant is not None:
            query["tenant"] = f"tenant:{tenant}"
        found = await self._ask(name, scope, query)
        if found is None:
            raise AdminError(
                404,
                "not_recorded",
                "no plugin of this gateway records requests: give the usage ledger a database (docs/ledger.md)",
            )
        return found

    async def _ask(self, name: str, scope: str | None, params: Mapping[str, str]) -> dict[str, Any] | None:
        for plugin in self.plugins():
            try:
                found = await plugin.query(name, scope, params)
            except QueryProblem as exc:
                raise AdminError(400, "invalid_field", exc.message, exc.field) from None
            except (OSError, TimeoutError) as exc:
                raise AdminError(
                    503,
                    "records_unavailable",
                    f"the records' database does not answer ({type(exc).__name__}); retry later",
                ) from None
            if found is not None:
                return found
        return None
