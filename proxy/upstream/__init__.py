"""The gateway's HTTP/1.1 client for upstreams: a pool per channel, answers read as they arrive."""

from proxy.upstream.errors import (
    BadAnswer,
    ConnectFailed,
    ConnectionLost,
    ConnectTimeout,
    InvalidRequest,
    PoolExhausted,
    RequestBodyFailed,
    UpstreamError,
    UpstreamTimeout,
    Written,
)
from proxy.upstream.pool import UpstreamPool
from proxy.upstream.response_stream import ResponseStream

__all__ = [
    "ResponseStream",
    "BadAnswer",
    "ConnectFailed",
    "ConnectTimeout",
    "ConnectionLost",
    "InvalidRequest",
    "PoolExhausted",
    "RequestBodyFailed",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamTimeout",
    "Written",
]
