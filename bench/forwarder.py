"""The floor any aiohttp gateway pays: a minimal forwarder, no plugins, pooled keep-alive, uvloop.

Usage: .venv/bin/python bench/forwarder.py PORT UPSTREAM_URL
"""

from __future__ import annotations

import sys

import aiohttp
from aiohttp import web

HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length", "te", "upgrade"}


async def forward(request: web.Request) -> web.StreamResponse:
    session: aiohttp.ClientSession = request.app["session"]
    body = await request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    async with session.request(
        request.method, request.app["upstream"] + request.path_qs, headers=headers, data=body
    ) as upstream:
        response = web.StreamResponse(
            status=upstream.status, headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP}
        )
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def session_ctx(app: web.Application):
    app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256), auto_decompress=False)
    yield
    await app["session"].close()


def main() -> None:
    import uvloop

    uvloop.install()
    app = web.Application()
    app["upstream"] = sys.argv[2]
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", forward)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=lambda *_: None)


if __name__ == "__main__":
    main()
