"""The aiohttp application: the 13 endpoints, health checks, and the lifecycle of what they use."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.web_urldispatcher import PlainResource
from opentelemetry.sdk.trace.export import SpanExporter

from proxy.config import ConfigError, LoadedConfig
from proxy.config.model import ServerConfig, worker_count
from proxy.core import jsonutil
from proxy.core.drain import Drain, close_when_draining
from proxy.core.plugin import STATE_REACHABLE, STATE_STORE, STORED_KEYS, STORED_TENANTS, PluginRoute
from proxy.core.runtime import Runtime
from proxy.formats import ACCOUNT, CONTENT, MESSAGES
from proxy.formats.base import Format
from proxy.observability.metrics import count_reload, exposition, multiprocess_mode, set_config_info
from proxy.observability.tally import Folding
from proxy.observability.tracing import RESTART_ONLY_TRACING, Tracing
from proxy.policy.catalog import usable_models
from proxy.policy.channels import Channel
from proxy.process.admin import AdminSurface
from proxy.process.admission import Admission
from proxy.process.cpu import WorkerCpu
from proxy.process.log_guard import guard_aiohttp_logs
from proxy.process.readiness import StoreProbe
from proxy.process.runtime import build_runtime
from proxy.registry import load_config, plugin_routes
from proxy.request.affinity import Affinity
from proxy.request.client_guards import ConnectionCount
from proxy.request.gateway import Gateway, answer_id
from proxy.state import StateStore, make_store
from proxy.wire.routes import ALIASES, ROUTES, Route

if TYPE_CHECKING:
    from proxy.config.console import ConsoleConfig
    from proxy.config.model import ChannelConfig, GatewayConfig
    from proxy.keystore.directory import KeySync
    from proxy.keystore.store import KeyStore
    from simulator.farm import SimulatorFarm

log = logging.getLogger("modelgate.app")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class GatewayApp:
    """Owns what outlives a config: the state store, the simulators, and the current Runtime."""

    def __init__(
        self, loaded: LoadedConfig, config_path: str | Path | None = None, span_exporter: SpanExporter | None = None
    ) -> None:
        self.loaded = loaded
        self.config_path = config_path
        self.tracing = Tracing(loaded.config.observability.tracing, span_exporter)
        self.folding = Folding()
        self.resources: dict[str, object] = {}  # what plugins keep across reloads
        self._simulators: SimulatorFarm | None = None
        self.store: StateStore | None = None
        self.probe: StoreProbe | None = None
        self.affinity: Affinity | None = None
        self.gateway: Gateway | None = None
        self.connections = ConnectionCount()
        self.drain = Drain()
        # Its share of the CPU is its share of the cores (and quota) with the other workers.
        self.admission = Admission(loaded.config.server, cpu=WorkerCpu(worker_count(loaded.config)))
        self.admin = AdminSurface(loaded.config.server.admin_token)  # /metrics and the like: proxy/process/admin.py
        # Keys managed at run time (proxy/keystore/), when the config names a database for them:
        # the package (the admin API, the console) is loaded only then.
        url = loaded.config.key_store.database_url
        self.key_store: KeyStore | None = None
        if url:
            from proxy.keystore.store import KeyStore

            self.key_store = KeyStore(url, loaded.config.key_store.timeout_s)
        self.key_sync: KeySync | None = None
        self.reloads = 0
        # The files the last reload read, taken or refused (LoadedConfig.files): what a watcher
        # compares with next.
        self.last_files: dict[str, str | None] = dict(loaded.files)
        self._reload_lock = asyncio.Lock()

    @property
    def simulators(self) -> SimulatorFarm:
        """The in-process upstream simulators; the package is loaded only for a config whose
        channels use one."""
        if self._simulators is None:
            from simulator.farm import SimulatorFarm

            self._simulators = SimulatorFarm()
        return self._simulators

    async def simulator_url(self, channel: ChannelConfig) -> str:
        return await self.simulators.url_for(channel)

    @property
    def runtime(self) -> Runtime:
        assert self.gateway is not None, "the gateway has not started"
        return self.gateway.runtime

    async def start(self) -> None:
        config = self.loaded.config
        self.tracing.start()
        if multiprocess_mode():  # another worker may serve the scrape: this one's counts go to its file each second
            self.folding.start()
        self.store = make_store(config.state)
        self.probe = StoreProbe(self.store, config.state.check_timeout_s)
        await self.probe.check()
        self.probe.start()
        probe = self.probe
        # For plugins that talk to the same store: while its probe calls it away, they need not wait on it.
        self.resources[STATE_REACHABLE] = lambda: probe.ok
        store = self.store
        self.resources[STATE_STORE] = lambda: store
        if self.key_store is not None:
            from proxy.keystore.directory import KeySync, StoredKeys

            stored = StoredKeys()
            drain = self.drain
            revoked = (lambda names: drain.end_streams_of(names)) if config.key_store.revoked_streams == "end" else None
            self.key_sync = KeySync(self.key_store, stored, config.key_store.resync_s, revoked=revoked)
            await self.key_sync.start()
            self.resources[STORED_KEYS] = stored
            self.resources[STORED_TENANTS] = self.key_sync.tenants
        runtime = await build_runtime(self.loaded, self.simulator_url, self.resources)
        self.affinity = Affinity(
            self.store, config.state.affinity_ttl_s, config.state.pending_pins, reachable=lambda: probe.ok
        )
        self.gateway = Gateway(runtime, self.affinity, self.tracing, self.connections, self.drain, self.admission)
        gateway = self.gateway
        self.admission.start(lambda: gateway.in_flight)
        set_config_info(self.loaded.digest)

    async def stop(self) -> None:
        self.admission.stop()
        if self.key_sync is not None:
            await self.key_sync.stop()
        if self.key_store is not None:
            await self.key_store.close()
        if self.gateway is not None:
            runtime = self.gateway.runtime
            runtime.retire()
            await runtime.wait_closed()
        if self._simulators is not None:
            await self._simulators.close()
        for resource in self.resources.values():
            close = getattr(resource, "close", None)
            if close is not None:
                await close()
        if self.probe is not None:
            await self.probe.stop()
        if self.affinity is not None:
            await self.affinity.close()
        if self.store is not None:
            await self.store.close()
        self.folding.stop()  # first: what this worker counted reaches its file whatever the tracing's close does
        await self.tracing.close()

    async def reload(self) -> bool:
        """Load the config file again; keep the running config when the new one is invalid."""
        async with self._reload_lock:
            try:
                loaded = load_config(self.config_path, reloading=True)
            except ConfigError as exc:
                self.last_files = exc.files
                log.error(
                    "config reload refused; keeping the running config",
                    extra={"problems": exc.problems, "source": str(self.config_path)},
                )
                count_reload("refused")
                return False
            self.last_files = loaded.files
            later = _restart_only_changes(self.loaded.config, loaded.config)
            if later:
                log.warning("%s changes take effect at the next restart", ", ".join(later), extra={"settings": later})
            try:
                runtime = await build_runtime(loaded, self.simulator_url, self.resources)
            except Exception:
                log.exception("config reload failed while starting; keeping the running config")
                count_reload("failed")
                return False
            assert self.gateway is not None
            old, self.gateway.runtime = self.gateway.runtime, runtime
            self.admission.configure(loaded.config.server)
            self.tracing.retune(loaded.config.observability.tracing)
            set_config_info(loaded.digest, previous=self.loaded.digest)
            count_reload("ok")
            self.admin.set_token(loaded.config.server.admin_token)
            self.loaded = loaded
            self.reloads += 1
            old.retire()
            log.info(
                "config reloaded",
                extra={"digest": loaded.digest, "source": loaded.source, "draining": old.in_flight, "pid": os.getpid()},
            )
            return True


APP_KEY = web.AppKey("modelgate", GatewayApp)


def _restart_only_changes(old: GatewayConfig, new: GatewayConfig) -> list[str]:
    """The changed settings a reload cannot apply: the sockets are bound, the store connected and
    the trace exporter made when the process starts (a reload retunes the tracing's sampling,
    keep rules and viewer link: Tracing.retune)."""
    old_tracing, new_tracing = old.observability.tracing, new.observability.tracing
    return [
        name
        for name, before, after in (
            ("state", old.state, new.state),
            ("key_store", old.key_store, new.key_store),
            ("server.listen", old.server.listen, new.server.listen),
            ("server.admin_listen", old.server.admin_listen, new.server.admin_listen),
            *(
                (f"observability.tracing.{name}", getattr(old_tracing, name), getattr(new_tracing, name))
                for name in RESTART_ONLY_TRACING
            ),
        )
        if before != after
    ]


def build_app(
    loaded: LoadedConfig, config_path: str | Path | None = None, span_exporter: SpanExporter | None = None
) -> web.Application:
    guard_aiohttp_logs()
    owner = GatewayApp(loaded, config_path, span_exporter)
    app = web.Application(client_max_size=1024**4)  # bodies are read by the gateway, with its own limits
    app[APP_KEY] = owner

    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        await owner.start()
        yield
        await owner.stop()

    app.cleanup_ctx.append(lifecycle)
    app.on_response_prepare.append(close_when_draining(owner.drain, loaded.config.server.keepalive_requests))
    for route in (*ROUTES, *ALIASES):
        handler = _route_handler(owner, route)
        if route.method == "GET":
            app.router.add_get(route.path, handler)  # HEAD too: downloads answer it
        else:
            app.router.add_route(route.method, route.path, handler)
    app.router.add_get("/healthz", _healthz)
    owner.admin.add("GET", "/metrics", _metrics)
    owner.admin.add("GET", "/readyz", _readyz, public=_readiness_status)
    if owner.key_store is not None:
        _mount_administration(owner, owner.key_store, loaded)
    for extra in plugin_routes(loaded.config, admin=True):
        owner.admin.add(extra.method, extra.path, _plugin_handler(owner, extra))
    for extra in plugin_routes(loaded.config):
        if extra.method == "GET":  # HEAD too, as for the endpoints: link checkers and caches ask it
            app.router.add_get(extra.path, _plugin_handler(owner, extra))
        else:
            app.router.add_route(extra.method, extra.path, _plugin_handler(owner, extra))
    owner.admin.mount_on(app, not_found=_unmatched)  # behind server.admin_token, or not there at all
    not_origin_form = _NotOriginForm()
    app.router.register_resource(not_origin_form)
    not_origin_form.add_route("*", _not_origin_form)
    app.router.add_route("*", "/{tail:.*}", _unmatched)
    return app


def _example_model(owner: GatewayApp, globs: list[str]) -> str | None:
    """A response-format model a key with these `models` may use on a channel now (the console's
    snippet names it), or None."""
    import fnmatch

    runtime = owner.runtime
    for model in usable_models(runtime.config, runtime.channels, None, "responses"):
        if any(fnmatch.fnmatchcase(model, glob) for glob in globs):
            return model
    return None


def _gateway_url(server: ServerConfig) -> str:
    """The URL clients reach the gateway at, for the console's snippets."""
    if server.public_base_url:
        return server.public_base_url
    host = server.host if server.host not in ("0.0.0.0", "::") else "localhost"
    return f"http://{f'[{host}]' if ':' in host else host}:{server.port}"


