"""Where delivered images wait for their fetch: a local directory (default), Redis with a TTL,
or S3-compatible storage with presigned URLs.

A store keeps bytes and their content type until they expire; expired blobs are deleted
(the local store's janitor, Redis's own TTL).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

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


class Janitor:
    """A store's sweep, run in a thread every `every_s` seconds. Started once per store however
    often the store is started (a reload starts it again); a failed sweep is logged, and the next
    one runs as planned."""

    __slots__ = ("_sweep", "_every", "_name", "task")

    def __init__(self, sweep: Callable[[], int], every_s: float, name: str) -> None:
        self._sweep = sweep
        self._every = every_s
        self._name = name
        self.task: asyncio.Task[None] | None = None

    def start(self) -> bool:
        """Start sweeping; False when it already runs."""
        if self.task is not None and not self.task.done():
            return False
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"{self._name} janitor")
        return True

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            try:
                await asyncio.to_thread(self._sweep)
            except Exception as exc:
                log.warning("%s janitor: %s", self._name, exc)


class LocalStore:
    """Files in a directory, each with a small JSON sidecar holding its type and expiry; the
    sidecar's modification time is set to the expiry too, so the sweep needs no reads."""

    def __init__(self, directory: str, janitor_every_s: float = 60.0, min_free_mb: float = 256) -> None:
        self.directory = Path(directory)
        self._janitor = Janitor(self.sweep, janitor_every_s, "local store")
        self._min_free = min_free_mb * 1024 * 1024
        self._room_checked = (0.0, True)

    def has_room(self) -> bool:
        """False when the disk holding the store is nearly full (checked at most once a second)."""
        at, room = self._room_checked
        now = time.monotonic()
        if now - at >= 1.0:
            try:
                room = shutil.disk_usage(self.directory).free >= self._min_free
            except OSError:
                room = True  # an unusable directory shows up as store failures instead
            self._room_checked = (now, room)
        return room

    async def start(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            # Not fatal: each delivery fails (and falls back, or fails in strict mode) until fixed.
            log.error("image store directory %s is unusable: %s", self.directory, exc.strerror or exc)
        self._janitor.start()

    async def close(self) -> None:
        self._janitor.stop()

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

    # Plain string paths: pathlib interns every part it parses, and a name per blob grew the
    # interpreter's table of interned strings by megabytes under sustained traffic.
    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _write(self, blob_id: str, blob: Blob, expires: float) -> None:
        data_path, temp = self._path(f"{blob_id}.bin"), self._path(f"{blob_id}.tmp")
        with open(temp, "wb") as file:
            file.write(blob.data)
        os.replace(temp, data_path)  # readers never see half a file
        meta_path = self._path(f"{blob_id}.json")
        with open(meta_path, "w") as file:
            file.write(json.dumps({"type": blob.content_type, "expires": expires}))
        os.utime(meta_path, (expires, expires))

    def _read(self, blob_id: str) -> Blob | None:
        try:
            with open(self._path(f"{blob_id}.json")) as file:
                meta = json.loads(file.read())
        except FileNotFoundError:
            return None
        if meta["expires"] <= time.time():
            return None
        try:
            with open(self._path(f"{blob_id}.bin"), "rb") as file:
                return Blob(file.read(), meta["type"])
        except FileNotFoundError:  # swept between the two reads
            return None

    def sweep(self, now: float | None = None) -> int:
        """Delete expired blobs; returns how many. The directory is walked as a stream, and a
        sidecar's expiry read from its modification time: a sweep of a busy store costs one
        stat per blob and holds no list of them."""
        now = now or time.time()
        removed = 0
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if not entry.name.endswith(".json"):
                    continue
                try:
                    if entry.stat().st_mtime > now:
                        continue
                    for path in (entry.path[:-5] + ".bin", entry.path):
                        with contextlib.suppress(FileNotFoundError):  # swept by another instance meanwhile
                            os.unlink(path)
                    removed += 1
                except OSError:
                    continue
        return removed


_SHARED_BYTES = 64 * 1024  # the largest image written in a pipeline shared with other calls


class RedisBlobStore:
    """Blobs in Redis hashes that expire with their URLs; every instance sharing it can serve them.
    Through the process's shared client: a blob's write rides with its request's other calls."""

    # The hash and its expiry in one step: a blob is never left to live for ever.
    _PUT = (
        "redis.call('HSET', KEYS[1], 'data', ARGV[1], 'type', ARGV[2]) redis.call('EXPIRE', KEYS[1], ARGV[3]) return 1"
    )

    def __init__(self, url: str, prefix: str) -> None:
        # Imported here: the Redis client costs a gateway that never uses it several MB.
        from redis.exceptions import RedisError

        from proxy.state.shared import share

        # Any topology: a blob is one hash under one key, so one slot of a Cluster.
        self._shared = share(url)
        self._put = self._shared.client.register_script(self._PUT)
        self._prefix = prefix + "blob:"
        self._errors = (RedisError, OSError)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        from proxy.state.shared import unshare

        shared, self._shared = self._shared, None
        if shared is not None:
            await unshare(shared)

    async def put(self, blob_id: str, blob: Blob, ttl_s: int) -> None:
        try:
            # A small image rides with its request's settlement; a large one goes on its own, so it
            # never holds up the limit checks of the requests that would share its pipeline.
            await self._shared.calls.script(
                self._put,
                [self._prefix + blob_id],
                [blob.data, blob.content_type, ttl_s],
                alone=len(blob.data) > _SHARED_BYTES,
            )
        except self._errors as exc:
            raise StoreError(f"redis store: {exc}") from exc

    async def get(self, blob_id: str) -> Blob | None:
        try:
            found = await self._shared.calls.command("HGETALL", self._prefix + blob_id)
        except self._errors as exc:
            raise StoreError(f"redis store: {exc}") from exc
        if not found:
            return None
        return Blob(found[b"data"], found[b"type"].decode())


class S3Store:
    """S3-compatible object storage: images are fetched from the bucket through presigned GET
    URLs, so no gateway serves them. Expired objects go by the bucket's lifecycle rule (set at
    start when allowed) and by the janitor's sweep of this store's prefix."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        endpoint_url: str | None,
        region: str,
        access_key_id: str | None,
        secret_access_key: str | None,
        janitor_every_s: float = 300.0,
    ) -> None:
        import boto3  # only a deployment that stores in S3 needs it
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix
        self._client = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            config=Config(signature_version="s3v4", retries={"max_attempts": 2}, connect_timeout=2, read_timeout=5),
        )
        self._janitor = Janitor(self.sweep, janitor_every_s, "s3 store")

    async def start(self) -> None:
        if not self._janitor.start():
            return  # started before: the lifecycle rule is set
        try:
            await asyncio.to_thread(
                self._client.put_bucket_lifecycle_configuration,
                Bucket=self.bucket,
                LifecycleConfiguration={
                    "Rules": [
                        {
                            "ID": "modelgate-expire-images",
                            "Status": "Enabled",
                            "Filter": {"Prefix": self.prefix},
                            "Expiration": {"Days": 1},
                        }
                    ]
                },
            )
        except Exception as exc:  # a bucket policy may forbid it: the janitor still deletes
            log.warning("could not set the bucket's lifecycle rule: %s", exc)

    async def close(self) -> None:
        self._janitor.stop()

    async def put(self, blob_id: str, blob: Blob, ttl_s: int) -> None:
        expires = datetime.fromtimestamp(time.time() + ttl_s, timezone.utc)
        try:
            await asyncio.to_thread(
                self._client.put_object,
                Bucket=self.bucket,
                Key=self.prefix + blob_id,
                Body=blob.data,
                ContentType=blob.content_type,
                Expires=expires,
                Metadata={"expires": str(int(expires.timestamp()))},
            )
        except Exception as exc:
            raise StoreError(f"s3 store: {exc}") from exc

    async def get(self, blob_id: str) -> Blob | None:
        try:
            found = await asyncio.to_thread(self._client.get_object, Bucket=self.bucket, Key=self.prefix + blob_id)
        except self._client.exceptions.NoSuchKey:
            return None
        except Exception as exc:
            raise StoreError(f"s3 store: {exc}") from exc
        return Blob(found["Body"].read(), found.get("ContentType", "application/octet-stream"))

    def url_for(self, blob_id: str, ttl_s: int) -> str:
        return self._client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self.prefix + blob_id}, ExpiresIn=ttl_s
        )

    def sweep(self, now: float | None = None) -> int:
        now = now or time.time()
        removed = 0
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        for page in pages:
            for item in page.get("Contents", []):
                head = self._client.head_object(Bucket=self.bucket, Key=item["Key"])
                if int(head.get("Metadata", {}).get("expires", "0")) <= now:
                    self._client.delete_object(Bucket=self.bucket, Key=item["Key"])
                    removed += 1
        return removed
