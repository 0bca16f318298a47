"""Running the gateway: the event loop, the listening socket, and signals (SIGHUP reloads)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import resource
import signal
from pathlib import Path

from aiohttp import web

from proxy.config import LoadedConfig, text_digest
from proxy.config.model import ServerConfig, worker_count
from proxy.core.drain import accept_queued
from proxy.observability.access_log import configure_logging
from proxy.process.admin import AdminListener
from proxy.process.app import APP_KEY, GatewayApp, build_admin_app, build_app
from proxy.process.refusals import refuse_in_json
from proxy.process.shedding import shed_on_connections
from proxy.process.watch import FileWatch, reload_on_change
from proxy.process.workers import (
    LISTENERS_OVERLAP,
    RELOAD_ENV,
    Supervisor,
    bind_to_supervisor,
    is_worker,
    port_taken,
)
from proxy.request.client_guards import parser_limits
from proxy.wire.routes import ALIASES, ROUTES

log = logging.getLogger("modelgate.server")

FINAL_GRACE_S = 0.25


class ListenersOverlap(Exception):
    """The admin listener and the main one were bound to a socket address in common."""


YOUNG_COLLECTION_EVERY = 10_000  # net allocations of tracked objects between young collections (Python's: 700)


def install_uvloop() -> bool:
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def serve(loaded: LoadedConfig, config_path: str | Path | None) -> int:
    """Run the gateway until SIGTERM: in this process, or as the supervisor of N workers."""
    configure_logging(loaded.config.observability.logging)
    count = worker_count(loaded.config)
    if count == 1 and loaded.config.server.workers is None and loaded.config.state.backend == "memory":
        log.info(
            "one worker process: the memory state backend lives in one process; "
            "set state.backend: redis to serve from every core"
        )
    server = loaded.config.server
    if is_worker():
        bind_to_supervisor()
    else:
        listeners = {
            "listen": (server.listen, (server.host, server.port)),
            "admin_listen": (server.admin_listen, server.admin_address),
        }
        for setting, (shown, address) in listeners.items():
            if address is not None and port_taken(*address):
                log.error(
                    "%s is already served (another modelgate, or its workers): not starting beside it (server.%s)",
                    shown,
                    setting,
                    extra={setting: shown},
                )
                return 1
    if count > 1 and not is_worker():
        return Supervisor(
            count, config_path, server.drain_timeout_s, loaded.files, server.watch_config_s, server.watch_settle_s
        ).run()
    raise_descriptor_limit()
    uvloop = install_uvloop()
    # A worker starts from its supervisor's last good copy, and reloads the operator's file.
    try:
        asyncio.run(_serve(loaded, os.environ.get(RELOAD_ENV) or config_path, uvloop, started_from=config_path))
    except ListenersOverlap:
        return LISTENERS_OVERLAP if is_worker() else 1  # a worker's supervisor stops: a restart would bind the same
    return 0


def raise_descriptor_limit() -> int:
    """Every open stream holds two descriptors (client and upstream side); the usual soft limit of
    1,024 would cap a gateway at about 500 streams, so take all the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


async def start_runner(app: web.Application, config: ServerConfig) -> web.AppRunner:
    """The app's runner, set up with the server's limits (a restart applies changes to them)."""
    # A client that goes away cancels its handler, and with it the upstream request.
    # SIGTERM: stop listening, let requests in flight (streams too) finish within the drain timeout
    # (proxy/core/drain.py); what is left then gets FINAL_GRACE_S before it is cancelled.
    # Request bodies are taken as sent, never inflated by the server: a webhook stays byte-exact, and
    # a body whose coding the gateway does not read is refused by the route (proxy/request/body.py).
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        auto_decompress=False,
        shutdown_timeout=FINAL_GRACE_S,  # the drain itself waits first (proxy/core/drain.py)
        keepalive_timeout=config.keepalive_timeout_s,
        **parser_limits(config),
        # what is left of a refused body is read and dropped for a while, so the client
        # sees the answer rather than a reset; a client silent that long is not waited for
        lingering_time=min(10.0, config.client_idle_s),
    )
    await runner.setup()
    assert runner.server is not None
    refuse_in_json(runner.server)  # what the HTTP parser refuses is answered in JSON, not in its bytes
    owner = app[APP_KEY]
    assert owner.gateway is not None, "the gateway starts with the runner's setup"
    shed_on_connections(runner.server, owner.gateway, (*ROUTES, *ALIASES))  # cheap refusals while it sheds
    owner.connections.watch(runner.server, config.max_connections)
    return runner


