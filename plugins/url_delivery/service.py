"""`DeliveryService`: mints signed URLs for stored images, and serves them.

Served URLs need no Authorization: the query carries the expiry, the signing key's id and
the signature. A tampered or malformed URL is a 403, an expired one a 410 (JSON errors); an
image is sent with its Content-Type, Content-Length, an ETag and a Cache-Control that ends at
expiry. Only raster images (PNG, JPEG, WEBP, GIF, known by their first bytes) are stored, and
every answer forbids sniffing and scripts: a blob on the gateway's own origin must never run
as a page there.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from email.utils import formatdate

from aiohttp import web

from plugins.url_delivery.signing import Signer
from plugins.url_delivery.stores import Blob, BlobStore, StoreError
from proxy.config.model import ServerConfig
from proxy.core import jsonutil
from proxy.request.public_url import public_base_url

PATH = "/images/{blob_id}"
RASTER_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif"})
# Sent with every blob and every error: no sniffing, no scripts, no plug-ins, a sandboxed origin.
SAFE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; sandbox",
}
_BLOB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_EXPIRES = re.compile(r"[0-9]{1,12}")
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
_DOWN_AFTER = 3  # store failures in a row before it counts as down
_DOWN_FOR_S = 10.0  # how long new deliveries are refused before the store is tried again


class DeliveryService:
    def __init__(self, store: BlobStore, signer: Signer, ttl_s: int, server: ServerConfig) -> None:
        self.store = store
        self.signer = signer
        self.ttl_s = ttl_s
        self.server = server
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
        """Store a raster image (`raster_type` says which) and return its signed URL (proxy.request.public_url);
        raises StoreError."""
        if content_type not in RASTER_TYPES:
            raise ValueError(f"only raster images are stored, not {content_type}")
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
        return f"{public_base_url(request, self.server)}/images/{blob_id}?{signed.query()}"

    async def serve(self, request: web.Request) -> web.StreamResponse:
        blob_id = request.match_info["blob_id"]
        query = request.query
        raw_expires, key_id, signature = query.get("exp", ""), query.get("kid", ""), query.get("sig", "")
        if not (
            _EXPIRES.fullmatch(raw_expires)
            and _KEY_ID.fullmatch(key_id)
            and _SIGNATURE.fullmatch(signature)
            and _BLOB_ID.fullmatch(blob_id)
        ):
            return _error(
                403, "this URL is missing its expiry or signature, or they are malformed", "invalid_signature"
            )
        expires = int(raw_expires)
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
        headers = {
            "Content-Type": blob.content_type,
            "ETag": etag,
            "Cache-Control": f"private, max-age={max(0, int(expires - now))}, immutable",
            "Expires": formatdate(expires, usegmt=True),
            **SAFE_HEADERS,
        }
        if blob.content_type not in RASTER_TYPES:  # stored by an older gateway: never shown inline
            headers.update({"Content-Type": "application/octet-stream", "Content-Disposition": "attachment"})
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=blob.data, headers=headers)


def raster_type(data: bytes) -> str | None:
    """The media type of a PNG, JPEG, WEBP or GIF image, from its first bytes; None for anything else."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    return None


def _error(status: int, message: str, code: str) -> web.Response:
    kind = {403: "permission_error", 410: "not_found_error", 503: "server_error"}[status]
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.Response(status=status, body=jsonutil.dumps(body), content_type="application/json", headers=SAFE_HEADERS)