def build_admin_app(app: web.Application) -> web.Application:
    """The admin listener's application for a gateway built by `build_app` (its routes read the
    same gateway). Built once every admin route is added; the main app's lifecycle runs the gateway."""
    owner = app[APP_KEY]
    return owner.admin.application(lambda admin: admin.__setitem__(APP_KEY, owner))


class _NotOriginForm(PlainResource):
    """Matches a target that is no path at all (`OPTIONS *`), which no other resource can. It is
    consulted only once a path has matched nothing else, so it costs the endpoints nothing."""

    def __init__(self) -> None:
        super().__init__("/")

    def _match(self, path: str) -> dict[str, str] | None:
        return None if path.startswith("/") else {}


async def _not_origin_form(request: web.Request) -> web.Response:
    return ACCOUNT.error_response(400, "the request target must be a path (origin-form)", "invalid_request_target")


def _mount_administration(owner: GatewayApp, key_store: KeyStore, loaded: LoadedConfig) -> None:
    """The admin API, and the console unless it is off, on the admin surface: only with a key
    store (their modules are loaded then, and never by a gateway without one)."""
    from proxy.keystore.api import PREFIX, AdminApi
    from proxy.keystore.oidc import OidcVerifier
    from proxy.keystore.operations import AdminOps
    from proxy.keystore.reads import AdminReads

    oidc = loaded.config.key_store.oidc
    ops = AdminOps(key_store, lambda: owner.loaded.config.keys, lambda: owner.runtime.plugins)
    api = AdminApi(
        ops,
        owner.admin.authorized,
        oidc=OidcVerifier(oidc) if oidc is not None else None,
        reads=AdminReads(ops, lambda: owner.runtime.plugins, lambda: owner.runtime.channels.channels),
    )
    for method, path, handler in api.routes():
        owner.admin.add(method, PREFIX + path, handler)
    if loaded.config.console.enabled:
        from proxy.console import Console

        console = Console(
            lambda: _console_config(owner.loaded.config),
            ops,
            api.reads,  # type: ignore[arg-type]
            owner.admin.token_digest,
            lambda: _gateway_url(owner.loaded.config.server),
            lambda globs: _example_model(owner, globs),
        )
        for method, path, handler in console.routes():
            owner.admin.add(method, path, handler)