async def _serve(
    loaded: LoadedConfig, config_path: str | Path | None, uvloop: bool, started_from: str | Path | None = None
) -> None:
    app = build_app(loaded, config_path)
    runner = await start_runner(app, loaded.config.server)
    server = loaded.config.server
    # Bound before the main port, so a gateway that answers clients answers its scrapes too. Workers
    # share both ports; a lone process keeps them to itself, so a second one fails loudly.
    admin = (
        await AdminListener.start(build_admin_app(app), server, reuse_port=is_worker()) if server.admin_listen else None
    )
    site = web.TCPSite(runner, server.host, server.port, backlog=server.listen_backlog, reuse_port=is_worker())
    await site.start()
    if admin is not None and (shared := admin.shares_with(site)):
        # Checked before anything else runs: the overlap would send clients to the admin routes,
        # and scrapes to the clients' routes, for as long as the gateway ran.
        log.error(
            "server.admin_listen (%s) and server.listen (%s) are bound to the same socket address (%s): "
            "each would take the other's connections; not starting. Give the admin listener an address "
            "of its own (another port, or null to turn it off)",
            server.admin_listen,
            server.listen,
            ", ".join(shared),
            extra={"listen": server.listen, "admin_listen": server.admin_listen},
        )
        await site.stop()
        await admin.close()
        await runner.cleanup()
        raise ListenersOverlap(shared)
    owner = app[APP_KEY]
    # What startup built (config, schemas, routes, metrics) lives as long as the process: moved
    # out of the collector's reach, the collections that traffic triggers no longer scan it.
    gc.collect()
    gc.freeze()
    # Requests make next to no cyclic garbage (a traced run found about one object in ten
    # requests), yet at Python's default a young collection ran every 25 requests, each walking
    # the requests in flight: 6% of the CPU, and every hundredth a full pass of 25 ms. Ten times
    # fewer collections cost the same walk each; what cyclic garbage there is waits a little longer.
    gc.set_threshold(YOUNG_COLLECTION_EVERY, 10, 10)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watching: asyncio.Task[None] | None = None
    if config_path is not None:
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(owner.reload()))
        if started_from is not None and _changed_since(started_from, loaded.digest):
            # A SIGHUP came while this worker started, before it could take one: catch up.
            loop.create_task(owner.reload())
        if not is_worker():  # a worker's supervisor watches for it, and signals
            watching = loop.create_task(_watch_files(owner), name="config watch")
    base_url = _base_url(server)
    log.info(
        "modelgate listening on %s",
        base_url,
        extra={
            "listen": server.listen,
            "base_url": base_url,
            "admin_url": admin.url if admin else None,
            "config": loaded.source,
            "digest": loaded.digest,
            "uvloop": uvloop,
            "pid": os.getpid(),
            "descriptors": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        },
    )
    try:
        await stop.wait()
    finally:
        if watching is not None:
            watching.cancel()
        log.info("modelgate stopping", extra={"drain_timeout_s": server.drain_timeout_s})
        await stop_listening(site, runner)
        if admin is not None:
            await admin.stop_accepting()  # both ports are free for the gateway that follows
        assert runner.server is not None
        handlers = runner.server
        await owner.drain.run(
            lambda: owner.gateway.in_flight if owner.gateway else 0,
            server.drain_timeout_s,
            lambda: handlers.connections,
        )
        await runner.cleanup()  # cancels what is left, within FINAL_GRACE_S
        if admin is not None:
            await admin.close()


async def stop_listening(site: web.TCPSite, runner: web.AppRunner) -> None:
    """No new connections; those the kernel had queued are taken first and drained like the rest
    (closing a listener resets what waits on it)."""
    listening = site._server  # type: ignore[attr-defined]  # aiohttp keeps the asyncio server there
    queued = accept_queued(listening.sockets if listening is not None else [])
    await site.stop()  # closes the listeners before anything else runs: nothing else queues on them
    loop = asyncio.get_running_loop()
    for conn in queued:
        await loop.connect_accepted_socket(runner.server, conn)  # type: ignore[arg-type]


async def _watch_files(owner: GatewayApp) -> None:
    async def reload() -> dict[str, str | None]:
        await owner.reload()
        return owner.last_files

    def settings() -> ServerConfig:  # as the last good config says
        return owner.loaded.config.server

    await reload_on_change(
        FileWatch(owner.loaded.files), lambda: settings().watch_config_s, lambda: settings().watch_settle_s, reload
    )


def _changed_since(path: str | Path, digest: str) -> bool:
    try:
        return text_digest(Path(path).read_text(encoding="utf-8")) != digest
    except OSError:
        return False


def _base_url(server: ServerConfig) -> str:
    """The base URL a client on this machine uses (an any-address listener is reached on loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(server.host, server.host)
    return f"http://[{host}]:{server.port}" if ":" in host else f"http://{host}:{server.port}"
