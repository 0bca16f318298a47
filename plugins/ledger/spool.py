"""Where usage records wait while PostgreSQL is slow or away: a Redis stream when the gateway's
state is in Redis (any instance drains it), and always a local append-only file, for when
Redis is away too.

Both are bounded by the bytes they hold as written (`spool_max_mb` each): past the bound a record
is dropped, counted and logged, never blocking a request. Draining may hand a record out twice
(an instance that died between writing a batch and removing it, two instances draining one
stream): the ledger's write is idempotent on request id.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from plugins.ledger.record import UsageRecord
from proxy.core import jsonutil
from proxy.state.stream_bytes import LUA as STREAM_BYTES
from proxy.state.stream_bytes import beside, run

log = logging.getLogger("modelgate.ledger")


@dataclass(slots=True)
class Taken:
    """Records handed out by a spool, and what removes them once they are written."""

    records: list[UsageRecord]
    token: Any


class FileSpool:
    """JSON lines in files of `directory`, one being appended to by this process at a time. A
    file being drained, or appended to, is locked (flock), so a file left by a process that
    died is drained by whichever process finds it, and by one only."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._current: Any = None  # the file this process appends to (locked while open)
        self._draining: tuple[Any, Path] | None = None

    def put(self, records: Sequence[UsageRecord]) -> bool:
        """Append `records` (False, writing none, when that would pass the bound or the disk refuses)."""
        data = b"".join(r.encoded() + b"\n" for r in records)
        try:
            if self.size() + len(data) > self.max_bytes:
                return False
            if self._current is None:
                # Locked under a name no drainer looks for, then given its own: never claimable unlocked.
                self.directory.mkdir(parents=True, exist_ok=True)
                name = f"ledger-{os.getpid()}-{time.time_ns()}.jsonl"
                handle = (self.directory / f"new-{name}").open("ab")
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.rename(self.directory / f"new-{name}", self.directory / name)
                self._current = handle
            self._current.write(data)
            self._current.flush()
            return True
        except OSError as exc:
            log.error("the ledger's spool file refused records: %s", exc)
            return False

    def size(self) -> int:
        try:
            return sum(p.stat().st_size for p in self.directory.glob("ledger-*.jsonl"))
        except OSError:
            return 0

    def take(self, limit: int) -> Taken | None:
        """Up to `limit` records of the oldest file no other process holds; this process's own
        file is closed first (later records go to a new one)."""
        if self._draining is None:
            self._seal()
            self._draining = self._claim()
            if self._draining is None:
                return None
        handle, _ = self._draining
        records = []
        start = handle.tell()
        for line in handle:
            if not line.endswith(b"\n"):  # a line its writer never finished (it died mid-write)
                break
            with contextlib.suppress(ValueError, TypeError):
                records.append(UsageRecord.from_json(jsonutil.loads(line)))
            if len(records) >= limit:
                break
        return Taken(records, (start, handle.tell()))

    def done(self, taken: Taken) -> None:
        """The records `taken` are written: a file drained to its end goes."""
        if self._draining is None:
            return
        handle, path = self._draining
        if handle.tell() >= os.fstat(handle.fileno()).st_size:
            path.unlink(missing_ok=True)
            handle.close()
            self._draining = None

    def put_back(self, taken: Taken) -> None:
        """The records `taken` could not be written: the next take starts with them again."""
        if self._draining is not None:
            self._draining[0].seek(taken.token[0])

    def close(self) -> None:
        self._seal()
        if self._draining is not None:
            self._draining[0].close()
            self._draining = None

    def _seal(self) -> None:
        if self._current is not None:
            self._current.close()  # and with it the lock: the file is now anyone's to drain
            self._current = None

    def _claim(self) -> tuple[Any, Path] | None:
        try:
            paths = sorted(self.directory.glob("ledger-*.jsonl"), key=lambda p: p.stat().st_mtime)
        except OSError:
            return None
        for path in paths:
            try:
                handle = path.open("rb")
            except OSError:
                continue
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()  # another process appends to it or drains it
                continue
            return handle, path
        return None


# A batch at the stream's end unless the bytes it holds would pass ARGV[1] (then nil).
_PUT = (
    STREAM_BYTES
    + """
if held(KEYS[1], KEYS[2]) + size(ARGV, 2) > tonumber(ARGV[1]) then return false end
return add(KEYS[1], KEYS[2], ARGV, 2)
"""
)
# The entries ARGV names, written: removed, and their bytes with them.
_DONE = (
    STREAM_BYTES
    + """
for i = 1, #ARGV do remove(KEYS[1], KEYS[2], ARGV[i]) end
return 0
"""
)
_HELD = (
    STREAM_BYTES
    + """
return held(KEYS[1], KEYS[2])
"""
)


class RedisSpool:
    """A Redis stream of batches, shared by every instance on the same state store, bounded by the
    bytes it holds as written (proxy/state/stream_bytes.py): a record's size varies too much for a
    count of batches to bound anything."""

    def __init__(self, shared: Any, key: str, max_bytes: int) -> None:
        self._shared = shared  # the process's client for the state URL (proxy/state/shared.py), given back on close
        self._client = shared.client
        self._key = key
        self._keys = [key, beside(key)]
        self.max_bytes = max_bytes
        self._put = self._client.register_script(_PUT)
        self._done = self._client.register_script(_DONE)
        self._held = self._client.register_script(_HELD)

    async def put(self, records: Sequence[UsageRecord]) -> bool:
        data = jsonutil.dumps([r.to_json() for r in records])
        try:
            return await run(self._client, self._put, self._keys, [self.max_bytes, "records", data]) is not None
        except (RedisError, OSError, TimeoutError) as exc:  # the store away: the file takes them
            log.warning("the ledger's Redis spool is unavailable: %s", type(exc).__name__)
            return False

    async def take(self, limit: int) -> Taken | None:
        entries = await self._client.xrange(self._key, count=max(1, limit // 100))
        if not entries:
            return None
        records = []
        for _, fields in entries:
            with contextlib.suppress(ValueError, TypeError, KeyError):
                records.extend(UsageRecord.from_json(r) for r in jsonutil.loads(fields[b"records"]))
        return Taken(records, [entry_id for entry_id, _ in entries])

    async def done(self, taken: Taken) -> None:
        await run(self._client, self._done, self._keys, taken.token)

    async def held(self) -> int:
        """The bytes the stream holds, as written."""
        return int(await run(self._client, self._held, self._keys, []))

    async def close(self) -> None:
        from proxy.state.shared import unshare

        shared, self._shared = self._shared, None
        if shared is not None:
            await unshare(shared)
