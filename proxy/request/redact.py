"""Keeping a channel's credential from the client: an upstream that echoes it back (an error
message quoting the request, a redirect carrying `?key=`) must not hand it to a client.

A `Redactor` finds the secret as is and in any percent-encoding of any of its characters
(`%2D` or `%2d` for `-`, a form's `+` for a space), and replaces it with a marker: in header
values, in whole bodies, and in a body that streams (a few bytes are held back at each chunk's
end, so a secret cut in two by the network is still caught).
"""

from __future__ import annotations

import re

MARKER = "[redacted]"
_MARKER_BYTES = MARKER.encode()


def _spellings(secret: bytes) -> bytes:
    """A pattern for `secret` with each byte as itself or percent-encoded, in either case."""
    parts = []
    for byte in secret:
        hex_pair = f"{byte:02x}"
        alternatives = [re.escape(bytes([byte])), b"%" + b"".join(
            b"[" + c.lower().encode() + c.upper().encode() + b"]" if c.isalpha() else c.encode() for c in hex_pair)]
        if byte == 0x20:
            alternatives.append(rb"\+")
        parts.append(b"(?:" + b"|".join(alternatives) + b")")
    return b"".join(parts)


class Redactor:
    __slots__ = ("_secret", "_pattern", "_text_pattern", "_hold")

    def __init__(self, secret: str) -> None:
        self._secret = secret
        pattern = _spellings(secret.encode())
        self._pattern = re.compile(pattern)
        self._text_pattern = re.compile(pattern.decode("utf-8", "surrogateescape"))
        self._hold = 3 * len(secret.encode()) - 1  # the longest spelling, less one byte

    def text(self, value: str) -> str:
        return self._text_pattern.sub(MARKER, value)

    def found_in(self, value: str) -> bool:
        # Every spelling is the secret itself or holds a `%` (or a form's `+`): most values hold
        # neither, and are passed over without running the pattern.
        if self._secret not in value and "%" not in value and "+" not in value:
            return False
        return self._text_pattern.search(value) is not None

    def bytes(self, data: bytes) -> bytes:
        return self._pattern.sub(_MARKER_BYTES, data)

    def stream(self) -> StreamRedactor:
        return StreamRedactor(self)


class StreamRedactor:
    """Redacts a body chunk by chunk; `flush` gives what was held back at the end."""

    __slots__ = ("_redactor", "_tail")

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._redactor.bytes(self._tail + chunk)
        hold = self._redactor._hold
        # The held bytes cannot hold a whole secret (it would have been replaced); they may hold
        # the start of one that the next chunk completes.
        cut = max(0, len(data) - hold)
        self._tail = data[cut:]
        return data[:cut]

    def flush(self) -> bytes:
        tail, self._tail = self._tail, b""
        return tail
