"""Files a config reads: its own text and the secrets it names with `${file:/path}`, read the same
way when loading and when watching for a change, so what the watcher compares is what was loaded."""

from __future__ import annotations

import errno
import hashlib
import os
import stat

# A secret is a password, a key or a URL: far less than this. The bound keeps a path written by
# mistake (a log, a device) from being read whole into every reload.
MAX_SECRET_BYTES = 1024 * 1024


class UnreadableFile(Exception):
    """A file that cannot be used: `reason` says why, never what it holds."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def read_file(path: str, limit: int | None = None) -> bytes:
    """The bytes of the regular file at `path` (symlinks followed, as a Kubernetes volume's are).

    Opened without blocking and checked before it is read: a FIFO or a device named by mistake
    would otherwise hang a reload, or never end."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UnreadableFile(_reason(exc)) from None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise UnreadableFile("not a regular file")
        chunks = []
        size = 0
        while chunk := os.read(descriptor, 65536):
            chunks.append(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                raise UnreadableFile(f"larger than {limit // 1024} KB")
        return b"".join(chunks)
    except OSError as exc:
        raise UnreadableFile(_reason(exc)) from None
    finally:
        os.close(descriptor)


def digest(data: bytes) -> str:
    """What identifies a file's content for the watcher (never shown: a secret's digest is no
    business of a log or a metric)."""
    return hashlib.sha256(data).hexdigest()


def file_digest(path: str) -> str | None:
    """The digest of what `path` holds now, or None when it cannot be read (gone, not a file)."""
    try:
        return digest(read_file(path))
    except UnreadableFile:
        return None


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "no such file"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.EISDIR:
        return "a directory, not a file"
    return exc.strerror or type(exc).__name__
