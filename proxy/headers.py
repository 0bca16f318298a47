"""Header rules of a proxy: hop-by-hop fields stay on their hop (RFC 9110 7.6.1), forwarding fields are set."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "transfer-encoding", "upgrade",
})
# Set again by whoever sends the next hop: aiohttp from the body it sends, or the relay.
_RECOMPUTED = frozenset({"host", "content-length"})


def end_to_end(headers: CIMultiDictProxy[str] | CIMultiDict[str], *, keep_length: bool = False) -> CIMultiDict[str]:
    """A copy without hop-by-hop fields, including any the Connection header names."""
    named = {t.strip().lower() for v in headers.getall("connection", ()) for t in v.split(",")}
    drop = HOP_BY_HOP | named if named else HOP_BY_HOP
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if lower in drop or (lower in _RECOMPUTED and not (keep_length and lower == "content-length")):
            continue
        out.add(name, value)
    return out


def add_forwarding(headers: CIMultiDict[str], client_ip: str, scheme: str, host: str) -> None:
    previous = headers.get("x-forwarded-for")
    headers["X-Forwarded-For"] = f"{previous}, {client_ip}" if previous else client_ip
    headers["X-Forwarded-Proto"] = scheme
    headers["X-Forwarded-Host"] = host
