"""The admin surface: what only operators may read or do, apart from the clients' listener.

`/metrics` names every key, tenant label and channel, with spend and token totals; the detailed
`/readyz` names channels and their breakers. Neither is for clients, so both are served on
`server.admin_listen` (its own address, loopback by default; every worker binds it with
SO_REUSEPORT as it binds the main port), and on the main listener only to
`Authorization: Bearer <server.admin_token>` when one is set. Without a token the main listener
answers `/metrics` as it answers any path it does not serve (a 404), and `/readyz` with a bare
status: what a load balancer needs, and nothing it must not show.

`AdminSurface` is the list of those routes. Whatever else is administrative (a key-management
API) is added to it with `add` before the application is built; both listeners then serve it.
The admin listener asks no token: where it listens is its protection (docs/security.md). (The
key store's API asks every caller who it is, on either listener: proxy/keystore/api.py.)
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from proxy.config.model import ServerConfig, normal_address
from proxy.formats import ACCOUNT
from proxy.process.refusals import refuse_in_json
from proxy.request.client_guards import parser_limits

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(slots=True, frozen=True)
class AdminRoute:
    method: str
    path: str
    handler: Handler
    # What the main listener answers a request that carries no Authorization at all (readiness's
    # bare status for load balancers); None: the route is not served there without the token.
    public: Handler | None = None


class AdminSurface:
    """The administrative routes, and the token that opens them on the main listener."""

    __slots__ = ("routes", "_token", "_built")

    def __init__(self, token: str | None = None) -> None:
        self.routes: list[AdminRoute] = []
        self._token: bytes | None = None
        self._built = False
        self.set_token(token)

    def set_token(self, token: str | None) -> None:
        """Held as a digest and compared as one, in constant time: neither the token's length nor
        how much of a guess matched shows in the time an answer takes. A reload may change it."""
        self._token = hashlib.sha256(token.encode()).digest() if token else None

    def token_digest(self) -> bytes | None:
        """The admin token's SHA-256 (the console's sessions made with it are bound to it: a reload
        that changes the token ends them)."""
        return self._token

    def add(self, method: str, path: str, handler: Handler, *, public: Handler | None = None) -> None:
        if self._built:
            raise RuntimeError(f"admin route {method} {path} added after the application was built")
        self.routes.append(AdminRoute(method, path, handler, public))

    def authorized(self, request: web.Request) -> bool | None:
        """True: the request carries the admin token; False: it carries something else; None: no
        Authorization header (or no token is set, when nothing on the main listener may pass)."""
        given = request.headers.get("Authorization")
        if given is None:
            return None
        if self._token is None:
            return False
        scheme, _, credential = given.partition(" ")
        presented = hashlib.sha256(credential.strip().encode("utf-8", "surrogateescape")).digest()
        # Both comparisons always run, so a wrong scheme takes as long as a wrong token.
        matches = hmac.compare_digest(presented, self._token)
        return matches and scheme.lower() == "bearer"

    def mount_on(self, app: web.Application, not_found: Handler) -> None:
        """The routes on the main listener, each behind the token. Without one (or with none set),
        a route with a public answer gives it, and any other is answered as `not_found` answers a
        path nobody serves: the main listener does not say that an admin route exists."""
        self._built = True
        for route in self.routes:
            _add(app, route.method, route.path, self._guarded(route, not_found))

    def _guarded(self, route: AdminRoute, not_found: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            verdict = self.authorized(request)
            if verdict:
                return await route.handler(request)
            if self._token is None:
                return await (route.public or not_found)(request)
            if verdict is None and route.public is not None:
                return await route.public(request)
            return ACCOUNT.error_response(
                401,
                "this path needs the admin token (Authorization: Bearer)",
                "admin_token_required",
                headers={"WWW-Authenticate": "Bearer"},
            )

        guarded.__name__ = f"admin_{route.handler.__name__.lstrip('_')}"
        return guarded

    def application(self, shared: Callable[[web.Application], None]) -> web.Application:
        """The admin listener's application: every route, no token asked. `shared` puts in it what
        the handlers read from their app (the gateway they report on)."""
        self._built = True
        app = web.Application()
        shared(app)
        for route in self.routes:
            _add(app, route.method, route.path, route.handler)
        served = ", ".join(f"{route.method} {route.path}" for route in self.routes)

        async def not_here(request: web.Request) -> web.Response:
            # The client's path is not echoed: nothing it sent comes back.
            return ACCOUNT.error_response(404, f"no such admin endpoint; this listener serves {served}", "not_found")

        app.router.add_route("*", r"/{tail:[\s\S]*}", not_here)  # a decoded line break is a path too
        return app


def _bound(site: web.TCPSite) -> set[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    server = site._server  # aiohttp keeps the asyncio server here, and has no public way to it
    sockets = getattr(server, "sockets", None) or ()
    return {
        (normal_address(sock.getsockname()[0]), sock.getsockname()[1])
        for sock in sockets
        if sock.family in (socket.AF_INET, socket.AF_INET6)
    }


def _add(app: web.Application, method: str, path: str, handler: Handler) -> None:
    if method == "GET":  # HEAD too, as for every other GET path of the gateway
        app.router.add_get(path, handler)
    else:
        app.router.add_route(method, path, handler)


class AdminListener:
    """The admin application on `server.admin_listen`, in this process (each worker has its own,
    on the shared port). It stops accepting when the drain starts, as the main listener does, and
    closes with the process."""

    __slots__ = ("runner", "site", "url")

    def __init__(self, runner: web.AppRunner, site: web.TCPSite, url: str) -> None:
        self.runner, self.site, self.url = runner, site, url

    @classmethod
    async def start(
        cls, app: web.Application, config: ServerConfig, *, reuse_port: bool, port: int | None = None
    ) -> AdminListener:
        """`port` overrides the configured one (0: any free port, for tests)."""
        address = config.admin_address
        assert address is not None, "the admin listener is off"
        host, configured_port = address
        runner = web.AppRunner(
            app,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=1.0,
            keepalive_timeout=config.keepalive_timeout_s,
            **parser_limits(config),
        )
        await runner.setup()
        assert runner.server is not None
        # What the HTTP parser refuses here is answered in JSON too, never in its bytes (an
        # Authorization line with a control character in it would be quoted back whole).
        refuse_in_json(runner.server)
        site = web.TCPSite(runner, host, configured_port if port is None else port, backlog=128, reuse_port=reuse_port)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        shown = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        return cls(runner, site, f"http://[{shown}]:{bound}" if ":" in shown else f"http://{shown}:{bound}")

    def shares_with(self, site: web.TCPSite) -> list[str]:
        """The socket addresses this listener and `site` (the main listener) both took: the same
        port, and the same address or either on every address. The config check compares hosts as
        they resolved then; this compares what was bound, which no spelling, resolver or change of
        a name's address since can hide. Workers bind with SO_REUSEPORT, so an overlap binds without
        an error and the kernel spreads each port's connections over both listeners."""
        mine, theirs = _bound(self.site), _bound(site)
        shared = []
        for address, port in mine:
            for other, other_port in theirs:
                if port == other_port and (address == other or address.is_unspecified or other.is_unspecified):
                    shared.append(f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}")
        return sorted(set(shared))

    async def stop_accepting(self) -> None:
        await self.site.stop()

    async def close(self) -> None:
        await self.runner.cleanup()
