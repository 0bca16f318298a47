"""The base URL the gateway puts in the links it hands out (signed image URLs, video content URLs).

`server.public_base_url` when set; otherwise the address the client's connection reached,
which is one the gateway listens on. The client's Host header is taken only when the operator
opts in (`server.base_url_from_host`): a client must not choose where the links it is handed,
and those shown to others, point.
"""

from __future__ import annotations

import ipaddress

from aiohttp import web

from proxy.config.model import ServerConfig


def public_base_url(request: web.BaseRequest, server: ServerConfig) -> str:
    if server.public_base_url:
        return server.public_base_url
    if server.base_url_from_host:
        return f"{request.scheme}://{request.host}"
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        host, port = str(sockname[0]), int(sockname[1])
    else:
        host, port = server.host, server.port
    if _is_ipv6(host):
        host = f"[{host}]"
    return f"{request.scheme}://{host}:{port}"


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False
