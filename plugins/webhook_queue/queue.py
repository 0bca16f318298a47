"""The durable webhook queue: payment callbacks kept in Redis Streams until their backend takes them.

Three streams under one prefix: `pending` (accepted, not yet delivered, oldest first),
`delivered` (the recent deliveries, kept for inspection and replay) and `dead` (callbacks the
backend refused outright, kept until an operator replays or drops them). A lease key makes
one deliverer at a time, across every gateway instance, the one that delivers, so the order
of `pending` is the order of delivery.

On a Cluster the four keys share a hash tag (`{modelgate:webhooks}:pending`), so they live in
one slot and a move between shelves stays one transaction; elsewhere they keep the names they
always had (`modelgate:webhooks:pending`), which instances of an older release, during an
upgrade, read and write with this one (one lease, one order). Under Sentinel a callback is
answered as stored only once a replica holds it too (`replica_acks`, WAIT on the connection
that wrote it): a primary lost right after its 200 must not take the callback with it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from redis.exceptions import NoScriptError, RedisError

from proxy.state.connect import Mode, connect, mode_of

__all__ = ["QueueFull", "QueueUnsafe", "QueuedWebhook", "RedisError", "Shelf", "WebhookQueue"]


class Shelf(Enum):
    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"


class QueueFull(Exception):
    """The pending stream holds its maximum; the provider must retry later."""


class QueueUnsafe(Exception):
    """The primary took the callback but too few replicas confirmed it in time; the provider must
    retry (the stored copy may still be delivered: delivery is at least once)."""


@dataclass(slots=True)
class QueuedWebhook:
    method: str
    target: str                      # the path and query as received
    headers: list[tuple[str, str]]   # as they go upstream: signatures, forwarding, request id
    body: bytes
    request_id: str
    received_at: float = field(default_factory=time.time)
    id: str = ""                     # the stream entry id, once stored
    outcome: str = ""                # on the delivered and dead shelves: what the backend answered
    settled_at: float = 0.0

    def fields(self) -> dict[str, bytes | str]:
        stored: dict[str, bytes | str] = {
            "method": self.method, "target": self.target, "headers": json.dumps(self.headers),
            "body": self.body, "request_id": self.request_id, "received_at": repr(self.received_at)}
        if self.outcome:
            stored.update(outcome=self.outcome, settled_at=repr(self.settled_at), origin=self.id)
        return stored

    @classmethod
    def from_entry(cls, entry_id: bytes, stored: dict[bytes, bytes]) -> QueuedWebhook:
        text = {k.decode(): v for k, v in stored.items()}
        return cls(method=text["method"].decode(), target=text["target"].decode(),
                   headers=[(k, v) for k, v in json.loads(text["headers"])], body=text["body"],
                   request_id=text["request_id"].decode(), received_at=float(text["received_at"]),
                   id=entry_id.decode(), outcome=text.get("outcome", b"").decode(),
                   settled_at=float(text.get("settled_at", b"0")))


# Take or extend the lease only when it is free or already ours.
_HOLD = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
# At the end of the pending stream, unless it holds its maximum already (then nil): the check
# and the add in one step, so concurrent callbacks cannot overfill it.
_ADD = """
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return false end
return redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class WebhookQueue:
    """The three streams and the lease, over one Redis connection pool."""

    def __init__(self, url: str, prefix: str, max_pending: int = 1_000_000, keep_settled: int = 10_000,
                 replica_acks: int | None = None, replica_wait_s: float = 2.0) -> None:
        self._client = connect(url, socket_timeout=5.0, socket_connect_timeout=2.0, health_check_interval=30)
        self._mode = mode_of(url)
        self._prefix = prefix
        self._tag = "{" + prefix + "webhooks}" if self._mode is Mode.CLUSTER else prefix + "webhooks"
        self._max_pending = max_pending
        self._keep_settled = keep_settled
        self.replica_acks = (1 if self._mode is Mode.SENTINEL else 0) if replica_acks is None else replica_acks
        self._replica_wait_ms = int(replica_wait_s * 1000)
        self._add = self._client.register_script(_ADD)
        self._hold = self._client.register_script(_HOLD)
        self._release = self._client.register_script(_RELEASE)

    def key(self, shelf: Shelf) -> str:
        return f"{self._tag}:{shelf.value}"

    async def put(self, webhook: QueuedWebhook) -> str:
        """Store a callback at the end of `pending`, in one round trip; its id once Redis has it
        (and, where asked, `replica_acks` replicas)."""
        args: list[bytes | str | int] = [self._max_pending]
        for name, value in webhook.fields().items():
            args += [name, value]
        keys = [self.key(Shelf.PENDING)]
        if not self.replica_acks:
            entry_id = await self._add(keys=keys, args=args)
        else:
            entry_id, acks = await self._add_and_wait(keys, args)
            if entry_id is not None and acks < self.replica_acks:
                webhook.id = entry_id.decode()
                raise QueueUnsafe(f"{acks} of {self.replica_acks} replicas confirmed the callback in time")
        if entry_id is None:
            raise QueueFull(f"{self._max_pending} webhooks are waiting for delivery")
        webhook.id = entry_id.decode()
        return webhook.id

    async def _add_and_wait(self, keys: list[str], args: list[bytes | str | int]) -> tuple[bytes | None, int]:
        """The add and WAIT on one connection (WAIT covers the writes of its own connection), in one
        round trip; a script Redis forgot (restart, failover) is loaded and the add sent again."""
        entry_id, acks = await self._pipelined_add(keys, args)
        if isinstance(entry_id, NoScriptError):  # refused unrun: safe to send again
            await self._client.script_load(_ADD)
            entry_id, acks = await self._pipelined_add(keys, args)
        for answer in (entry_id, acks):
            if isinstance(answer, Exception):
                raise answer
        return entry_id, int(acks)

    async def _pipelined_add(self, keys: list[str], args: list[bytes | str | int]) -> list[Any]:
        # WAIT goes with the add whatever the add answers: one round trip on the common path. When
        # the add wrote nothing (the queue full, the script forgotten) it waits on the connection's
        # earlier writes instead, at most replica_wait_s, and only while a replica lags.
        async with self._client.pipeline(transaction=False) as pipe:
            return await pipe.evalsha(self._add.sha, len(keys), *keys, *args).wait(
                self.replica_acks, self._replica_wait_ms).execute(raise_on_error=False)

    async def oldest(self, block_ms: int) -> QueuedWebhook | None:
        """The next callback to deliver, waiting up to `block_ms` for one to arrive."""
        key = self.key(Shelf.PENDING)
        if self._mode is Mode.CLUSTER:
            # redis-py finds XREAD's key by asking one fixed node (COMMAND GETKEYS): with that node
            # failed over, every read would fail. Sent to the node that holds the key's slot instead.
            found = await self._client.execute_command("XREAD", "COUNT", 1, "BLOCK", block_ms, "STREAMS", key, "0-0",
                                                       target_nodes=await self._client.node_for(key))
        else:
            found = await self._client.xread({key: "0-0"}, count=1, block=block_ms)
        if not found:
            return None
        _, entries = found[0]
        return QueuedWebhook.from_entry(*entries[0])

    async def settle(self, webhook: QueuedWebhook, outcome: str, shelf: Shelf) -> None:
        """Move a callback off `pending` onto the delivered or dead shelf, in one transaction."""
        webhook.outcome, webhook.settled_at = outcome, time.time()
        async with self._client.pipeline(transaction=True) as tx:
            maxlen = self._keep_settled if shelf is Shelf.DELIVERED else None
            tx.xadd(self.key(shelf), webhook.fields(), maxlen=maxlen, approximate=maxlen is not None)
            tx.xdel(self.key(Shelf.PENDING), webhook.id)
            await tx.execute()

    async def entries(self, shelf: Shelf, limit: int = 100) -> list[QueuedWebhook]:
        """The oldest `limit` entries of a shelf."""
        found = await self._client.xrange(self.key(shelf), count=limit)
        return [QueuedWebhook.from_entry(entry_id, stored) for entry_id, stored in found]

    async def replay(self, shelf: Shelf, ids: list[str] | None) -> list[str]:
        """Queue entries of the delivered or dead shelf again, at the end of `pending`, in their
        order; a replayed dead entry leaves the dead shelf. `ids` None: the whole shelf."""
        if shelf is Shelf.PENDING:
            raise ValueError("pending webhooks are delivered already; replay takes delivered or dead ones")
        source = self.key(shelf)
        if ids is None:
            found = await self._client.xrange(source)
        else:
            found = []
            for entry_id in ids:
                found.extend(await self._client.xrange(source, entry_id, entry_id))
        queued: list[str] = []
        for entry_id, stored in found:
            webhook = QueuedWebhook.from_entry(entry_id, stored)
            webhook.outcome = ""
            async with self._client.pipeline(transaction=True) as tx:
                tx.xadd(self.key(Shelf.PENDING), webhook.fields())
                if shelf is Shelf.DEAD:
                    tx.xdel(source, entry_id)
                new_id, *_ = await tx.execute()
            queued.append(new_id.decode())
        return queued

    async def depth(self, shelf: Shelf = Shelf.PENDING) -> int:
        return int(await self._client.xlen(self.key(shelf)))

    async def hold_lease(self, token: str, ttl_ms: int) -> bool:
        return bool(await self._hold(keys=[self.key_lease], args=[token, ttl_ms]))

    async def release_lease(self, token: str) -> None:
        await self._release(keys=[self.key_lease], args=[token])

    @property
    def key_lease(self) -> str:
        return f"{self._tag}:lease"

    async def close(self) -> None:
        await self._client.aclose()
