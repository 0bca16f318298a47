"""No request bytes in logs: what aiohttp's server says of a request is logged by kind only.

aiohttp logs a malformed request ("Error handling request") with its parser's message, and
that message quotes the offending bytes: a request line with `?key=...`, a header holding a
Bearer key. Every record of aiohttp's server-side loggers keeps its own words and the
exception's type and status; the exception's text and traceback, which hold the bytes, go.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

AIOHTTP_SERVER_LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.access", "aiohttp.internal")


class RequestBytesFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg, record.args = "malformed request refused: %s (%s)", (type(exc).__name__, exc.code)
        elif exc is not None:
            record.msg, record.args = "%s: %s", (_own_words(record), type(exc).__name__)
        record.exc_info, record.exc_text, record.stack_info = None, None, None
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
