"""No request bytes in logs: what aiohttp's server says of a request is logged by kind only.

aiohttp logs a malformed request ("Error handling request") with its parser's message, and
that message quotes the offending bytes: a request line with `?key=...`, a header holding a
Bearer key. Every record of aiohttp's server-side loggers keeps its own words and the
exception's type and status; the exception's text and traceback, which hold the bytes, go.

A malformed request is its client's fault, and anyone who reaches the port can send thousands:
aiohttp logs each at error, which would flood the log and trip alerts on error lines. Here it is
a warning (a debug line stays debug), and at most one line per `SAMPLE_S` per kind (the parser's
exception) per process, saying how many of that kind went unlogged since the last line
(`suppressed`); `modelgate_malformed_requests_total{kind}` counts every one
(proxy/process/refusals.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError

AIOHTTP_SERVER_LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.access", "aiohttp.internal")
SAMPLE_S = 10.0


class RequestBytesFilter(logging.Filter):
    def __init__(self, every_s: float = SAMPLE_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        # By kind (the parser's exceptions: a dozen classes at most): when its last line went,
        # and how many were refused since without one.
        self.logged_at: dict[str, float] = {}
        self.unlogged: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        if isinstance(exc, HttpProcessingError):
            return self._sampled(record, type(exc).__name__, exc.code)
        if exc is not None:
            record.msg, record.args = "%s: %s", (_own_words(record), type(exc).__name__)
        return True

    def _sampled(self, record: logging.LogRecord, kind: str, status: int) -> bool:
        now = self.clock()
        last = self.logged_at.get(kind)
        if last is not None and now - last < self.every_s:
            self.unlogged[kind] = self.unlogged.get(kind, 0) + 1
            return False
        self.logged_at[kind] = now
        record.msg, record.args = "malformed request refused: %s (%s)", (kind, status)
        record.kind, record.suppressed = kind, self.unlogged.pop(kind, 0)  # type: ignore[attr-defined]
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def _own_words(record: logging.LogRecord) -> str:
    # aiohttp's templates carry only the peer's address in their arguments.
    try:
        return record.getMessage()
    except (TypeError, ValueError):
        return str(record.msg)


_FILTER = RequestBytesFilter()


def guard_aiohttp_logs() -> None:
    """Attach the filter to aiohttp's server-side loggers (once, however often it is called)."""
    for name in AIOHTTP_SERVER_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
