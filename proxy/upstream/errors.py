"""What can go wrong talking to an upstream, and the facts the forwarder decides by.

The pool never sends a request twice. Every error says how far the request got: how much of
it was `written` to the connection, whether any byte of an answer came (`answered`), and
whether the connection had carried requests before (`reused`). A request with nothing written
never reached the upstream; anything more may have, and only the forwarder (proxy/request/forwarder.py)
decides whether such a request may go again.
"""

from __future__ import annotations

from enum import IntEnum


class Written(IntEnum):
    NOTHING = 0  # not a byte left the gateway: the upstream never saw the request
    PART = 1  # the head and some of a streamed body
    ALL = 2  # the whole request was handed to the socket


class UpstreamError(Exception):
    """The exchange with the upstream failed."""

    written: Written = Written.ALL
    answered: bool = False
    reused: bool = False


class ConnectFailed(UpstreamError):
    """No connection could be opened (refused, unresolvable, TLS handshake failed)."""

    written = Written.NOTHING


class ConnectTimeout(ConnectFailed, TimeoutError):
    """No connection within the connect timeout."""


class PoolExhausted(UpstreamError):
    """The channel's operator-set cap on open connections was reached and none came free in
    time. The gateway's own limit, not the upstream's fault: no breaker counts it."""

    written = Written.NOTHING


class UpstreamTimeout(UpstreamError, TimeoutError):
    """The upstream went quiet: no first byte, a gap in the body, or past the total time."""


class ConnectionLost(UpstreamError):
    """The connection closed or broke before the answer was complete."""

    def __init__(self, message: str, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


class BadAnswer(UpstreamError):
    """Bytes that are not an HTTP/1.1 answer the gateway will frame; the connection is closed."""

    answered = True


class RequestBodyFailed(UpstreamError):
    """The body being sent upstream raised (a rule broke mid-upload, the client went quiet)."""


class InvalidRequest(UpstreamError, ValueError):
    """The request cannot be written: a header name or value holds a line break."""

    written = Written.NOTHING
