"""Watching a multipart/form-data body go by, without holding it.

The gateway forwards multipart bytes as they arrive; this observer reads the same bytes
and notes each part's name, filename, type and size, the first bytes of files (enough
for magic numbers and image headers) and the values of small text fields such as
`model`. It keeps no more than one delimiter's worth of bytes between reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from aiohttp.helpers import parse_mimetype

_HEADER_LIMIT = 16 * 1024
# RFC 2046 5.1.1: 1-70 characters, none of them a space at the end.
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
_DISPOSITION_PARAM = re.compile(r';\s*([A-Za-z0-9_*-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]+))')


@dataclass(slots=True)
class FormPart:
    """One part of the form as far as it has been read."""

    name: str
    filename: str | None
    content_type: str | None
    size: int = 0
    head: bytes = b""
    value: bytearray | None = None  # text fields only, up to the field limit
    complete: bool = False  # its closing delimiter has been read: the value is whole

    @property
    def is_file(self) -> bool:
        return self.filename is not None


@dataclass(slots=True)
class MultipartObserver:
    boundary: bytes
    field_limit: int = 128 * 1024  # a text field: 32,000 characters of any script, as UTF-8
    max_parts: int = 256  # every check looks at every part: their number is bounded
    head_size: int = 64 * 1024  # enough for magic numbers and image headers (a JPEG's SOF may sit past EXIF)
    parts: list[FormPart] = field(default_factory=list)
    done: bool = False
    error: str | None = None
    _buffer: bytes = b""
    _searched: int = 0  # the bytes of `_buffer` already looked through for the line end awaited
    _state: str = "preamble"
    _current: FormPart | None = None

    @classmethod
    def for_content_type(cls, content_type: str) -> MultipartObserver | None:
        """An observer for the one boundary the Content-Type names; None when it names none, two,
        or one that is not a boundary (a reader that picked another would see another form)."""
        boundaries = parse_mimetype(content_type).parameters.getall("boundary", [])
        if len(boundaries) != 1 or not _BOUNDARY.fullmatch(boundaries[0]):
            return None
        return cls(boundary=boundaries[0].encode("ascii"))

    def field(self, name: str) -> str | None:
        """The text value of the first non-file part called `name`, once fully read."""
        for part in self.parts:
            if part.name == name and not part.is_file and part.value is not None and part.complete:
                return part.value.decode("utf-8", "replace")
        return None

    def fields(self) -> dict[str, str]:
        """Every text field read whole so far (a value still arriving is not one yet); of a name
        given twice, the last (the fields the gateway decides by may not be given twice)."""
        return {
            part.name: part.value.decode("utf-8", "replace")
            for part in self.parts
            if part.complete and not part.is_file and part.value is not None
        }

    def files(self) -> list[FormPart]:
        return [p for p in self.parts if p.is_file]

    def feed(self, chunk: bytes) -> None:
        if self.error:
            return
        if self.done:
            self._epilogue(chunk)
            return
        self._buffer += chunk
        while self._step():
            pass

    def finish(self) -> None:
        if not self.done and not self.error:
            self.error = "multipart body ended before its closing delimiter"

    def _step(self) -> bool:
        delimiter = b"--" + self.boundary
        if self._state == "preamble":
            at = self._buffer.find(delimiter)
            if at < 0:
                self._buffer = self._buffer[-len(delimiter) :]
                return False
            self._buffer = self._buffer[at + len(delimiter) :]
            self._state = "after_delimiter"
            return True
        if self._state == "after_delimiter":
            if len(self._buffer) < 2:
                return False
            if self._buffer[:2] == b"--":
                rest, self.done, self._buffer = self._buffer[2:], True, b""
                self._epilogue(rest)
                return False
            end = self._buffer.find(b"\r\n", max(0, self._searched - 1))
            if end < 0:
                # Only white space may follow a delimiter, and not this much: held whole and
                # searched again at each read, one endless line cost time growing with its square.
                if len(self._buffer) > _HEADER_LIMIT:
                    self.error = "a delimiter line is too long"
                self._searched = len(self._buffer)
                return False
            self._searched = 0
            if self._buffer[:end].strip(b" \t"):
                # Only white space may follow a delimiter (RFC 2046 5.1.1): a reader that took a
                # bare LF for a line end, or `--bX` for a delimiter, would see other parts.
                self.error = "a delimiter line holds more than the boundary"
                return False
            self._buffer = self._buffer[end + 2 :]
            self._state = "headers"
            return True
        if self._state == "headers":
            end = self._buffer.find(b"\r\n\r\n", max(0, self._searched - 3))
            if end < 0:
                if len(self._buffer) > _HEADER_LIMIT:
                    self.error = "a part's headers are too large"
                self._searched = len(self._buffer)
                return False
            self._searched = 0
            self._start_part(self._buffer[:end])
            self._buffer = self._buffer[end + 4 :]
            self._state = "body"
            return self.error is None
        # body: everything up to CRLF--boundary belongs to the current part
        marker = b"\r\n" + delimiter
        at = self._buffer.find(marker)
        if at < 0:
            keep = len(marker) - 1
            if len(self._buffer) > keep:
                self._take(self._buffer[:-keep])
                self._buffer = self._buffer[-keep:]
            return False
        self._take(self._buffer[:at])
        self._buffer = self._buffer[at + len(marker) :]
        if self._current is not None:
            self._current.complete = True
        self._current = None
        self._state = "after_delimiter"
        return True

    def _epilogue(self, data: bytes) -> None:
        # Nothing but line ends may follow the close: bytes there go upstream unchecked.
        if data.strip(b" \t\r\n"):
            self.error = "data after the closing delimiter"

    def _start_part(self, raw_headers: bytes) -> None:
        name, filename, content_type = None, None, None
        dispositions = 0
        if b"\n" in raw_headers.replace(b"\r\n", b"") or b"\r" in raw_headers.replace(b"\r\n", b""):
            self.error = "a part's header lines do not all end in CRLF"
            return
        for line in raw_headers.decode("utf-8", "replace").split("\r\n"):
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key == "content-disposition":
                dispositions += 1
                found = [(m[0].lower(), m[1] if m[1] or not m[2] else m[2]) for m in _DISPOSITION_PARAM.findall(value)]
                params = dict(found)
                if dispositions > 1 or len(params) != len(found):
                    self.error = "a part names itself twice"  # readers differ on which one counts
                    return
                if any(key.endswith("*") or "\\" in val for key, val in found):
                    # RFC 2231 `name*=`, and backslash escapes, are read by some parsers and not
                    # by others: a form must name its parts one way.
                    self.error = "a part is named with an extended parameter or an escape"
                    return
                name, filename = params.get("name"), params.get("filename")
            elif key == "content-type":
                content_type = value.strip()
        if name is None:
            self.error = "a part has no Content-Disposition name"
            return
        if len(self.parts) >= self.max_parts:
            self.error = f"a form has at most {self.max_parts} parts"
            return
        part = FormPart(
            name=name, filename=filename, content_type=content_type, value=None if filename is not None else bytearray()
        )
        self.parts.append(part)
        self._current = part

    def _take(self, data: bytes) -> None:
        part = self._current
        if part is None or not data:
            return
        if len(part.head) < self.head_size:
            part.head += data[: self.head_size - len(part.head)]
        part.size += len(data)
        if part.value is not None:
            if part.size > self.field_limit:
                part.value = None  # too large to be a parameter; still counted
            else:
                part.value += data
