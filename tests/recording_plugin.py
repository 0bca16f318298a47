"""A third-party plugin for tests, loaded by dotted path like any user's plugin would be."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from aiohttp import web
from pydantic import BaseModel

from proxy.core.exchange import Exchange
from proxy.core.plugin import Plugin, PluginRoute
from proxy.core.upstream_response import UpstreamResponse
from proxy.wire.sse import SSEEvent


class Recorder(Plugin):
    """Records each finished exchange; can refuse requests, tag answers and drop events on demand."""

    class Settings(BaseModel):
        refuse_header: str = "x-test-refuse"
        drop_event: str | None = None

    finished: ClassVar[list[Exchange]] = []
    requested: ClassVar[list[tuple[str | None, str | None]]] = []  # (key name, followed id) of each request seen

    async def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        self.requested.append((ex.key.name if ex.key is not None else None, ex.followed_id))
        if ex.request.headers.get(self.settings.refuse_header):
            return ex.error_response(429, "refused by the test plugin", "rate_limited")
        ex.headers["X-Added-By-Plugin"] = "recorder"
        return None

    async def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        if ex.request.headers.get("x-test-unwritable-header"):
            upstream.headers["X-Unwritable"] = "a\r\nInjected: 1"  # aiohttp refuses to write this
        body = upstream.json()
        if isinstance(body, dict):
            upstream.set_json({**body, "tagged_by": "recorder"})

    def on_event(self, ex: Exchange, event: SSEEvent) -> SSEEvent | None:
        if self.settings.drop_event and event.name == self.settings.drop_event:
            return None
        return event

    async def on_complete(self, ex: Exchange) -> None:
        Recorder.finished.append(ex)


class EndHolder(Plugin):
    """Holds a request's bookkeeping (its on_complete) until the test lets it go, when the request
    carries `x-test-hold`: what the client has of its answer meanwhile is what a process killed
    during the bookkeeping would have left it."""

    reads_answers = False  # answers pass as they come, unread, unless another plugin reads them
    holding: ClassVar[asyncio.Event]
    release: ClassVar[asyncio.Event]
    finished: ClassVar[list[str]] = []  # the requests whose held bookkeeping ran to its end

    async def on_complete(self, ex: Exchange) -> None:
        if ex.request.headers.get("x-test-hold"):
            EndHolder.holding.set()
            await EndHolder.release.wait()
            EndHolder.finished.append(ex.gateway_id)


class AdminNote(Plugin):
    """Serves an operators-only path (`admin_routes`): what a key-management API would add."""

    @classmethod
    def admin_routes(cls) -> Sequence[PluginRoute]:
        async def note(request: web.Request, resources: Mapping[str, Any]) -> web.Response:
            return web.json_response({"note": "for operators", "resources": len(resources)})

        return (PluginRoute("GET", "/admin/note", note),)


class Choosy(Plugin):
    """Takes only the exchanges that carry `x-test-take` (Plugin.takes), and records each hook it
    runs for each of them, by the request's `x-test-id`. Its hooks are plain functions, as a
    plugin's that never wait may be (Recorder's are coroutines): the core calls both kinds."""

    calls: ClassVar[list[tuple[str, str]]] = []  # (test id, hook)

    def takes(self, ex: Exchange) -> bool:
        return bool(ex.request.headers.get("x-test-take"))

    def _record(self, ex: Exchange, hook: str) -> None:
        Choosy.calls.append((ex.request.headers.get("x-test-id", ""), hook))

    def prefetch(self, ex: Exchange) -> None:  # run before any plugin, takes included, is asked
        self._record(ex, "prefetch")

    def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        self._record(ex, "on_request")
        return None

    def on_upstream(self, ex: Exchange) -> None:
        self._record(ex, "on_upstream")

    def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> None:
        self._record(ex, "on_response")

    def on_event(self, ex: Exchange, event: SSEEvent) -> SSEEvent | None:
        if not any(call == (ex.request.headers.get("x-test-id", ""), "on_event") for call in Choosy.calls):
            self._record(ex, "on_event")  # once a stream
        return event

    async def on_complete(self, ex: Exchange) -> None:
        self._record(ex, "on_complete")


class Deferring(Plugin):
    """Hooks that are plain functions handing back a coroutine (as a decorator around an async
    method makes them): the core awaits what they return. With `x-test-defer` it refuses; with
    `x-test-junk` its on_request answers with something that is no response. Its on_upstream
    hands back a value that is none of the core's, and its on_complete is a plain function."""

    completed: ClassVar[list[str]] = []

    def on_request(self, ex: Exchange) -> Any:
        if ex.request.headers.get("x-test-junk"):
            return {"error": "not a response"}
        return self._check(ex)

    def on_upstream(self, ex: Exchange) -> Any:
        return True

    def on_complete(self, ex: Exchange) -> None:
        Deferring.completed.append(ex.request_id)

    async def _check(self, ex: Exchange) -> web.StreamResponse | None:
        await asyncio.sleep(0)
        if ex.request.headers.get("x-test-defer"):
            return ex.error_response(403, "refused by a deferred check", "deferred")
        return None

    def on_response(self, ex: Exchange, upstream: UpstreamResponse) -> Any:
        return self._tag(upstream)

    async def _tag(self, upstream: UpstreamResponse) -> None:
        await asyncio.sleep(0)
        body = upstream.json()
        if isinstance(body, dict):
            upstream.set_json({**body, "deferred": True})


class Squatter(Plugin):
    """Writes, in its own room of every exchange, each name the built-in plugins keep state under
    (and drops it again): a plugin can neither read nor spoil another's (Exchange.state)."""

    NAMES = ("checks", "settling", "reserved", "uncounted", "images", "delivers", "cached", "task", "leads")
    seen: ClassVar[list[dict[str, Any]]] = []  # its room as on_complete found it, each exchange

    def __eq__(self, other: object) -> bool:  # and so unhashable, as a plugin may well be
        return isinstance(other, Squatter)

    def prefetch(self, ex: Exchange) -> None:
        ex.state(self).update(dict.fromkeys(self.NAMES, "squatted"))

    async def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        ex.state(self).update(dict.fromkeys(self.NAMES, None))
        return None

    async def on_complete(self, ex: Exchange) -> None:
        Squatter.seen.append(dict(ex.state(self)))
        ex.state(self).clear()


class Traced(Plugin):
    """Starts a span of its own through the OpenTelemetry API, as an instrumented client library
    a plugin calls would: the gateway's trace must hold it, under the request's span."""

    async def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        from opentelemetry import trace

        with trace.get_tracer("tests.traced").start_as_current_span("a lookup of its own") as span:
            span.set_attribute("lookup.hit", True)
        return None
