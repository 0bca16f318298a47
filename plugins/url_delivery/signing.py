"""Signed temporary URLs: an HMAC over the blob id and the expiry, under a key named in the URL.

Keys rotate: the first configured key signs; every configured key verifies, so URLs made
under an old key keep working until they expire, as long as that key stays listed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class SignedUrl:
    blob_id: str
    expires: int
    key_id: str
    signature: str

    def query(self) -> str:
        return f"exp={self.expires}&kid={self.key_id}&sig={self.signature}"


class Signer:
    def __init__(self, keys: list[tuple[str, str]]) -> None:
        if not keys:
            # One process only: URLs it makes cannot be served by another instance.
            keys = [("ephemeral", secrets.token_hex(32))]
        self._keys = {key_id: secret.encode() for key_id, secret in keys}
        self._current = keys[0][0]

    @property
    def ephemeral(self) -> bool:
        return self._current == "ephemeral"

    def sign(self, blob_id: str, ttl_s: int, now: float | None = None) -> SignedUrl:
        expires = int((now or time.time()) + ttl_s)
        return SignedUrl(blob_id, expires, self._current, self._mac(self._current, blob_id, expires))

    def verify(self, blob_id: str, expires: int, key_id: str, signature: str) -> bool:
        if key_id not in self._keys or not signature.isascii():
            return False
        return hmac.compare_digest(self._mac(key_id, blob_id, expires), signature)

    def _mac(self, key_id: str, blob_id: str, expires: int) -> str:
        message = f"{blob_id}.{expires}".encode()
        return hmac.new(self._keys[key_id], message, hashlib.sha256).hexdigest()
