"""What kind of image a file is, and its size in pixels, from its first bytes only.

Enough for the edit rules (PNG/WEBP/JPG, mask dimensions) without decoding a pixel:
PNG's IHDR, WEBP's VP8/VP8L/VP8X header, JPEG's first SOF marker.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class ImageInfo:
    kind: str  # png | webp | jpeg
    width: int | None = None
    height: int | None = None


def sniff(head: bytes) -> ImageInfo | None:
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        if len(head) >= 24 and head[12:16] == b"IHDR":
            width, height = struct.unpack(">II", head[16:24])
            return ImageInfo("png", width, height)
        return ImageInfo("png")
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp(head)
    if head[:3] == b"\xff\xd8\xff":
        return _jpeg(head)
    return None


def _webp(head: bytes) -> ImageInfo:
    chunk = head[12:16]
    if chunk == b"VP8 " and len(head) >= 30:
        width, height = struct.unpack("<HH", head[26:30])
        return ImageInfo("webp", width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L" and len(head) >= 25:
        bits = int.from_bytes(head[21:25], "little")
        return ImageInfo("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X" and len(head) >= 30:
        return ImageInfo("webp", int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1)
    return ImageInfo("webp")


def _jpeg(head: bytes) -> ImageInfo:
    at = 2
    while at + 9 < len(head):
        if head[at] != 0xFF:
            break
        marker = head[at + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            at += 2
            continue
        length = int.from_bytes(head[at + 2 : at + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            height, width = struct.unpack(">HH", head[at + 5 : at + 9])
            return ImageInfo("jpeg", width, height)
        at += 2 + length
    return ImageInfo("jpeg")
