"""Keeping a channel's credential from the client: an upstream that echoes it back (an error
message quoting the request, a redirect carrying `?key=`, a debug dump of its headers) must not
hand it to a client.

A `Redactor` finds the secret in every spelling an upstream is likely to echo it in, and
replaces it with a marker: in header values, in whole bodies, and in a body that streams (a
few bytes are held back at each chunk's end, so a secret cut in two by the network is still
caught). The spellings:

- as is, in any letter case (an upstream that upper-cases what it quotes), each character
  also percent-encoded (`%2D` or `%2d` for `-`, a form's `+` for a space) or JSON-escaped
  (`\\/` for `/`; any ASCII character as `\\u00XX`, hex digits in either case: .NET writes `+`
  as `\\u002B`, Gson `=` as `\\u003d`);
- hex, in either case;
- Base64, standard and URL-safe, padded or not: alone, after `Bearer `, and inside a Basic
  credential (`user:secret`, `:secret`). The secret starts anywhere in the encoded bytes, so
  it is looked for at each of the three alignments of a byte in a Base64 group: the characters
  that encode only the secret's bits are the same whatever surrounds it. `+`, `/` and the `=`
  of padding may come percent- or JSON-escaped. A match is widened to the whole Base64 run
  around it (a Basic credential goes whole), padding included.

Encoded spellings are looked for only when the secret has at least `ENCODED_FROM` bytes: a
shorter one's Base64 is too short to tell from other text. The patterns are compiled once, when
the channel is made.
"""

from __future__ import annotations

import base64
import re
from typing import AnyStr

MARKER = "[redacted]"
_MARKER_BYTES = MARKER.encode()
ENCODED_FROM = 6
_BASE64_CHARACTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_"
_RUN = re.compile(b"[" + re.escape(_BASE64_CHARACTERS) + b"]*(?:=|%3[dD]|\\\\[uU]003[dD]){0,2}")
_TEXT_RUN = re.compile(_RUN.pattern.decode())


def _either_case(hex_digits: str) -> bytes:
    return b"".join(
        b"[" + c.lower().encode() + c.upper().encode() + b"]" if c.isalpha() else c.encode() for c in hex_digits
    )


def _cases(byte: int) -> list[int]:
    return sorted({byte, ord(chr(byte).lower()), ord(chr(byte).upper())}) if byte < 0x80 else [byte]


def _json_escape(hex_digits: bytes) -> tuple[bytes, bytes]:
    """A JSON string's `\\u00XX` for a character (`hex_digits` its pattern): JSON writes the
    `u` lower-case, an upstream upper-casing its whole message the `U` too."""
    return b"\\", b"[uU]00" + hex_digits


def _byte_spellings(byte: int) -> list[tuple[bytes, bytes]]:
    """How one byte of the secret may be spelled: (its first byte, a pattern for the rest)."""
    cases = _cases(byte)
    spellings = [(bytes([c]), b"") for c in cases]
    hex_digits = b"(?:" + b"|".join(_either_case(f"{c:02x}") for c in cases) + b")"
    spellings.append((b"%", hex_digits))
    if byte < 0x80:  # a JSON encoder may escape any character (a byte past ASCII is part of one, not one)
        spellings.append(_json_escape(hex_digits))
    if byte == 0x20:
        spellings.append((b"+", b""))  # a form's space
    elif byte == 0x2F:
        spellings.append((b"\\", b"/"))  # JSON may escape a slash
    return spellings


def _spellings(secret: bytes) -> bytes:
    """A pattern for `secret` with each byte in either letter case, as itself or percent-encoded."""
    return b"".join(
        b"(?:" + b"|".join(re.escape(first) + rest for first, rest in _byte_spellings(byte)) + b")" for byte in secret
    )


