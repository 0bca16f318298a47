"""What can go wrong talking to an upstream, sorted by what the gateway may do about it.

Before the upstream has a request it can act on (`ConnectFailed`, `ConnectTimeout`), sending
it elsewhere is always safe; after that, only requests that may run twice are.
"""

from __future__ import annotations


class UpstreamError(Exception):
    """The exchange with the upstream failed."""


class ConnectFailed(UpstreamError):
    """No connection could be opened (refused, unresolvable, TLS handshake failed)."""


class ConnectTimeout(ConnectFailed, TimeoutError):
    """No connection, or no free slot in the pool, within the connect timeout."""


class UpstreamTimeout(UpstreamError, TimeoutError):
    """The upstream went quiet: no first byte, a gap in the body, or past the total time."""


class ConnectionLost(UpstreamError):
    """The connection closed or broke before the answer was complete.

    `answered` says whether any of the answer had arrived; a reused keep-alive connection
    that closes before that never handled the request (the upstream had closed it idle)."""

    def __init__(self, message: str, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


class BadAnswer(UpstreamError):
    """Bytes that are not an HTTP/1.x answer this client can frame."""


class RequestBodyFailed(UpstreamError):
    """The body being sent upstream raised (a rule broke mid-upload, the client went quiet)."""


class InvalidRequest(UpstreamError, ValueError):
    """The request cannot be written: a header name or value holds a line break."""