def _console_config(config: GatewayConfig) -> ConsoleConfig:
    """The console's settings; a request's trace link, unless set here, is the trace viewer's
    the tracing settings name (`observability.tracing.viewer_url`)."""
    viewer = config.observability.tracing.viewer_url
    if config.console.trace_url is None and viewer is not None:
        return config.console.model_copy(update={"trace_url": viewer})
    return config.console


def _route_handler(owner: GatewayApp, route: Route) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        assert owner.gateway is not None
        return await owner.gateway.handle(request, route)

    handle.__name__ = f"handle_{route.name}"
    return handle


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"}, dumps=lambda o: jsonutil.dumps(o).decode())


def _readiness(owner: GatewayApp) -> tuple[bool, bool, list[str]]:
    """Ready: started, and no plugin says this instance cannot serve. Shared dependencies are
    reported, not counted: every instance sees the same state store and the same upstreams, and
    pulling them all out of a load balancer at once would turn a degraded gateway into none. The
    store's state is the background probe's, so this answers at once, whatever the store does.
    (ready, whether the store answers, the plugins' reasons)"""
    probe = owner.probe
    state_ok = probe is None or probe.ok
    reasons = (
        [reason for plugin in owner.runtime.plugins if (reason := plugin.unready(state_ok))] if owner.gateway else []
    )
    return owner.gateway is not None and not reasons, state_ok, reasons