def _base64_cores(secret: bytes) -> list[bytes]:
    """The Base64 characters that encode nothing but `secret`'s bits, at each of the three
    alignments it may have in the encoded bytes, in both alphabets."""
    cores = []
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + secret)
        first, end = -(-offset * 8 // 6), (offset + len(secret)) * 8 // 6
        core = encoded[first:end]
        cores += [core, core.translate(bytes.maketrans(b"+/", b"-_"))]
    return list(dict.fromkeys(cores))


# In a URL or a JSON string a standard alphabet's `+` and `/` may come escaped.
_BASE64_ESCAPED = {
    ord("+"): [(b"+", b""), (b"%", b"2[bB]"), _json_escape(b"2[bB]")],
    ord("/"): [(b"/", b""), (b"\\", b"/"), (b"%", b"2[fF]"), _json_escape(b"2[fF]")],
}


def _base64_spellings(char: int) -> list[tuple[bytes, bytes]]:
    return _BASE64_ESCAPED.get(char, [(bytes([char]), b"")])


def _base64_pattern(core: bytes) -> bytes:
    return b"".join(
        b"(?:" + b"|".join(re.escape(first) + rest for first, rest in _base64_spellings(c)) + b")" for c in core
    )


def _branches(secret: bytes) -> list[tuple[str, bytes, bytes]]:
    """Every spelling of `secret` as (its kind, its first byte, a pattern for the rest). A
    pattern whose every branch starts with a literal byte is searched for by first skipping, in
    C, every byte no branch starts with: most bytes of most bodies."""
    rest = _spellings(secret[1:])
    branches = [("as_is", first, after + rest) for first, after in _byte_spellings(secret[0])]
    if len(secret) >= ENCODED_FROM:
        digits = secret.hex()
        branches += [("hex", bytes([c]), _either_case(digits[1:])) for c in _cases(ord(digits[0]))]
        for core in _base64_cores(secret):
            branches += [
                ("base64", first, after + _base64_pattern(core[1:])) for first, after in _base64_spellings(core[0])
            ]
    return branches


class Redactor:
    __slots__ = ("_pattern", "_text_pattern", "_hold")

    def __init__(self, secret: str) -> None:
        raw = secret.encode()
        # Each branch a named group after its first byte (the group names its kind), so that the
        # whole is an alternation of literals to the regex compiler.
        pattern = b"|".join(
            re.escape(first) + b"(?P<%s_%d>" % (kind.encode(), n) + rest + b")"
            for n, (kind, first, rest) in enumerate(_branches(raw))
        )
        self._pattern = re.compile(pattern)
        self._text_pattern = re.compile(pattern.decode("utf-8", "surrogateescape"))
        longest = 6 * len(raw)  # each byte JSON-escaped (`\\u002B`)
        if len(raw) >= ENCODED_FROM:  # each Base64 character so (only `+` and `/` may be, but a bound will do)
            longest = max(longest, 6 * max(map(len, _base64_cores(raw))))
        self._hold = longest - 1  # a spelling cut at a chunk's end is held back whole

    def text(self, value: str) -> str:
        return "".join(_redacted(self._text_pattern, value, MARKER)[0])

    def found_in(self, value: str) -> bool:
        return self._text_pattern.search(value) is not None

    def bytes(self, data: bytes) -> bytes:
        if self._pattern.search(data) is None:
            return data
        return b"".join(_redacted(self._pattern, data, _MARKER_BYTES)[0])

    def stream(self) -> StreamRedactor:
        return StreamRedactor(self)


# A Base64 run that reaches a chunk's end may go on in the next one: it is held back, up to this
# much, so that it is replaced whole as in a body read whole. Past it (a run that long holds
# nothing of the secret but the few bits next to its spelling) it is not, so that a long run is
# not searched again with each chunk.
_RUN_HELD = 1024


def _redacted(
    pattern: re.Pattern[AnyStr], data: AnyStr, marker: AnyStr, until: int | None = None
) -> tuple[list[AnyStr], int]:
    """The pieces of `data` with every spelling replaced by `marker`, a Base64 one widened to the
    run of Base64 characters (and padding) it stands in; and how far into `data` they go. Whole
    (`until` None): to its end. A chunk of a stream: up to `until`, past it only to the end of a
    spelling that starts before it, and not into a Base64 run that may go on after `data`.
    Linear: a widened match swallows the matches inside it."""
    is_text = isinstance(data, str)
    out: list[AnyStr] = []
    done = 0
    found = pattern.search(data)
    while found is not None and (until is None or found.start() < until):
        start, end = found.span()
        if found.lastgroup.startswith("base64"):  # type: ignore[union-attr]
            start, end = _widened(data, start, end, done, is_text)
            if until is not None and end == len(data) and end - start <= _RUN_HELD:
                out.append(data[done : max(done, start)])
                return out, max(done, start)
        if start < done:  # inside what was replaced already
            start = done
        else:
            out += [data[done:start], marker]
        done = max(done, end)
        found = pattern.search(data, max(found.end(), done))
    if until is None:
        stop = len(data)
    else:  # nor into a run whose Base64 may turn out to be a spelling's widening
        stop = max(until, done)
        stop -= _run_before(data, max(done, stop - _RUN_HELD), stop, is_text)
    out.append(data[done:stop])
    return out, stop


def _run_before(data: AnyStr, floor: int, at: int, is_text: bool) -> int:
    """How many Base64 characters come just before `at` (not before `floor`)."""
    before = data[floor:at]
    return len(before) - len(before.rstrip(_BASE64_CHARACTERS.decode() if is_text else _BASE64_CHARACTERS))  # type: ignore[arg-type]


def _widened(data: AnyStr, start: int, end: int, floor: int, is_text: bool) -> tuple[int, int]:
    """A Base64 spelling's span widened to its run, and the run's padding (scans in C)."""
    return start - _run_before(data, floor, start, is_text), (_TEXT_RUN if is_text else _RUN).match(data, end).end()  # type: ignore[union-attr,arg-type]


class StreamRedactor:
    """Redacts a body chunk by chunk; `flush` gives what was held back at the end. What is held
    is the body as sent (at most the longest spelling, or a Base64 run that may go on), so each
    spelling is looked for once, whole, wherever the network cut it."""

    __slots__ = ("_redactor", "_tail")

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._tail + chunk
        pieces, done = _redacted(self._redactor._pattern, data, _MARKER_BYTES, max(0, len(data) - self._redactor._hold))
        self._tail = data[done:]
        return b"".join(pieces)

    def flush(self) -> bytes:
        tail, self._tail = self._tail, b""
        return self._redactor.bytes(tail)
