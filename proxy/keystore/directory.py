"""`StoredKeys`: every process's copy of the stored keys (and `StoredTenants`, of the tenants'
settings), and `KeySync`, which keeps them current.

A request's key is found in memory, by digest, as a configured key is: no database or Redis call
on the request path, so a flood of unknown keys costs what it always did. The copy is brought up
to date from the store by revision (every row changed since the last one read, deletions
included): at start, when PostgreSQL notifies a change (LISTEN on a connection of its own, so a
change reaches every process within a round trip), and in full every `key_store.resync_s` (and
once the store answers again after a failure), so a notice lost with a connection heals. While
PostgreSQL is away, the last keys read keep working; a process that starts then serves the
config's keys until it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from prometheus_client import Counter, Histogram

from proxy.keystore.records import StoredKey, Tenant
from proxy.keystore.schema import CHANNEL
from proxy.keystore.store import KeyStore
from proxy.policy.keys import GatewayKey, GatewayTenant, count_keys

log = logging.getLogger("modelgate.keystore")

RETRY_S = 0.5  # while the store does not answer, how often it is tried
BATCH = 200  # keys made live between two turns of the loop
# Keys made live since the collector last had its long-lived objects frozen, past which they are
# (see KeySync.refresh): a thousand keys add a few milliseconds to each of its full passes.
FREEZE_AFTER = 1000

KEY_STORE_LAG = Histogram(
    "modelgate_key_store_propagation_seconds",
    "From a stored key's change committed to this process holding it",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 30, 120),
)
KEY_STORE_SYNCS = Counter("modelgate_key_store_syncs", "Reads of the key store's changes, by outcome", ["outcome"])


class StoredKeys:
    """The stored keys by digest (and, during a rotation's grace, by their previous digest)."""

    __slots__ = ("revision", "_by_digest", "_previous", "_rows")

    def __init__(self) -> None:
        self.revision = 0
        self._by_digest: dict[bytes, GatewayKey] = {}
        self._previous: dict[bytes, tuple[GatewayKey, datetime]] = {}
        self._rows: dict[str, StoredKey] = {}  # by name: what is held now

    def find_digest(self, wanted: bytes) -> GatewayKey | None:
        found = self._by_digest.get(wanted)
        if found is not None:
            return found if hmac.compare_digest(found.sha256, wanted) else None
        previous = self._previous.get(wanted)
        if (
            previous is not None
            and datetime.now(timezone.utc) < previous[1]
            and hmac.compare_digest(previous[0].sha256, wanted)
        ):
            return previous[0]
        return None

    def names(self) -> set[str]:
        return set(self._rows)

    def differing(self, stored: dict[str, int]) -> tuple[set[str], list[str]]:
        """Against every key stored now (name: revision): the names held that are stored no more,
        and the names stored that are not held as they are."""
        gone = self.names() - stored.keys()
        changed = [
            name
            for name, revision in stored.items()
            if (held := self._rows.get(name)) is None or held.revision != revision
        ]
        return gone, changed

    def drop(self, names: set[str]) -> None:
        for name in names:
            self._drop(name)

    def apply(self, rows: list[StoredKey], observe: bool = True) -> None:
        """Take rows changed since `revision`, in revision order."""
        now = time.time()
        for row in rows:
            self._drop(row.name)
            if row.deleted_at is None:
                try:
                    self._by_digest[row.sha256] = row.gateway_key()
                    if row.previous_sha256 is not None and row.previous_until is not None:
                        self._previous[row.previous_sha256] = (row.gateway_key(row.previous_sha256), row.previous_until)
                    self._rows[row.name] = row
                except ValueError:  # written by a newer release, or by hand: refused, as the API would
                    log.error("a stored key does not validate; it is not served", extra={"key_name": row.name})
            self.revision = max(self.revision, row.revision)
            if observe:
                KEY_STORE_LAG.observe(max(0.0, now - row.updated_at.timestamp()))

    def _drop(self, name: str) -> None:
        held = self._rows.pop(name, None)
        if held is not None:
            self._by_digest.pop(held.sha256, None)
            if held.previous_sha256 is not None:
                self._previous.pop(held.previous_sha256, None)

    def not_serving(self) -> set[str]:
        """The names of the keys held that are disabled or expired now."""
        now = datetime.now(timezone.utc)
        return {name for name, row in self._rows.items() if row.state(now) != "active"}

    def count(self) -> None:
        """The gauge of keys held by state (`modelgate_keys{source="stored"}`), once a read has been taken."""
        now = datetime.now(timezone.utc)
        count_keys("stored", [row.state(now) for row in self._rows.values()])


class StoredTenants:
    """The stored tenants that have settings of their own (limits, a budget), by name."""

    __slots__ = ("_by_name",)

    def __init__(self) -> None:
        self._by_name: dict[str, GatewayTenant] = {}

    def tenant(self, name: str) -> GatewayTenant | None:
        return self._by_name.get(name)

    def replace(self, rows: dict[str, Tenant]) -> None:
        """Take every tenant with settings, as stored now (a few hundred at most: read whole)."""
        found = {}
        for name, row in rows.items():
            try:
                found[name] = row.gateway_tenant()
            except ValueError:  # written by a newer release, or by hand: its keys go without its settings
                log.error("a stored tenant's settings do not validate; they do not hold", extra={"tenant": name})
        self._by_name = found


class KeySync:
    """Keeps a StoredKeys current from a KeyStore (see the module's text)."""

    def __init__(
        self,
        store: KeyStore,
        keys: StoredKeys,
        resync_s: float,
        tenants: StoredTenants | None = None,
        revoked: Callable[[Callable[[], set[str]]], object] | None = None,
    ) -> None:
        self.store = store
        self.keys = keys
        # Told the names of keys that no longer serve (disabled, expired or deleted) after each
        # read, so that streams open under them end (key_store.revoked_streams); None: they finish.
        self.revoked = revoked
        self.tenants = tenants if tenants is not None else StoredTenants()
        self.resync_s = resync_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._listener: Any = None
        self.reachable = False
        self._unfrozen = 0  # keys made live since the last freeze

    async def start(self) -> None:
        """Read what is stored now (a store that does not answer is left to the loop), then keep up."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.refresh(full=True), self.store.timeout_s)
        self._task = asyncio.create_task(self._run(), name="key-store-sync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._close_listener()

    async def refresh(self, full: bool = False) -> None:
        """What changed since the revision held; with `full`, every key's revision compared with
        what is held (what heals a change the revisions could not show: a row changed by hand),
        and only the keys that differ read. Rows are taken a batch at a time, the loop let run
        between: ten thousand keys read at once would hold every request up for a second."""
        gone: set[str] = set()
        try:
            if full:
                revision, stored = await self.store.revisions()
                gone, changed = self.keys.differing(stored)
                rows = await self.store.keys_named(changed) if changed else []
            else:
                rows = await self.store.keys_since(self.keys.revision)
            tenants = await self.store.tenant_specs()
        except Exception:
            self.reachable = False
            KEY_STORE_SYNCS.labels("failed").inc()
            raise
        self.reachable = True
        self.tenants.replace(tenants)
        if full:
            self.keys.drop(gone)
        for start in range(0, len(rows), BATCH):
            self.keys.apply(rows[start : start + BATCH], observe=not full)
            await asyncio.sleep(0)
        self._unfrozen += len(rows)
        if self._unfrozen >= FREEZE_AFTER:
            # Kept for as long as the keys are: out of the collector's reach, as what start-up
            # built is (proxy/process/server.py). Ten thousand keys made live after start made
            # each of its full passes 15-50 ms, a stall of every request (1.2 ms once frozen).
            # (Objects frozen are still freed when the last reference goes: a key replaced or
            # dropped is. What is cyclic garbage at that moment, of the requests in flight, is
            # kept for good: once for each thousand keys made live, so rarely.)
            gc.freeze()
            self._unfrozen = 0
        if full:
            self.keys.revision = max(self.keys.revision, revision)
        if rows or full:
            self.keys.count()
        if self.revoked is not None and (rows or full):
            deleted = gone | {row.name for row in rows if row.deleted_at is not None}
            self.revoked(lambda: deleted | self.keys.not_serving())  # worked out only while streams are open
        KEY_STORE_SYNCS.labels("ok").inc()

    async def _run(self) -> None:
        wait, full = self.resync_s, False
        while True:
            # Cleared before the read, not after: a notice that arrives while it runs wakes the next.
            self._wake.clear()
            try:
                await self._listen()
                await self.refresh(full)
                wait = self.resync_s
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # PostgreSQL away: the keys held keep working; tried again soon
                if wait == self.resync_s:
                    log.warning(
                        "the key store cannot be read; the keys held keep working", extra={"error": type(exc).__name__}
                    )
                await self._close_listener()
                wait = min(self.resync_s, RETRY_S)  # back within a second of PostgreSQL, not a resync later
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
                full = False  # told of a change: what changed since
            except TimeoutError:
                full = True  # the resync, or the store back after a failure: everything

    async def _listen(self) -> None:
        if self._listener is not None and not self._listener.is_closed():
            return
        import asyncpg

        self._listener = await asyncpg.connect(self.store.url, timeout=self.store.timeout_s)
        await self._listener.add_listener(CHANNEL, lambda *_: self._wake.set())
        self._listener.add_termination_listener(lambda *_: self._wake.set())
        # What changed while no one listened is read next, by revision.

    async def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(Exception):
                await listener.close(timeout=1)