async def _readiness_status(request: web.Request) -> web.Response:
    """/readyz on the main listener: the verdict alone, for load balancers and anyone else; the
    names of channels, plugins and what they report are the admin listener's (`_readyz`)."""
    ready, _, _ = _readiness(request.app[APP_KEY])
    return web.Response(
        status=200 if ready else 503,
        body=jsonutil.dumps({"status": "ready" if ready else "not ready"}),
        content_type="application/json",
    )


async def _readyz(request: web.Request) -> web.Response:
    """/readyz in detail: the verdict, the store, the config digest, and every channel's breaker."""
    owner = request.app[APP_KEY]
    now = time.monotonic()
    probe = owner.probe
    ready, state_ok, reasons = _readiness(owner)
    body: dict[str, object] = {
        "status": "ready" if ready else "not ready",
        "state_store": "ok" if state_ok else "unreachable",
        "config": owner.loaded.digest,
        "connections": owner.connections.open,
        "channels": [_breaker(c) for c in owner.runtime.channels.channels] if owner.gateway else [],
    }
    if probe is not None and not probe.ok:
        body["state_store_unreachable_s"] = round(now - probe.since, 1)
    if owner.affinity is not None and owner.affinity.pending:
        body["pending_pins"] = owner.affinity.pending
    if reasons:
        body["reasons"] = reasons
    return web.Response(status=200 if ready else 503, body=jsonutil.dumps(body), content_type="application/json")


