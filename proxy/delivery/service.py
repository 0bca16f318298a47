"""`DeliveryService`: mints signed URLs for stored images, and serves them.

Served URLs need no Authorization: the query carries the expiry, the signing key's id and
the signature. A tampered URL is a 403, an expired one a 410 (JSON errors); an image is
sent with its Content-Type, Content-Length, an ETag and a Cache-Control that ends at expiry.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from email.utils import formatdate

from aiohttp import web

from proxy import jsonutil
from proxy.delivery.signing import Signer
from proxy.delivery.stores import Blob, BlobStore, StoreError

PATH = "/images/{blob_id}"
_DOWN_AFTER = 3      # store failures in a row before it counts as down
_DOWN_FOR_S = 10.0   # how long new deliveries are refused before the store is tried again


class DeliveryService:
    def __init__(self, store: BlobStore, signer: Signer, ttl_s: int, public_base_url: str | None) -> None:
        self.store = store
        self.signer = signer
        self.ttl_s = ttl_s
        self.base = public_base_url.rstrip("/") if public_base_url else None
        self._started = False
        self._failures = 0
        self._down_until = 0.0

    @property
    def available(self) -> bool:
        """False while the store has just failed several times in a row (retried after a pause)."""
        return time.monotonic() >= self._down_until

    async def start(self) -> None:
        if not self._started:
            self._started = True
            await self.store.start()

    async def close(self) -> None:
        await self.store.close()

    async def mint(self, data: bytes, content_type: str, request: web.BaseRequest) -> str:
        """Store an image and return its signed URL (on `server.public_base_url`, else on the
        base URL the client used); raises StoreError."""
        blob_id = secrets.token_urlsafe(18)
        try:
            await self.store.put(blob_id, Blob(data, content_type), self.ttl_s)
        except StoreError:
            self._failures += 1
            if self._failures >= _DOWN_AFTER:
                self._down_until = time.monotonic() + _DOWN_FOR_S
            raise
        self._failures = 0
        url_for = getattr(self.store, "url_for", None)
        if url_for is not None:  # object storage hands out its own presigned URL
            return url_for(blob_id, self.ttl_s)
        signed = self.signer.sign(blob_id, self.ttl_s)
        base = self.base or f"{request.scheme}://{request.host}"
        return f"{base}/images/{blob_id}?{signed.query()}"

    async def serve(self, request: web.Request) -> web.StreamResponse:
        blob_id = request.match_info["blob_id"]
        query = request.query
        try:
            expires = int(query["exp"])
            key_id, signature = query["kid"], query["sig"]
        except (KeyError, ValueError):
            return _error(403, "this URL is missing its expiry or signature", "invalid_signature")
        if not self.signer.verify(blob_id, expires, key_id, signature):
            return _error(403, "this URL's signature is not valid", "invalid_signature")
        now = time.time()
        if expires <= now:
            return _error(410, "this URL has expired", "url_expired")
        try:
            blob = await self.store.get(blob_id)
        except StoreError:
            return _error(503, "the image store is unavailable; retry shortly", "image_delivery_store_unavailable")
        if blob is None:
            return _error(410, "this image is no longer stored", "url_expired")
        etag = '"' + hashlib.sha256(blob.data).hexdigest()[:32] + '"'
        headers = {"Content-Type": blob.content_type, "ETag": etag,
                   "Cache-Control": f"private, max-age={max(0, int(expires - now))}, immutable",
                   "Expires": formatdate(expires, usegmt=True)}
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=blob.data, headers=headers)


def _error(status: int, message: str, code: str) -> web.Response:
    kind = {403: "permission_error", 410: "not_found_error", 503: "server_error"}[status]
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.Response(status=status, body=jsonutil.dumps(body), content_type="application/json")
