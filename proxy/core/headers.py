"""Header rules of a proxy: hop-by-hop fields stay on their hop (RFC 9110 7.6.1), forwarding fields are set."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Set again by whoever sends the next hop: aiohttp from the body it sends, or the relay.
_RECOMPUTED = frozenset({"host", "content-length"})


_DROP = HOP_BY_HOP | _RECOMPUTED
_DROP_KEEPING_LENGTH = HOP_BY_HOP | {"host"}


def end_to_end(headers: CIMultiDictProxy[str] | CIMultiDict[str], *, keep_length: bool = False) -> CIMultiDict[str]:
    """A copy without hop-by-hop fields, including any the Connection header names."""
    drop = _DROP_KEEPING_LENGTH if keep_length else _DROP
    copy = CIMultiDict(headers)  # copied in C, then the few names to drop looked up: cheaper than a filter
    if "connection" in copy:
        drop = drop | {t.strip().lower() for v in copy.getall("connection") for t in v.split(",")}
    for name in drop:
        if name in copy:
            del copy[name]
    return copy


def content_codings(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> list[str]:
    """The content codings a message declares, across every Content-Encoding header, lower case,
    `identity` and empty entries left out: [] for a body sent as it is."""
    if "content-encoding" not in headers:
        return []
    return [
        c
        for v in headers.getall("content-encoding")
        for c in (p.strip().lower() for p in v.split(","))
        if c not in ("", "identity")
    ]


def add_forwarding(headers: CIMultiDict[str], client_ip: str, scheme: str, host: str) -> None:
    previous = headers.get("x-forwarded-for")
    headers["X-Forwarded-For"] = f"{previous}, {client_ip}" if previous else client_ip
    headers["X-Forwarded-Proto"] = scheme
    headers["X-Forwarded-Host"] = host