def _breaker(channel: Channel) -> dict[str, object]:
    health = channel.health
    state, left = health.state()
    shown: dict[str, object] = {"name": channel.name, "breaker": state, "failures_in_a_row": health.failures}
    if channel.config.health_check is not None:
        shown["health_check"] = "down" if health.down else "up"
    if state == "open":
        shown["retry_in_s"] = round(left, 3)
    return shown


def _plugin_handler(owner: GatewayApp, extra: PluginRoute) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await extra.handler(request, owner.resources)

    return handle


async def _metrics(request: web.Request) -> web.Response:
    body, content_type = exposition(request.headers.get("Accept", ""))
    return web.Response(body=body, headers={"Content-Type": content_type})


# A model is one segment without a colon (`models/x:generateContent` is a method on it).
_TEMPLATES = [
    (re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", r.path.replace("{model}", "[^/:]+")) + "$"), r)
    for r in (*ROUTES, *ALIASES)
]
# What a client that found no endpoint is told exists (each path once, in the spec's order).
_SERVED = ", ".join(dict.fromkeys(f"{r.method} {r.path}" for r in (*ROUTES, *ALIASES)))


def _served(path: str, fmt: Format) -> str:
    """The endpoints near a 404's path (those under its first two segments, else its format's),
    or all of them: an SDK's exception quotes the message whole, and every route made it 1.5 KB."""
    prefix = "/".join(path.split("/", 3)[:3]) + "/"
    near = [r for r in (*ROUTES, *ALIASES) if (r.path + "/").startswith(prefix)] or (
        [r for r in (*ROUTES, *ALIASES) if r.format is fmt] if fmt is not ACCOUNT else []
    )
    if not near:
        return _SERVED
    return ", ".join(dict.fromkeys(f"{r.method} {r.path}" for r in near)) + " (all of them: modelgate openapi)"


def _format_of(path: str) -> Format:
    """The format a path belongs to, for the shape of its 404 or 405: an SDK shows only errors
    in its own format's shape."""
    if path.startswith("/v1beta/") or path.startswith("/v1/models/") and ":" in path:
        return CONTENT
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return MESSAGES
    return ACCOUNT  # the generic shape of the images, response and video endpoints


async def _unmatched(request: web.Request) -> web.Response:
    """What no route serves: 404 or 405 in the shape of the format its path looks like, naming
    the request id (the caller's own when it is a safe one) as every other answer does."""
    answer = _no_route(request)
    owner = request.config_dict.get(APP_KEY)
    header = owner.loaded.config.server.request_id_header if owner is not None else "X-Request-Id"
    answer.headers[header] = answer_id(request.headers.get(header, ""))
    return answer


def _no_route(request: web.Request) -> web.Response:
    if "#" in request.raw_path:  # aiohttp keeps a fragment in the path; an endpoint's own target has none
        path = request.raw_path.partition("#")[0].partition("?")[0]
        fmt = next((r.format for pattern, r in _TEMPLATES if pattern.match(path)), ACCOUNT)
        return fmt.error_response(400, "the request target must not carry a #fragment", "invalid_request_target")
    matches = [r for pattern, r in _TEMPLATES if pattern.match(request.path)]
    if not any(r.number or "{" not in r.path for r in matches):
        # Only the gateway's own routes, each naming an object by id, fit the path, and only
        # because an id took a segment: an id cannot be told from a name the gateway does not
        # serve (`POST /v1/responses/input_tokens`), so that is no endpoint (404), not a method
        # an object refuses (405). The interface's routes, and fixed paths, keep their 405.
        matches = []
    allowed = sorted({r.method for r in matches})
    if allowed:
        fmt: Format = matches[0].format
        return fmt.error_response(
            405, f"{request.method} is not allowed on {_shown(request)}", headers={"Allow": ", ".join(allowed)}
        )
    fmt = _format_of(request.path)
    return fmt.error_response(
        404,
        f"no endpoint at {request.method} {_shown(request)}; this gateway serves {_served(request.path, fmt)}",
        "not_found",
    )


def _shown(request: web.Request) -> str:
    """The path as sent (still percent-encoded, so no control byte is echoed), and not all of a long one."""
    sent = request.raw_path.partition("?")[0]
    return sent if len(sent) <= 200 else re.sub(r"%[0-9A-Fa-f]?$", "", sent[:200]) + "..."
