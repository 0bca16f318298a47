"""Where delivered images wait for their fetch: a local directory (default) or Redis with a TTL.

A store keeps bytes and their content type until they expire; expired blobs are deleted
(the local store's janitor, Redis's own TTL).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger("modelgate.delivery")


@dataclass(slots=True, frozen=True)
class Blob:
    data: bytes
    content_type: str


class StoreError(Exception):
    """The store could not take or give a blob (recoverable: the caller may fall back)."""


class BlobStore(Protocol):
    async def put(self, blob_id: str, blob: Blob, ttl_s: int) -> None: ...
    async def get(self, blob_id: str) -> Blob | None: ...
    async def start(self) -> None: ...
    async def close(self) -> None: ...


class LocalStore:
    """Files in a directory, each with a small JSON sidecar holding its type and expiry."""

    def __init__(self, directory: str, janitor_every_s: float = 60.0) -> None:
        self.directory = Path(directory)
        self._every = janitor_every_s
        self._janitor: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            # Not fatal: each delivery fails (and falls back, or fails in strict mode) until fixed.
            log.error("image store directory %s is unusable: %s", self.directory, exc.strerror or exc)
        self._janitor = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def close(self) -> None:
        if self._janitor is not None:
            self._janitor.cancel()

    async def put(self, blob_id: str, blob: Blob, ttl_s: int) -> None:
        try:
            await asyncio.to_thread(self._write, blob_id, blob, time.time() + ttl_s)
        except OSError as exc:
            raise StoreError(f"local store: {exc.strerror or exc}") from exc

    async def get(self, blob_id: str) -> Blob | None:
        try:
            return await asyncio.to_thread(self._read, blob_id)
        except OSError as exc:
            raise StoreError(f"local store: {exc.strerror or exc}") from exc

    def _write(self, blob_id: str, blob: Blob, expires: float) -> None:
        data_path = self.directory / f"{blob_id}.bin"
        temp = data_path.with_suffix(".tmp")
        temp.write_bytes(blob.data)
        os.replace(temp, data_path)  # readers never see half a file
        (self.directory / f"{blob_id}.json").write_text(json.dumps({"type": blob.content_type, "expires": expires}))

    def _read(self, blob_id: str) -> Blob | None:
        meta_path = self.directory / f"{blob_id}.json"
        if not meta_path.exists():
            return None
        meta = json.loads(meta_path.read_text())
        if meta["expires"] <= time.time():
            return None
        return Blob((self.directory / f"{blob_id}.bin").read_bytes(), meta["type"])

    def sweep(self, now: float | None = None) -> int:
        """Delete expired blobs; returns how many."""
        now = now or time.time()
        removed = 0
        for meta_path in self.directory.glob("*.json"):
            try:
                if json.loads(meta_path.read_text())["expires"] <= now:
                    meta_path.with_suffix(".bin").unlink(missing_ok=True)
                    meta_path.unlink(missing_ok=True)
                    removed += 1
            except (OSError, ValueError, KeyError):
                continue
        return removed

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            await asyncio.to_thread(self.sweep)


class RedisBlobStore:
    """Blobs in Redis hashes that expire with their URLs; every instance sharing it can serve them."""

    def __init__(self, url: str, prefix: str) -> None:
        self._client = aioredis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._prefix = prefix + "blob:"

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        await self._client.aclose()

    async def put(self, blob_id: str, blob: Blob, ttl_s: int) -> None:
        key = self._prefix + blob_id
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping={"data": blob.data, "type": blob.content_type})
                pipe.expire(key, ttl_s)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise StoreError(f"redis store: {exc}") from exc

    async def get(self, blob_id: str) -> Blob | None:
        try:
            found = await self._client.hgetall(self._prefix + blob_id)
        except (RedisError, OSError) as exc:
            raise StoreError(f"redis store: {exc}") from exc
        if not found:
            return None
        return Blob(found[b"data"], found[b"type"].decode())
