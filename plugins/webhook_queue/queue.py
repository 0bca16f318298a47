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

Every shelf is bounded in bytes as stored (its entries' field names and values), by a counter
beside it (`...:pending:bytes`) that the same script moves with each add, move and trim, so the
bound is exact across instances and never makes Redis evict anything else. `pending` refuses a
callback past its bound (the provider retries); `delivered` and `dead` drop their oldest entries
instead (they are settled already). proxy/state/stream_bytes.py keeps the counters, and says how
a count an older release left wrong, during an upgrade, mends itself.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from redis.exceptions import NoScriptError, RedisError

from proxy.state.connect import Mode, connect, mode_of
from proxy.state.stream_bytes import LUA as STREAM_BYTES
from proxy.state.stream_bytes import run

__all__ = ["Backlog", "Bounds", "QueueFull", "QueueUnsafe", "QueuedWebhook", "RedisError", "Shelf", "WebhookQueue"]


class Shelf(Enum):
    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"


class QueueFull(Exception):
    """The pending stream holds its maximum (entries or bytes); the provider must retry later."""


class QueueUnsafe(Exception):
    """The primary took the callback but too few replicas confirmed it in time; the provider must
    retry (the stored copy may still be delivered: delivery is at least once)."""


@dataclass(slots=True)
class QueuedWebhook:
    method: str
    target: str  # the path and query as received
    headers: list[tuple[str, str]]  # as they go upstream: signatures, forwarding, request id
    body: bytes
    request_id: str
    received_at: float = field(default_factory=time.time)
    id: str = ""  # the stream entry id, once stored
    outcome: str = ""  # on the delivered and dead shelves: what the backend answered
    settled_at: float = 0.0

    def fields(self) -> dict[str, bytes | str]:
        stored: dict[str, bytes | str] = {
            "method": self.method,
            "target": self.target,
            "headers": json.dumps(self.headers),
            "body": self.body,
            "request_id": self.request_id,
            "received_at": repr(self.received_at),
        }
        if self.outcome:
            stored.update(outcome=self.outcome, settled_at=repr(self.settled_at), origin=self.id)
        return stored

    @classmethod
    def from_entry(cls, entry_id: bytes, stored: dict[bytes, bytes]) -> QueuedWebhook:
        text = {k.decode(): v for k, v in stored.items()}
        return cls(
            method=text["method"].decode(),
            target=text["target"].decode(),
            headers=[(k, v) for k, v in json.loads(text["headers"])],
            body=text["body"],
            request_id=text["request_id"].decode(),
            received_at=float(text["received_at"]),
            id=entry_id.decode(),
            outcome=text.get("outcome", b"").decode(),
            settled_at=float(text.get("settled_at", b"0")),
        )


# Take or extend the lease only when it is free or already ours.
_HOLD = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
# At the end of the pending stream, unless it holds its most entries (1) or bytes (2) already:
# the check and the add in one step, so concurrent callbacks cannot overfill it.
# KEYS: pending, its counter; ARGV: most entries, most bytes, the fields.
_ADD = (
    STREAM_BYTES
    + """
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return 1 end
if held(KEYS[1], KEYS[2]) + size(ARGV, 3) > tonumber(ARGV[2]) then return 2 end
return add(KEYS[1], KEYS[2], ARGV, 3)
"""
)
# Off `pending` (KEYS 1-2) onto a settled shelf (KEYS 3-4), whose oldest entries then go while it
# holds more than ARGV[2] entries or ARGV[3] bytes; the number dropped, or -1 when the callback
# is no longer pending (another deliverer settled it, after this one's lease lapsed): not added twice.
_SETTLE = (
    STREAM_BYTES
    + """
if not remove(KEYS[1], KEYS[2], ARGV[1]) then return -1 end
add(KEYS[3], KEYS[4], ARGV, 4)
local dropped, most, bytes = 0, tonumber(ARGV[2]), tonumber(ARGV[3])
while true do
  local count = redis.call('XLEN', KEYS[3])
  if count == 0 or (count <= most and tonumber(redis.call('GET', KEYS[4])) <= bytes) then break end
  remove(KEYS[3], KEYS[4], redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', 1)[1][1])
  dropped = dropped + 1
end
return dropped
"""
)
# A settled entry (KEYS 1-2, ARGV[1]) queued again at the end of `pending` (KEYS 3-4) within its
# bounds (ARGV 3-4; else 1 or 2, as _ADD), and taken off its shelf when ARGV[2] is '1' (dead).
_REPLAY = (
    STREAM_BYTES
    + """
if redis.call('XLEN', KEYS[3]) >= tonumber(ARGV[3]) then return 1 end
if held(KEYS[3], KEYS[4]) + size(ARGV, 5) > tonumber(ARGV[4]) then return 2 end
if ARGV[2] == '1' and not remove(KEYS[1], KEYS[2], ARGV[1]) then return 0 end
return add(KEYS[3], KEYS[4], ARGV, 5)
"""
)
# A shelf's entries and bytes, the counter mended on the way.
_BACKLOG = (
    STREAM_BYTES
    + """
return {redis.call('XLEN', KEYS[1]), held(KEYS[1], KEYS[2])}
"""
)
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(slots=True, frozen=True)
class Bounds:
    """What each shelf may hold: `pending` refuses past its bounds, the settled shelves drop their oldest."""

    max_pending: int = 1_000_000
    max_pending_bytes: int = 64 * 1024 * 1024
    keep_delivered: int = 10_000
    keep_delivered_bytes: int = 16 * 1024 * 1024
    keep_dead_bytes: int = 16 * 1024 * 1024


@dataclass(slots=True, frozen=True)
class Backlog:
    entries: int
    bytes: int


class WebhookQueue:
    """The three streams, their byte counters and the lease, over one Redis connection pool."""

    def __init__(
        self,
        url: str,
        prefix: str,
        bounds: Bounds | None = None,
        replica_acks: int | None = None,
        replica_wait_s: float = 2.0,
    ) -> None:
        self._client = connect(url, socket_timeout=5.0, socket_connect_timeout=2.0, health_check_interval=30)
        self._mode = mode_of(url)
        self._prefix = prefix
        self._tag = "{" + prefix + "webhooks}" if self._mode is Mode.CLUSTER else prefix + "webhooks"
        self.bounds = bounds or Bounds()
        self.replica_acks = (1 if self._mode is Mode.SENTINEL else 0) if replica_acks is None else replica_acks
        self._replica_wait_ms = int(replica_wait_s * 1000)
        self._add = self._client.register_script(_ADD)
        self._settle = self._client.register_script(_SETTLE)
        self._replay = self._client.register_script(_REPLAY)
        self._backlog = self._client.register_script(_BACKLOG)
        self._hold = self._client.register_script(_HOLD)
        self._release = self._client.register_script(_RELEASE)

    def key(self, shelf: Shelf) -> str:
        return f"{self._tag}:{shelf.value}"

    def counter(self, shelf: Shelf) -> str:
        """The bytes a shelf holds, in the stream's slot (a Cluster's hash tag covers it)."""
        return f"{self._tag}:{shelf.value}:bytes"

    def _keys(self, shelf: Shelf) -> list[str]:
        return [self.key(shelf), self.counter(shelf)]

    async def _run(self, script: Any, keys: list[str], args: list[bytes | str | int]) -> Any:
        return await run(self._client, script, keys, args)

    async def put(self, webhook: QueuedWebhook) -> str:
        """Store a callback at the end of `pending`, in one round trip; its id once Redis has it
        (and, where asked, `replica_acks` replicas). QueueFull past either bound of `pending`."""
        args: list[bytes | str | int] = [self.bounds.max_pending, self.bounds.max_pending_bytes]
        for name, value in webhook.fields().items():
            args += [name, value]
        keys = self._keys(Shelf.PENDING)
        if not self.replica_acks:
            entry_id = await self._run(self._add, keys, args)
        else:
            entry_id, acks = await self._add_and_wait(keys, args)
            if isinstance(entry_id, bytes) and acks < self.replica_acks:
                webhook.id = entry_id.decode()
                raise QueueUnsafe(f"{acks} of {self.replica_acks} replicas confirmed the callback in time")
        if not isinstance(entry_id, bytes):
            raise self._full(entry_id)
        webhook.id = entry_id.decode()
        return webhook.id

    def _full(self, which: int) -> QueueFull:
        if which == 1:
            return QueueFull(f"{self.bounds.max_pending} webhooks are waiting for delivery")
        return QueueFull(f"the webhooks waiting for delivery hold {self.bounds.max_pending_bytes} bytes at most")

    async def _add_and_wait(self, keys: list[str], args: list[bytes | str | int]) -> tuple[bytes | int, int]:
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
            return (
                await pipe.evalsha(self._add.sha, len(keys), *keys, *args)
                .wait(self.replica_acks, self._replica_wait_ms)
                .execute(raise_on_error=False)
            )

    async def oldest(self, block_ms: int) -> QueuedWebhook | None:
        """The next callback to deliver, waiting up to `block_ms` for one to arrive."""
        key = self.key(Shelf.PENDING)
        if self._mode is Mode.CLUSTER:
            # redis-py finds XREAD's key by asking one fixed node (COMMAND GETKEYS): with that node
            # failed over, every read would fail. Sent to the node that holds the key's slot instead.
            found = await self._client.execute_command(
                "XREAD",
                "COUNT",
                1,
                "BLOCK",
                block_ms,
                "STREAMS",
                key,
                "0-0",
                target_nodes=await self._client.node_for(key),
            )
        else:
            found = await self._client.xread({key: "0-0"}, count=1, block=block_ms)
        if not found:
            return None
        _, entries = found[0]
        return QueuedWebhook.from_entry(*entries[0])

    async def settle(self, webhook: QueuedWebhook, outcome: str, shelf: Shelf) -> int:
        """Move a callback off `pending` onto the delivered or dead shelf, in one script; the
        shelf's oldest entries go while it holds more than its bounds. How many went (-1: the
        callback was settled already, by a deliverer whose lease lapsed)."""
        webhook.outcome, webhook.settled_at = outcome, time.time()
        bounds = self.bounds
        if shelf is Shelf.DELIVERED:
            most, most_bytes = bounds.keep_delivered, bounds.keep_delivered_bytes
        else:
            most, most_bytes = 2**53, bounds.keep_dead_bytes  # dead entries wait for an operator, up to their bytes
        args: list[bytes | str | int] = [webhook.id, most, most_bytes]
        for name, value in webhook.fields().items():
            args += [name, value]
        return int(await self._run(self._settle, [*self._keys(Shelf.PENDING), *self._keys(shelf)], args))

    async def entries(self, shelf: Shelf, limit: int = 100) -> list[QueuedWebhook]:
        """The oldest `limit` entries of a shelf."""
        found = await self._client.xrange(self.key(shelf), count=limit)
        return [QueuedWebhook.from_entry(entry_id, stored) for entry_id, stored in found]

    async def replay(self, shelf: Shelf, ids: list[str] | None) -> list[str]:
        """Queue entries of the delivered or dead shelf again, at the end of `pending`, in their
        order; a replayed dead entry leaves the dead shelf. `ids` None: the whole shelf. QueueFull
        when `pending` cannot take the next one (those before it are queued)."""
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
            args: list[bytes | str | int] = [
                entry_id,
                "1" if shelf is Shelf.DEAD else "0",
                self.bounds.max_pending,
                self.bounds.max_pending_bytes,
            ]
            for name, value in webhook.fields().items():
                args += [name, value]
            new_id = await self._run(self._replay, [*self._keys(shelf), *self._keys(Shelf.PENDING)], args)
            if isinstance(new_id, bytes):
                queued.append(new_id.decode())
            elif new_id:
                raise QueueFull(f"{self._full(new_id)}; queued again before it: {', '.join(queued) or 'none'}")
        return queued

    async def depth(self, shelf: Shelf = Shelf.PENDING) -> int:
        return int(await self._client.xlen(self.key(shelf)))

    async def backlog(self, shelf: Shelf = Shelf.PENDING) -> Backlog:
        """A shelf's entries and the bytes they hold, in one call."""
        entries, held = await self._run(self._backlog, self._keys(shelf), [])
        return Backlog(int(entries), int(held))

    async def hold_lease(self, token: str, ttl_ms: int) -> bool:
        return bool(await self._hold(keys=[self.key_lease], args=[token, ttl_ms]))

    async def release_lease(self, token: str) -> None:
        await self._release(keys=[self.key_lease], args=[token])

    @property
    def key_lease(self) -> str:
        return f"{self._tag}:lease"

    async def close(self) -> None:
        await self._client.aclose()
